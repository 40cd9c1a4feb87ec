package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// handshakes is the decode role's handshake cache: the prefill engines it has handshaken (or is
// handshaking), by engine id, with their reference counts, the engines dropped but still used by in-flight
// pulls (draining), and the registration generation last seen per engine.
//
// Lifetime: a remoteEngine is reference-counted under mu. remotes holds one reference while the engine is
// cached, and every Pull that uses it holds one from Decode.remote until it returns. Dropping the engine (a
// failed transfer, a failed handshake, a new registration generation, Close) only removes the cache's
// reference; the descriptor lists are closed and the remote agents' metadata invalidated (release) when the
// last reference goes, so never under an in-flight pull. Until then the engine waits in draining, and a new
// handshake with the same engine waits for it: the remote agent names are the same, and invalidating the
// old generation's metadata must not hit the new one's.
type handshakes struct {
	mu          sync.Mutex
	closed      bool                     // set by close: acquire fails with nixl.ErrClosed
	remotes     map[string]*remoteEngine // handshaken (or handshaking) engines, by engine id
	draining    map[string]*remoteEngine // dropped from remotes, still used by in-flight pulls, by engine id
	generations map[string]int64         // remote_registration_generation seen per engine id
	release     func(*remoteEngine)      // closes an engine's lists and agents once its last reference went
}

func newHandshakes(release func(*remoteEngine)) *handshakes {
	return &handshakes{remotes: map[string]*remoteEngine{}, draining: map[string]*remoteEngine{},
		generations: map[string]int64{}, release: release}
}

// remoteEngine is a handshaken prefill engine: the plan of which of its ranks this decode rank reads, and the
// handshake with each of them. Its references are counted by handshakes.
type remoteEngine struct {
	id       string
	refs     int           // guarded by handshakes.mu
	released chan struct{} // closed after release (the last reference went)
	once     chan struct{} // closed when the handshake finished (ok or not)
	err      error
	addr     string
	tp       int // the prefill engine's TP size
	plan     *layout.ReadPlan
	sources  []*source
	took     time.Duration
}

// source is one prefill rank this decode rank reads.
type source struct {
	rank      int
	agent     string // the name its NIXL agent is loaded under (loadAgent's alias)
	agentName string // the name its metadata claims
	meta      protocol.AgentMetadata
	remote    *nixl.Prepped // the prefill rank's blocks as this rank reads them
	local     *nixl.Prepped // the local blocks (or their slices) they land in
	pairLen   int64         // bytes per descriptor pair
	stripes   []stripeLists // the same lists prepared by each read agent (stripes.go)
}

// agents are the NIXL agent names of the prefill ranks read.
func (re *remoteEngine) agents() []string {
	agents := make([]string, len(re.sources))
	for i, src := range re.sources {
		agents[i] = src.agent
	}
	return agents
}

// acquire returns the cached engine with a reference for the caller, or creates it (mine: the caller does
// the handshake; the new engine carries the cache's reference and the caller's). While an earlier
// generation of the engine is draining it waits for its release, bounded by ctx.
func (h *handshakes) acquire(ctx context.Context, engineID, addr string, prefillTP int) (re *remoteEngine, mine bool, err error) {
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return nil, false, fmt.Errorf("connector: handshake with %s: the decode role is closed: %w", engineID, nixl.ErrClosed)
		}
		if re = h.remotes[engineID]; re != nil {
			if re.addr != addr || re.tp != prefillTP {
				h.mu.Unlock()
				return nil, false, fmt.Errorf("%w: engine %s was handshaken at %s with TP %d, now named at %s with TP %d",
					ErrBadParams, engineID, re.addr, re.tp, addr, prefillTP)
			}
			re.refs++
			h.mu.Unlock()
			return re, false, nil
		}
		old := h.draining[engineID]
		if old == nil {
			re = &remoteEngine{id: engineID, refs: 2, released: make(chan struct{}), once: make(chan struct{}), addr: addr, tp: prefillTP}
			h.remotes[engineID] = re
			h.mu.Unlock()
			return re, true, nil
		}
		h.mu.Unlock()
		select {
		case <-old.released:
		case <-ctx.Done():
			return nil, false, fmt.Errorf("connector: handshake with %s: waiting for the transfers on its previous handshake to end: %w", engineID, ctx.Err())
		}
	}
}

// drop removes re from the cache (if it is still the cached one) and puts the cache's reference.
func (h *handshakes) drop(re *remoteEngine) bool {
	h.mu.Lock()
	mine := h.remotes[re.id] == re
	if mine {
		delete(h.remotes, re.id)
		h.draining[re.id] = re
	}
	h.mu.Unlock()
	if mine {
		h.put(re)
	}
	return mine
}

// put drops one reference to re; the last one releases its descriptor lists and remote agents.
func (h *handshakes) put(re *remoteEngine) {
	h.mu.Lock()
	re.refs--
	last := re.refs == 0
	h.mu.Unlock()
	if !last {
		return
	}
	h.release(re)
	h.mu.Lock()
	if h.draining[re.id] == re {
		delete(h.draining, re.id)
	}
	h.mu.Unlock()
	close(re.released)
}

// Registration generations (kv_transfer_params.remote_registration_generation, vLLM 0.33+): a prefill engine
// counts how often it registered its KV cache, and a decode worker that sees a larger number than the one it
// recorded for that engine drops its cached handshake and handshakes again (vLLM 0.33's
// NixlPullConnectorWorker._read_blocks_for_req). Rows without the key always carry 0 and never trigger it.

// advance records gen for engineID and drops the cached handshake when gen is larger than the recorded one
// (the first generation seen only records it, like vLLM's dict.get(engine_id, 0) < generation with nothing
// cached yet). It reports whether a cached handshake was dropped.
func (h *handshakes) advance(engineID string, gen int64) bool {
	h.mu.Lock()
	if gen <= h.generations[engineID] {
		h.mu.Unlock()
		return false
	}
	re := h.remotes[engineID]
	if re != nil {
		select {
		case <-re.once: // a finished handshake: drop it below
		default: // one in progress may predate the new registration: record nothing, the next pull checks again
			h.mu.Unlock()
			return false
		}
	}
	h.generations[engineID] = gen
	h.mu.Unlock()
	if re == nil {
		return false
	}
	h.drop(re)
	return true
}

// close refuses new handshakes and empties the cache, returning the cached engines: the caller puts their
// cache references once no pull uses them.
func (h *handshakes) close() map[string]*remoteEngine {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	remotes := h.remotes
	h.remotes = map[string]*remoteEngine{}
	return remotes
}

// advanceGeneration drops the cached handshake with engineID when gen is a newer registration generation
// (handshakes.advance), logging it.
func (d *Decode) advanceGeneration(engineID string, gen int64) bool {
	if !d.hs.advance(engineID, gen) {
		return false
	}
	d.log.Info("prefill engine registered its KV cache again; handshaking again",
		zap.String("remote_engine_id", engineID), zap.Int64("registration_generation", gen))
	return true
}

// remote returns the handshaken prefill engine with a reference held for the caller (put it back with
// put), doing the handshake once (concurrent callers wait for it). A caller that waited for a handshake
// which failed only because its owner's context ended tries again with its own context. While an earlier
// generation of the same engine is still draining (dropped, but used by in-flight pulls), a new handshake
// waits for it to be released, bounded by ctx.
func (d *Decode) remote(ctx context.Context, engineID, addr string, prefillTP int, remoteRequestID string) (*remoteEngine, time.Duration, error) {
	for {
		re, mine, err := d.hs.acquire(ctx, engineID, addr, prefillTP)
		if err != nil {
			return nil, 0, err
		}
		if mine {
			start := time.Now()
			re.err = d.handshake(ctx, engineID, re, remoteRequestID)
			re.took = time.Since(start)
			if re.err == nil {
				d.metrics.handshakes.Add(1)
				d.metrics.observe(timingHandshake, re.took)
			} else {
				d.hs.drop(re)
			}
			close(re.once)
			if re.err != nil {
				d.hs.put(re)
				return nil, re.took, re.err
			}
			return re, re.took, nil
		}
		select {
		case <-re.once:
		case <-ctx.Done():
			d.hs.put(re)
			return nil, 0, fmt.Errorf("connector: waiting for the handshake with %s: %w", engineID, ctx.Err())
		}
		if re.err == nil {
			return re, 0, nil
		}
		d.hs.put(re)
		if ctx.Err() == nil && (errors.Is(re.err, context.Canceled) || errors.Is(re.err, context.DeadlineExceeded)) {
			continue // the owner's context ended, not ours
		}
		return nil, 0, re.err
	}
}

// release closes a remote engine's descriptor lists and forgets its agents. Only put calls it, for the last
// reference.
func (d *Decode) release(re *remoteEngine) {
	for _, src := range re.sources {
		stripeLists{local: src.local, remote: src.remote}.close()
		for _, sl := range src.stripes {
			sl.close()
		}
		if src.agent != "" {
			d.unloadAgent(src.agentName) // only the references this engine took: never an agent another still uses
		}
	}
	re.sources = nil
}

// forget drops a remote engine's handshake (after a failed transfer), so the next pull does it again. Its
// lists are released when the last pull using them returns.
func (d *Decode) forget(re *remoteEngine) {
	if d.hs.drop(re) {
		d.log.Info("dropped handshake after a failure; it is redone on the next request", zap.String("remote_engine_id", re.id))
	}
}
