package connector

import (
	"fmt"
	"maps"
	"slices"
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
	agent    *nixl.Agent
	reg      *nixl.Registration
	cache    Cache
	caps     capabilities  // the cache's optional interfaces (looked up once)
	device   DeviceContext // RoleConfig.DeviceContext, resolved: NIXL calls run in it (do)
	backends []nixl.BackendSpec
	geom     layout.Geometry
	owned    *DRAMCache // a cache the role created (from a Model), closed after the agent
	// splitDescs: post one descriptor per block, not NIXL's merged runs (see xferOpts): a DRAM cache whose
	// UCX pool the role did not size (roleBackends).
	splitDescs bool
	// sized: roleBackends adapted a UCX spec of gonixl's default to the role (defaultReadAgents).
	sized bool
	// readAgents split a decode role's READs (stripes.go); none in other roles.
	readAgents []*readAgent
}

// do runs fn with the role's device context current (RoleConfig.DeviceContext), or directly without one.
func (r *registered) do(fn func() error) error {
	if r.device == nil {
		return fn()
	}
	return r.device.Do(fn)
}

// xferOpts are the options of a READ into this cache: the notification, and WithoutDescMerge where the cache
// is DRAM and UCX runs a thread pool the role did not size itself (splitDescs: an explicit UCX spec). NIXL's
// pool divides a request among its threads by descriptor count, split_batch_size at a time, so a request of
// few merged runs under a large split_batch_size would go through one thread (BenchmarkDRAMToDRAM,
// contiguous against contiguous-nomerge; docs/measured.md). With gonixl's default UCX spec a decode role
// runs no pool (roleBackends) and keeps NIXL's merged runs (one descriptor per region and run).
func (r *registered) xferOpts(notif []byte) []nixl.Option {
	opts := []nixl.Option{nixl.WithNotification(notif)}
	if r.splitDescs {
		opts = append(opts, nixl.WithoutDescMerge())
	}
	return opts
}

// maxWarmUpDescs bounds the warm-up READ's descriptors (warmUpDescs), whatever the pool's size.
const maxWarmUpDescs = 256

// warmUpDescs is how many descriptors a READ needs for NIXL's UCX thread pool to hand a share to each of its
// threads, every one of which has its own UCX worker and so its own endpoint to each peer: num_threads ×
// split_batch_size (NIXL's split_batch_size default when unset), at most maxWarmUpDescs; 1 without a pool.
func warmUpDescs(specs []nixl.BackendSpec) int {
	for _, s := range specs {
		threads, err := strconv.Atoi(s.Params["num_threads"])
		if s.Plugin != "UCX" || err != nil || threads <= 0 {
			continue
		}
		split, err := strconv.Atoi(s.Params["split_batch_size"])
		if err != nil || split <= 0 {
			split = nixlDefaultSplitBatch
		}
		return min(threads*split, maxWarmUpDescs)
	}
	return 1
}

// nixlDefaultSplitBatch is NIXL's UCX split_batch_size when the backend's parameters leave it unset.
const nixlDefaultSplitBatch = 1024

// roleBackends adapts specs to role r with a cache of memory type mem, for a UCX spec with gonixl's default
// parameters (DefaultBackends, ParseBackends' "UCX") in a decode role (RoleConfig.Backends): reading into GPU
// memory or DRAM it loses NIXL's thread pool, and its READs keep NIXL's merged runs (see xferOpts). Into GPU
// memory UCX pays a rendezvous per descriptor and the pool is no faster (docs/measured.md). Into DRAM the
// pool was faster on 2 cores (make bench-vllm), but a decode agent with the pool whose prefill peer was
// killed mid-READ aborted the process when it was closed (UCX: "Assertion `ucs_arbiter_group_is_empty(group)'
// failed" in nixlAgent's destructor; TestPrefillKilledMidRead, NIXL 1.5.0) — without it, it never did; read
// agents parallelise such a READ instead (DecodeConfig.ReadAgents, stripes.go). It reports whether it adapted
// a spec so. Other roles, caches and specs are returned as given.
func roleBackends(r role, mem nixl.MemType, specs []nixl.BackendSpec) ([]nixl.BackendSpec, bool) {
	if r != roleDecode || (mem != nixl.VRAM && mem != nixl.DRAM) {
		return specs, false
	}
	def := defaultUCX()
	out := slices.Clone(specs)
	adapted := false
	for i, s := range specs {
		if s.Plugin != "UCX" || !maps.Equal(s.Params, def.Params) {
			continue
		}
		adapted = true
		out[i] = withoutThreadPool(specs[i : i+1])[0]
	}
	return out, adapted
}

// withoutThreadPool returns specs without NIXL's UCX thread pool (num_threads, split_batch_size), each UCX
// spec's params copied. The decode role's default for a GPU-memory cache (RoleConfig.Backends), and the probe
// agent's (probeLoad): loading a peer's metadata connects one endpoint per UCX worker, and each of the pool's
// threads has one, which the probe, which never transfers, does not need (a third of a handshake's time on a
// 2-core host, docs/measured.md). The probe reads a blob the same way without them.
func withoutThreadPool(specs []nixl.BackendSpec) []nixl.BackendSpec {
	out := make([]nixl.BackendSpec, len(specs))
	for i, s := range specs {
		out[i] = s
		if s.Plugin != "UCX" {
			continue
		}
		out[i].Params = make(map[string]string, len(s.Params))
		for k, v := range s.Params {
			if k != "num_threads" && k != "split_batch_size" {
				out[i].Params[k] = v
			}
		}
	}
	return out
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

// register creates the role's agent (named agentName) in its device context, restricted to its data device
// (RoleConfig.DataDevice, resolved against dataHost, the host of the side channel the role serves; "" for
// none), registers every region of the cache with it in one call, and returns both; the registration owns
// the cache resolve created from then on. A prefill agent is the target of its peers' READs and receives
// their notifications: it runs without NIXL's progress thread and the role's loop drives progress (see
// nixl.AgentConfig.NoProgressThread).
func (s *started) register(c *RoleConfig, agentName, dataHost string) (*registered, error) {
	if c.Library == nil {
		return nil, fmt.Errorf("connector: nil NIXL library (call nixl.Load)")
	}
	g := c.Cache.Geometry()
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if bases := c.Cache.RegionBases(); len(bases) != g.NumRegions() {
		return nil, fmt.Errorf("connector: cache reports %d region bases for %d regions", len(bases), g.NumRegions())
	}
	backends := c.Backends
	if len(backends) == 0 {
		backends = DefaultBackends
	}
	backends, sized := roleBackends(s.role, c.Cache.MemType(), backends)
	device := resolveDataDevice(c.DataDevice, dataHost)
	backends = withDataDevice(backends, device)
	if device != "" {
		s.log.Info("NIXL UCX data plane restricted to one network device (UCX_NET_DEVICES in the environment overrides)", zap.String("device", device))
	}
	r := &registered{cache: c.Cache, caps: s.caps, device: c.DeviceContext, backends: backends, geom: g, sized: sized,
		splitDescs: c.Cache.MemType() == nixl.DRAM && !sized && threadPool(backends) && c.Library.HasSkipDescMerge()}
	err := r.registering(func() (err error) {
		if r.agent, err = c.Library.NewAgent(agentName, nixl.AgentConfig{Backends: backends, NoProgressThread: s.role == rolePrefill, Logger: s.log}); err != nil {
			return err
		}
		if r.reg, err = r.registerCache(); err != nil {
			r.agent.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	r.owned, s.owned = s.owned, nil
	return r, nil
}

// registering runs fn, which creates the agent or registers the cache, in the role's device context (one Do):
// except for a cache that is its own DeviceContext and registers itself (a cuda.KVCache), which takes its
// context in Register; nesting that in its Do could deadlock (cuda.Device.Do), so fn then runs outside.
func (r *registered) registering(fn func() error) error {
	if r.caps.registrar != nil && r.caps.device != nil {
		return fn()
	}
	return r.do(fn)
}

// registerCache registers every region of the cache with the agent in one call: through the cache's own
// Register where it has one (Registrar), else as RegionBases × RegionLen. Callers run it inside registering.
func (r *registered) registerCache() (*nixl.Registration, error) {
	return r.registerCacheWith(r.agent)
}

// registerCacheWith is registerCache with agent a (the role's agent or one of its read agents).
func (r *registered) registerCacheWith(a *nixl.Agent) (*nixl.Registration, error) {
	bases := r.cache.RegionBases()
	descs := make([]nixl.Desc, len(bases))
	for i, b := range bases {
		descs[i] = nixl.Desc{Addr: b, Len: uint64(r.geom.RegionLen()), DevID: r.cache.DeviceID()}
	}
	var reg *nixl.Registration
	var err error
	if r.caps.registrar != nil {
		reg, err = r.caps.registrar.Register(a) // e.g. a CUDA cache, which registers with its device context current
	} else {
		reg, err = a.RegisterMem(r.cache.MemType(), descs)
	}
	if err != nil {
		return nil, fmt.Errorf("connector: registering the KV cache (%s, %d regions of %d bytes): %w", r.cache.MemType(), len(descs), r.geom.RegionLen(), err)
	}
	return reg, nil
}

func (r *registered) close() error {
	err := r.closeReadAgents()
	if r.reg != nil { // nil after a failed Prefill.Reregister
		if cerr := r.reg.Close(); err == nil {
			err = cerr
		}
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
