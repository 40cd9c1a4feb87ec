package connector

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// ErrAgentConflict is wrapped by a handshake refused because the prefill engine's NIXL metadata would poison
// another engine's: it names an agent already loaded with different metadata (NIXL keys remote agents by the
// name a blob claims, so loading it would merge into, or break, the other engine's agent), this decode
// worker's own agent, or KV regions that the agent did not register. Nothing is loaded; the engine already
// loaded keeps working. Counted in Metrics.AgentConflicts.
var ErrAgentConflict = errors.New("connector: prefill NIXL metadata conflicts with a loaded agent")

// loadedAgent is a remote NIXL agent whose metadata the decode agent holds, shared by every engine entry
// whose handshake loaded the same blob (reference-counted), so that releasing one never invalidates the
// agent under another.
type loadedAgent struct {
	engineID string   // the engine whose handshake loaded it first (for the error messages)
	alias    string   // the name NIXL knows it under (loadAgent)
	sum      [32]byte // SHA-256 of the blob
	refs     int
}

// maxUnprobedFailures is how many blobs NIXL failed to load a decode role whose backends are all UCX tolerates
// before it checks every new blob in a probe agent first (probeLoad): each such failure leaves the agents that
// tried connected to an alias no later load uses (a few endpoints each), so their number stays bounded, and a
// worker that meets no bad blob never pays the probe's load (make bench-vllm's handshake_ms). Other backends
// (LIBFABRIC) probe every new blob: their connections are set up by a handshake between the agents that names
// both, so an agent can be loaded under the name it claims only.
const maxUnprobedFailures = 4

// loadAgent loads a prefill rank's NIXL metadata for engine engineID and returns the name the agent is known
// by to NIXL (an alias: the name the blob claims, then '#' and a number of this role's), with a reference the
// caller gives back with unloadAgent and the name the blob claims. A blob whose agent is already loaded is
// shared when it is byte for byte the same, and refused (ErrAgentConflict) when it differs. A blob NIXL fails
// to load leaves nothing that matters behind: NIXL keeps part of such a blob (its backends' connection) under
// the name it was loaded under and refuses every later load of that name until the agent is closed, so with
// UCX every load gets a name of its own (nixl.RenameMetadata), and after maxUnprobedFailures failures (with
// other backends always) a blob is loaded into a probe agent first, and under the name it claims.
func (d *Decode) loadAgent(engineID string, md []byte) (alias, name string, err error) {
	name, err = nixl.MetadataAgentName(md)
	if err != nil {
		return "", "", fmt.Errorf("%w: prefill engine %s's agent metadata: %v", ErrBadParams, engineID, err)
	}
	if name == d.reg.agent.Name() || d.reg.readAgentNamed(name) {
		d.metrics.agentConflicts.Add(1)
		return "", "", fmt.Errorf("%w: prefill engine %s's metadata names this decode worker's own agent %q", ErrAgentConflict, engineID, name)
	}
	sum := sha256.Sum256(md)
	d.agentsMu.Lock()
	defer d.agentsMu.Unlock()
	if la := d.agents[name]; la != nil {
		if la.sum != sum {
			d.metrics.agentConflicts.Add(1)
			return "", "", fmt.Errorf("%w: prefill engine %s's metadata names agent %q, already loaded with other metadata for engine %s; refused so that engine keeps working (a hostile or misconfigured side channel?)",
				ErrAgentConflict, engineID, name, la.engineID)
		}
		la.refs++
		return la.alias, name, nil
	}
	alias, renamed := name, md
	if !d.aliased || d.loadFailures >= maxUnprobedFailures {
		if err := d.probeLoad(md); err != nil {
			return "", "", err
		}
	}
	if d.aliased {
		d.aliasSeq++
		alias = fmt.Sprintf("%s#%d", name, d.aliasSeq)
		if renamed, err = nixl.RenameMetadata(md, alias); err != nil {
			return "", "", fmt.Errorf("%w: prefill engine %s's agent metadata: %v", ErrBadParams, engineID, err)
		}
	}
	// The role's agent and its read agents load the blob at once: each load connects that agent's UCX worker
	// to the peer.
	errs := make([]error, len(d.reg.readAgents))
	var wg sync.WaitGroup
	for i, ra := range d.reg.readAgents {
		wg.Go(func() { _, errs[i] = ra.agent.LoadRemoteMetadata(renamed) })
	}
	got, err := d.reg.agent.LoadRemoteMetadata(renamed)
	wg.Wait()
	if err == nil && got != alias {
		err = fmt.Errorf("%w: prefill engine %s's metadata was loaded as agent %q, not %q", ErrBadParams, engineID, got, alias)
	}
	for i, ra := range d.reg.readAgents {
		if err == nil && errs[i] != nil {
			err = fmt.Errorf("connector: loading prefill engine %s's metadata into read agent %s: %w", engineID, ra.agent.Name(), errs[i])
		}
	}
	if err != nil {
		// What NIXL kept of a failed load goes where it can; the alias is never loaded again either way.
		d.forgetAlias(alias)
		d.loadFailures++
		if d.aliased && d.loadFailures == maxUnprobedFailures {
			d.log.Warn("NIXL failed to load several prefill engines' metadata: each new engine's is now checked in a probe agent first (a slower handshake)",
				zap.Int("failures", d.loadFailures), zap.String("last_engine_id", engineID), zap.Error(err))
		}
		return "", "", err
	}
	d.agents[name] = &loadedAgent{engineID: engineID, alias: alias, sum: sum, refs: 1}
	return alias, name, nil
}

// startProbe creates the probe agent (probeLoad) in the background for a role that probes every blob (backends
// other than UCX), so that the first handshake does not pay for its creation: a NIXL agent with the decode
// agent's backends takes tens of milliseconds, more than the rest of a handshake on a small host
// (docs/measured.md, "Side by side"). A failed creation is retried by the first handshake, which reports it.
func (d *Decode) startProbe() {
	d.probeInit = make(chan struct{})
	if d.aliased {
		close(d.probeInit) // created on the first probeLoad, if any
		return
	}
	go func() {
		defer close(d.probeInit)
		a, err := d.newProbe()
		if err != nil {
			d.log.Debug("creating the agent that checks prefill metadata failed; the first handshake retries", zap.Error(err))
			return
		}
		d.probe = a // read by others only after probeInit is closed
	}()
}

// newProbe creates a probe agent with the decode agent's backends, without NIXL's UCX thread pool
// (withoutThreadPool), and no progress thread.
func (d *Decode) newProbe() (*nixl.Agent, error) {
	d.probeSeq++
	a, err := d.cfg.Library.NewAgent(fmt.Sprintf("%s-probe%d", d.reg.agent.Name(), d.probeSeq),
		nixl.AgentConfig{Backends: withoutThreadPool(d.reg.backends), NoProgressThread: true})
	if err != nil {
		return nil, fmt.Errorf("connector: creating the agent that checks prefill metadata: %w", err)
	}
	return a, nil
}

// probeLoad loads a blob into a throwaway agent first (created by startProbe or the first call, again after a
// failure, with the decode agent's backends) and forgets it there, so that a blob NIXL fails to load costs
// the role's agents nothing: only the probe, replaced after such a failure, keeps what NIXL kept of it.
// Called with agentsMu held.
func (d *Decode) probeLoad(md []byte) error {
	<-d.probeInit
	if d.probe == nil {
		a, err := d.newProbe()
		if err != nil {
			return err
		}
		d.probe = a
	}
	name, err := d.probe.LoadRemoteMetadata(md)
	if err != nil {
		_ = d.probe.Close() // whatever NIXL kept of the blob goes with it
		d.probe = nil
		return err
	}
	return d.probe.InvalidateRemoteMetadata(name)
}

// closeProbe closes the probe agent, if one was created, once startProbe's creation returned (Decode.Close).
func (d *Decode) closeProbe() {
	<-d.probeInit
	d.agentsMu.Lock()
	defer d.agentsMu.Unlock()
	if d.probe != nil {
		_ = d.probe.Close()
		d.probe = nil
	}
}

// unloadAgent gives back a reference from loadAgent for the agent whose blob claims name; the last one
// invalidates the agent's metadata.
func (d *Decode) unloadAgent(name string) {
	d.agentsMu.Lock()
	defer d.agentsMu.Unlock()
	la := d.agents[name]
	if la == nil {
		return
	}
	if la.refs--; la.refs > 0 {
		return
	}
	delete(d.agents, name)
	d.reg.drainReadAgents() // before their endpoints to it go
	d.forgetAlias(la.alias)
}

// forgetAlias invalidates the metadata loaded under alias in the read agents and the role's agent (errors
// ignored: a failed load may have left nothing to invalidate).
func (d *Decode) forgetAlias(alias string) {
	for _, ra := range d.reg.readAgents {
		_ = ra.agent.InvalidateRemoteMetadata(alias)
	}
	_ = d.reg.agent.InvalidateRemoteMetadata(alias)
}

// checkRegions refuses (ErrAgentConflict) a prefill rank whose published KV regions are not memory its NIXL
// agent registered: another engine id could otherwise claim a real agent with regions of its choosing.
func (d *Decode) checkRegions(engineID, agent string, md protocol.AgentMetadata, geom layout.Geometry) error {
	descs := make([]nixl.Desc, len(md.KVCachesBaseAddr))
	for i, b := range md.KVCachesBaseAddr {
		descs[i] = nixl.Desc{Addr: b, Len: uint64(geom.RegionLen()), DevID: uint64(md.DeviceID)}
	}
	mem := regionMem(md)
	err := d.reg.agent.CheckRemoteMetadata(agent, mem, descs)
	if err != nil && len(md.RegionMemTypes) == 0 && mem != nixl.VRAM {
		if d.reg.agent.CheckRemoteMetadata(agent, nixl.VRAM, descs) == nil {
			return nil
		}
	}
	if err != nil {
		d.metrics.agentConflicts.Add(1)
		return fmt.Errorf("%w: prefill engine %s publishes %d KV regions that its agent %q did not register: %v", ErrAgentConflict, engineID, len(descs), agent, err)
	}
	return nil
}

// regionMem is the memory type a prefill rank's metadata names for its regions (DRAM when it names none).
func regionMem(md protocol.AgentMetadata) nixl.MemType {
	if len(md.RegionMemTypes) > 0 {
		if m, err := nixl.ParseMemType(md.RegionMemTypes[0]); err == nil {
			return m
		}
	}
	return nixl.DRAM
}

// validHost reports whether h can name a side channel: an IP address (IPv6 with or without brackets) or a
// host name of RFC 1123 labels (letters, digits, '-' inside, '_' tolerated), at most 253 bytes.
func validHost(h string) bool {
	if h == "" {
		return false
	}
	ip := h
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		ip = h[1 : len(h)-1]
	}
	if net.ParseIP(ip) != nil {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Per-pull failure lines are sampled: the first failLogFirst of each second, then every
// failLogThereafter-th (zap's sampler, keyed by message): 300 forged requests are some 20 lines, not 300.
const (
	failLogFirst      = 10
	failLogThereafter = 100
)

func sampled(log *zap.Logger) *zap.Logger {
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, failLogFirst, failLogThereafter)
	}))
}

// allUCX reports whether every backend of specs is UCX (loadAgent's aliases).
func allUCX(specs []nixl.BackendSpec) bool {
	for _, s := range specs {
		if s.Plugin != "UCX" {
			return false
		}
	}
	return len(specs) > 0
}
