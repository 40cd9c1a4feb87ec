package connector

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/nixl"
)

// RoleConfig is what both roles are configured with, embedded in PrefillConfig and DecodeConfig: each field
// means the same for either role, and its zero value is stated once, here. NewPrefill and NewDecode resolve
// it (the defaults, the Profile and Compat a Model implies, a DRAM cache) before they touch NIXL.
type RoleConfig struct {
	// VLLMVersion is the vLLM version string of the peers (their GET /version), e.g. "0.16.0": it picks
	// Profile and is hashed. Model describes the model once; with them the role derives the compatibility
	// inputs (Compat, unless set) and, when Cache is nil, a DRAM cache of NumBlocks blocks (see Model), which
	// the role owns and frees on Close. Zero: nothing is derived (set Profile, Compat and Cache yourself).
	VLLMVersion string
	Model       Model
	NumBlocks   int
	// Profile is the vLLM release of the peers; VLLMVersion sets it (protocol.ProfileFor, which keeps the
	// string as Profile.Version). Set it yourself only for a build no version string maps to (a dev build):
	// protocol.ProfileByName, with Version set to the build's version string, since it is hashed. A role
	// with neither is refused.
	Profile protocol.Profile
	// Library is the loaded NIXL (nixl.Load); required.
	Library *nixl.Library
	// Cache is the KV cache the role registers with NIXL once: the prefill role publishes its region base
	// addresses in the handshake (they never change while it is registered), the decode role's READs land in
	// it. Its optional interfaces (Registrar, DeviceContext, HostBuffered, HostBufferedPipeline) are looked
	// up once, when the role starts. Nil: a DRAM cache derived from Model and NumBlocks.
	Cache Cache
	// EngineID identifies the engine (the prefill's is kv_transfer_params.remote_engine_id). Empty: a
	// random id ("gonixl-p-…" or "gonixl-d-…").
	EngineID string
	// Backends is the NIXL backend list, e.g. ParseBackends([]string{"LIBFABRIC"}). Empty: DefaultBackends
	// (UCX). A UCX spec with gonixl's default parameters (DefaultBackends, ParseBackends' "UCX") runs without
	// NIXL's UCX thread pool in a decode role (Cache in GPU memory or DRAM): into an H200 the demo's requests
	// come closer to NIXL's own READ of the same shape without it (BenchmarkDRAMToVRAM's request=
	// benchmarks), and a decode agent with the pool could abort the process at Close after its prefill was
	// killed mid-READ (TestPrefillKilledMidRead; docs/measured.md). Any other spec is used as given.
	Backends []nixl.BackendSpec
	// Rank is this worker's (pp, tp) rank (the decode role uses its TP rank) and TPSize its engine's TP size;
	// TPSize 0 means 1.
	Rank   protocol.Rank
	TPSize int
	// Compat holds the compatibility-hash inputs and the decode side's opt-out (SkipCheck, which a prefill
	// role refuses: it checks no peer's hash). Left without inputs (CompatInputs' VLLMVersion and Model
	// empty) it gets Model.CompatInputs of Profile; set them only to override what the vLLM side changed
	// from its defaults (start from Model.CompatInputs), as they replace the derived ones whole.
	Compat Compat
	// DataDevice is the network device NIXL's UCX backend may use (UCX_NET_DEVICES for this agent only, set
	// through the backend's engine_config): where its TCP data port listens, which addresses its agent
	// metadata names, and so which peers its transfers can reach. AllDataDevices allows every device; a UCX
	// device name (e.g. "eth1", "mlx5_0:1") allows that one. Empty: DataDeviceFor(the host of the side
	// channel the role serves), the device of its own side channel: loopback for a prefill role on a
	// loopback Host (the default), every device for one on a routable host, and every device for a decode
	// role, which serves no side channel (its peers may be anywhere; set DataDeviceFor("127.0.0.1") when
	// they are all local). For several devices set UCX_NET_DEVICES in the environment, which always wins,
	// as does a NET_DEVICES in the UCX backend's engine_config param.
	DataDevice string
	// DeviceContext, when set, is a device context (e.g. a *cuda.Device, whose Do binds its retained primary
	// context) that the role's NIXL calls run in: the agent is created and the cache registered in it; a
	// decode role prepares its descriptor lists and makes and posts its READs in it, a prefill role's
	// notification loop holds it current on its OS thread for the role's lifetime. A prefill worker whose
	// DRAM is read by a decode worker's GPU on the same host needs one: UCX serves such a READ by a
	// rendezvous through cuda_copy / cuda_ipc run by the target side's progress, which needs a current CUDA
	// context there; without one it falls back to a software emulation over TCP (docs/measured.md).
	// Across hosts an RDMA NIC reads the DRAM without it. Close the role before the device. Nil: the
	// Cache's, when the Cache implements DeviceContext (a cuda.KVCache), else none.
	DeviceContext DeviceContext
	// Logger receives logs carrying request and engine ids; nil = none.
	Logger *zap.Logger
	// Metrics receives the role's counters and timings; nil = a private Metrics (the role's Metrics method).
	Metrics *Metrics
}

// Compat carries what both sides hash into the compatibility hash (vLLM ≥ 0.13), plus the opt-out.
type Compat struct {
	protocol.CompatInputs
	// SkipCheck disables the hash check on the receiving (decode) side, like vLLM's
	// enforce_handshake_compat=false; the derived inputs are kept (they still pick the backend name). A
	// prefill role refuses it: it publishes its hash and checks none, so the flag would change nothing.
	SkipCheck bool
}

// role names a role in logs, errors and random engine ids.
type role string

const (
	rolePrefill role = "prefill"
	roleDecode  role = "decode"
)

// configName is the role's config type, for errors that name a field.
func (r role) configName() string {
	if r == rolePrefill {
		return "PrefillConfig"
	}
	return "DecodeConfig"
}

// started is a role's resolved core: what every role derives from its RoleConfig before it registers.
type started struct {
	role    role
	log     *zap.Logger
	metrics *Metrics
	caps    capabilities
	owned   *DRAMCache // the cache resolve created (from a Model), until register hands it to the registration
}

// resolve fills in c's zero fields (see RoleConfig: the Profile, Compat and DRAM cache a Model implies, the
// engine id, TP size and device context), checks that the cache's region plan is the profile's layout era,
// and returns the role's core: its logger (tagged with the role, engine id and TP rank), metrics (a private
// Metrics when none was given) and the cache's capabilities. On error nothing is left to close.
func (c *RoleConfig) resolve(r role) (*started, error) {
	if c.Compat.SkipCheck && r == rolePrefill {
		return nil, errors.New("connector: PrefillConfig.Compat.SkipCheck is set: it is the decode side's opt-out of the hash check (vLLM's enforce_handshake_compat=false); a prefill role publishes its hash and checks none, so leave it false here and set it on the decode side")
	}
	owned, err := c.resolveModel()
	if err != nil {
		return nil, err
	}
	s := &started{role: r, owned: owned}
	if err := s.resolveRole(c); err != nil {
		s.abandon()
		return nil, err
	}
	return s, nil
}

// resolveRole sets the defaults that need no Model and the role's logger, metrics and capabilities.
func (s *started) resolveRole(c *RoleConfig) error {
	if c.Profile.Name == "" {
		return fmt.Errorf("connector: %s.Profile is not set (use protocol.ProfileFor)", s.role.configName())
	}
	if c.EngineID == "" {
		c.EngineID = randomID("gonixl-" + string(s.role[:1]) + "-")
	}
	if c.TPSize <= 0 {
		c.TPSize = 1
	}
	s.log = c.Logger
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.log = s.log.With(zap.String("role", string(s.role)), zap.String("engine_id", c.EngineID), zap.Int("tp_rank", c.Rank.TP))
	s.metrics = c.Metrics
	if s.metrics == nil {
		s.metrics = &Metrics{}
	}
	if err := checkPlan(c.Profile, c.Cache); err != nil {
		return err
	}
	s.caps = capabilitiesOf(c.Cache)
	if c.DeviceContext == nil {
		c.DeviceContext = s.caps.device
	}
	return nil
}

// abandon frees what resolve created, for a role that does not start.
func (s *started) abandon() {
	if s.owned != nil {
		_ = s.owned.Close()
		s.owned = nil
	}
}

// resolveModel fills Profile (and its Version) from VLLMVersion, Compat from Model (unless Compat was given)
// and, when Cache is nil and NumBlocks > 0, creates a DRAM cache for the model, which it returns for the
// role to own.
func (c *RoleConfig) resolveModel() (*DRAMCache, error) {
	if c.VLLMVersion != "" {
		p, err := protocol.ProfileFor(c.VLLMVersion)
		if err != nil {
			return nil, fmt.Errorf("connector: VLLMVersion: %w", err)
		}
		switch {
		case c.Profile.Name == "":
			c.Profile = p
		case c.Profile.Name != p.Name:
			return nil, fmt.Errorf("connector: VLLMVersion %q is in profile %s but Profile is %s; set one of them", c.VLLMVersion, p.Name, c.Profile.Name)
		case c.Profile.Version == "":
			c.Profile.Version = c.VLLMVersion
		case c.Profile.Version != c.VLLMVersion:
			return nil, fmt.Errorf("connector: VLLMVersion is %q but Profile.Version is %q; set one of them", c.VLLMVersion, c.Profile.Version)
		}
	}
	if c.Model == (Model{}) {
		return nil, nil
	}
	if c.Profile.Name == "" {
		return nil, errors.New("connector: a Model needs VLLMVersion (the vLLM version string of the peers, e.g. \"0.16.0\")")
	}
	if c.Compat.VLLMVersion == "" && c.Compat.Model == "" {
		if c.Profile.Version == "" {
			return nil, errors.New("connector: a Model without Compat needs VLLMVersion or Profile.Version (the version string is hashed)")
		}
		in, err := c.Model.CompatInputs(c.Profile)
		if err != nil {
			return nil, err
		}
		c.Compat.CompatInputs = in
	}
	if c.Cache != nil || c.NumBlocks <= 0 {
		return nil, nil
	}
	g, err := c.Model.Geometry(c.Profile, c.NumBlocks, c.TPSize)
	if err != nil {
		return nil, err
	}
	dc, err := NewDRAMCache(g, false)
	if err != nil {
		return nil, err
	}
	c.Cache = dc
	return dc, nil
}

// capabilities are a cache's optional interfaces, looked up once when a role starts (as database/sql looks
// up a driver's optional interfaces once) and used from there on; nil where the cache lacks one.
type capabilities struct {
	registrar Registrar            // registers itself (NIXL registration with its device context current)
	device    DeviceContext        // NIXL calls run in its device context (RoleConfig.DeviceContext's default)
	hostBuf   HostBuffered         // a decode cache copied to the device after each request's READs
	pipeline  HostBufferedPipeline // a HostBuffered cache whose copies overlap the later READs
}

func capabilitiesOf(c Cache) capabilities {
	var caps capabilities
	caps.registrar, _ = c.(Registrar)
	caps.device, _ = c.(DeviceContext)
	caps.hostBuf, _ = c.(HostBuffered)
	caps.pipeline, _ = c.(HostBufferedPipeline)
	return caps
}

// DeviceContext is a device context that NIXL calls must run in, current on the calling OS thread (UCX's
// CUDA transports use the current context), e.g. a *cuda.Device, whose Do binds its primary context. A Cache
// that implements it (a cuda.KVCache) is its own (RoleConfig.DeviceContext).
type DeviceContext interface {
	Do(fn func() error) error
}
