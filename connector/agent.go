package connector

import (
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// DefaultBackends is the NIXL backend list of the roles when none is configured: UCX (vLLM's default too),
// with nixl.DefaultUCXOptions (UCX_* environment variables still override them).
var DefaultBackends = []nixl.BackendSpec{defaultUCX()}

func defaultUCX() nixl.BackendSpec {
	s, err := nixl.DefaultUCXOptions().Spec()
	if err != nil {
		return nixl.BackendSpec{Plugin: "UCX"}
	}
	return s
}

// ParseBackends turns vLLM's kv_connector_extra_config "backends" list (e.g. ["LIBFABRIC"]) into specs; UCX
// gets nixl.DefaultUCXOptions.
func ParseBackends(names []string) []nixl.BackendSpec {
	out := make([]nixl.BackendSpec, 0, len(names))
	for _, n := range names {
		if n = strings.ToUpper(strings.TrimSpace(n)); n == "UCX" {
			out = append(out, defaultUCX())
		} else if n != "" {
			out = append(out, nixl.BackendSpec{Plugin: n})
		}
	}
	return out
}

// Registrar is a Cache that registers itself with an agent (all its regions, one call). The roles use it
// when present, else they register RegionBases × RegionLen themselves.
type Registrar interface {
	Register(a *nixl.Agent, opts ...nixl.Option) (*nixl.Registration, error)
}

// registered is a cache registered with an agent: the agent, its registration, and the local descriptor
// list of every block of every region, prepared once.
type registered struct {
	agent *nixl.Agent
	reg   *nixl.Registration
	cache Cache
	geom  layout.Geometry
	owned *DRAMCache // a cache the role created (from a Model), closed after the agent
	// splitDescs: post one descriptor per block, not NIXL's merged runs (see xferOpts).
	splitDescs bool
}

// xferOpts are the options of a READ into this cache: the notification, and WithoutDescMerge where the cache
// is DRAM and UCX runs a thread pool. NIXL's pool divides a request among its threads by descriptor count,
// so a run merged into one large descriptor would go through one thread (BenchmarkDRAMToDRAM, contiguous
// against contiguous-nomerge; README's Measured section); into GPU memory, where UCX pays a rendezvous per
// descriptor, merged runs are kept.
func (r *registered) xferOpts(notif []byte) []nixl.Option {
	opts := []nixl.Option{nixl.WithNotification(notif)}
	if r.splitDescs {
		opts = append(opts, nixl.WithoutDescMerge())
	}
	return opts
}

// threadPool reports whether a UCX backend of specs runs NIXL's thread pool (num_threads > 0).
func threadPool(specs []nixl.BackendSpec) bool {
	for _, s := range specs {
		if n, err := strconv.Atoi(s.Params["num_threads"]); s.Plugin == "UCX" && err == nil && n > 0 {
			return true
		}
	}
	return false
}

// register creates an agent, registers every region of cache with it in one call, and returns both.
func register(lib *nixl.Library, name string, backends []nixl.BackendSpec, device string, cache Cache, noProgressThread bool, log *zap.Logger) (*registered, error) {
	if lib == nil {
		return nil, fmt.Errorf("connector: nil NIXL library (call nixl.Load)")
	}
	if cache == nil {
		return nil, fmt.Errorf("connector: nil cache")
	}
	g := cache.Geometry()
	if err := g.Validate(); err != nil {
		return nil, err
	}
	bases := cache.RegionBases()
	if len(bases) != g.NumRegions() {
		return nil, fmt.Errorf("connector: cache reports %d region bases for %d regions", len(bases), g.NumRegions())
	}
	if len(backends) == 0 {
		backends = DefaultBackends
	}
	backends = withDataDevice(backends, device)
	if device != "" {
		log.Info("NIXL UCX data plane restricted to one network device (UCX_NET_DEVICES in the environment overrides)", zap.String("device", device))
	}
	a, err := lib.NewAgent(name, nixl.AgentConfig{Backends: backends, NoProgressThread: noProgressThread, Logger: log})
	if err != nil {
		return nil, err
	}
	reg, err := registerCache(a, cache, g)
	if err != nil {
		a.Close()
		return nil, err
	}
	split := cache.MemType() == nixl.DRAM && threadPool(backends) && lib.HasSkipDescMerge()
	return &registered{agent: a, reg: reg, cache: cache, geom: g, splitDescs: split}, nil
}

// registerCache registers every region of cache with agent a in one call.
func registerCache(a *nixl.Agent, cache Cache, g layout.Geometry) (*nixl.Registration, error) {
	bases := cache.RegionBases()
	descs := make([]nixl.Desc, len(bases))
	for i, b := range bases {
		descs[i] = nixl.Desc{Addr: b, Len: uint64(g.RegionLen()), DevID: cache.DeviceID()}
	}
	var reg *nixl.Registration
	var err error
	if r, ok := cache.(Registrar); ok {
		reg, err = r.Register(a) // e.g. a CUDA cache, which registers with its device context current
	} else {
		reg, err = a.RegisterMem(cache.MemType(), descs)
	}
	if err != nil {
		return nil, fmt.Errorf("connector: registering the KV cache (%s, %d regions of %d bytes): %w", cache.MemType(), len(descs), g.RegionLen(), err)
	}
	return reg, nil
}

func (r *registered) close() error {
	var err error
	if r.reg != nil { // nil after a failed Prefill.Reregister
		err = r.reg.Close()
	}
	if cerr := r.agent.Close(); err == nil {
		err = cerr
	}
	if r.owned != nil {
		if cerr := r.owned.Close(); err == nil { // idempotent
			err = cerr
		}
	}
	return err
}

// Compat carries what both sides hash into the compatibility hash (vLLM ≥ 0.13), plus the opt-out.
type Compat struct {
	protocol.CompatInputs
	// SkipCheck disables the hash check on the receiving (decode) side, like vLLM's
	// enforce_handshake_compat=false.
	SkipCheck bool
}

// buildMetadata fills NixlAgentMetadata for a registered cache.
func buildMetadata(p protocol.Profile, engineID string, r *registered) (protocol.AgentMetadata, error) {
	md, err := r.agent.LocalMetadata()
	if err != nil {
		return protocol.AgentMetadata{}, err
	}
	g := r.geom
	m := protocol.NewAgentMetadata()
	m.EngineID = engineID
	m.AgentMetadata = md
	m.KVCachesBaseAddr = r.cache.RegionBases()
	m.DeviceID = int64(r.cache.DeviceID())
	m.NumBlocks = int64(g.NumBlocks)
	m.BlockLens = g.BlockLens()
	if m.KVCacheLayout, err = p.LayoutName(g.Order); err != nil { // "HND" up to 0.28, "LBHNC" from 0.29
		return protocol.AgentMetadata{}, fmt.Errorf("connector: %w", err)
	}
	m.BlockSize = int64(g.BlockSize)
	m.BlockStrides = g.BlockLens()
	return m, nil
}
