package connector

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/internal/poll"
	"github.com/gonixl/gonixl/nixl"
)

// A decode role reading into DRAM with gonixl's default UCX backend splits each READ over read agents
// (DecodeConfig.ReadAgents): NIXL agents of their own, each with one UCX worker and no progress thread, that
// register the same cache and load the same prefill metadata as the role's agent. Each stripe of a READ is
// posted on one of them and awaited by its own goroutine, whose polls progress that agent's worker: with
// UCX's cma (a same-host peer) the copy runs in those polls, so the stripes copy on as many cores as there are
// read agents. The notification goes out from the role's agent once every stripe completed, so the prefill
// side frees nothing still being read. NIXL's thread pool (num_threads) parallelises a READ the same way, but
// a pool agent whose peer died mid-READ can abort the process at Close (docs/measured.md); a read agent's
// worker is progressed by gonixl until its requests are released and once more before its agent is destroyed.

// defaultReadAgentCount is the default number of read agents (DecodeConfig.ReadAgents) on a host of two CPUs
// or more, whatever their count: a stripe's copy is the kernel's (cma), and beside a vLLM worker's busy
// threads (NIXL's progress thread, OpenMP's spinning workers) four stripes get the READ more of a contended
// CPU than one per core: on two cores, side by side with vLLM 0.33, gonixl's READ took 23–33 ms with four
// against 36–40 with two (docs/measured.md, 2026-12-07 17:55–18:47); on a quiet host three or four are no slower
// than two (2026-12-06 17:15).
const defaultReadAgentCount = 4

// stripeBackoff polls a stripe's READ: the polls are what progresses a read agent's worker (and, over cma,
// what copies), so it sleeps far less than poll.Default.
var stripeBackoff = poll.Backoff{Spins: 256, Min: time.Microsecond, Max: 50 * time.Microsecond, Slack: 1.0 / 64}

// readAgent is one of a decode role's read agents: its agent and its registration of the role's cache.
type readAgent struct {
	agent *nixl.Agent
	reg   *nixl.Registration
}

// defaultReadAgents is DecodeConfig.ReadAgents' default for a role whose backends registered sized:
// defaultReadAgentCount for a DRAM cache whose UCX spec gonixl chose (roleBackends) on a host of two CPUs or
// more; else none.
func defaultReadAgents(mem nixl.MemType, sized bool) int {
	if mem != nixl.DRAM || !sized || runtime.NumCPU() < 2 {
		return 0
	}
	return defaultReadAgentCount
}

// startReadAgents creates n read agents named after the role's agent, each registering the cache. On error
// the ones created are closed.
func (r *registered) startReadAgents(lib *nixl.Library, n int) (err error) {
	defer func() {
		if err != nil {
			r.closeReadAgents()
		}
	}()
	for i := range n {
		ra := &readAgent{}
		err := r.registering(func() (err error) {
			if ra.agent, err = lib.NewAgent(fmt.Sprintf("%s-read%d", r.agent.Name(), i),
				nixl.AgentConfig{Backends: r.backends, NoProgressThread: true}); err != nil {
				return err
			}
			if ra.reg, err = r.registerCacheWith(ra.agent); err != nil {
				_ = ra.agent.Close()
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("connector: creating read agent %d of %d (DecodeConfig.ReadAgents; 1 turns them off): %w", i+1, n, err)
		}
		r.readAgents = append(r.readAgents, ra)
	}
	return nil
}

// warmUpWorkers loads into the role's agent the metadata of its first read agent, and into each read agent
// the role agent's, all at once, READs a few bytes of the null block through it and forgets it again (the
// role's agents are never each other's peers). A UCX worker selects its protocols for a kind of peer (one on
// the same host: cma and tcp lanes) when it first connects to one, and for a kind of remote memory (host
// memory there) at its first READ of it, reading sysfs for every interface and protocol, which every first
// handshake paid in its loads and warm-up READs, three agents at once. The worker keeps what it selected for
// its lifetime, so once warmed a handshake with a same-host prefill pays only its own connection (make
// bench-vllm's handshake_ms; docs/measured.md).
// A peer on another host needs its own selection, which its first handshake pays. It returns how many
// agents were warmed; failures are only logged.
func (r *registered) warmUpWorkers(log *zap.Logger) int {
	if len(r.readAgents) == 0 {
		return 0
	}
	type pair struct{ loader, peer *nixl.Agent }
	pairs := []pair{{r.agent, r.readAgents[0].agent}}
	for _, ra := range r.readAgents {
		pairs = append(pairs, pair{ra.agent, r.agent})
	}
	// The first bytes of the null block (block 0 of region 0, which no request names): read from the peer's
	// registration of the cache into the loader's, the same memory, before any transfer runs.
	null := nixl.Desc{Addr: r.cache.RegionBases()[0], Len: uint64(min(r.geom.BlockLen(), 4096))}
	// Each agent is another's peer, and a read agent has no progress thread: one whose own READ is done keeps
	// progressing its worker (GetNotifications) until every READ is, so a READ of it never waits for a
	// worker nobody polls (a READ the peer must serve, over TCP or UCX's active messages).
	var warm, left atomic.Int32
	left.Store(int32(len(pairs)))
	var wg sync.WaitGroup
	for _, p := range pairs {
		wg.Go(func() {
			if err := warmUpPair(p.loader, p.peer, null); err != nil {
				log.Debug("warming up an agent's UCX worker failed; the first handshake pays its protocol selection",
					zap.String("agent", p.loader.Name()), zap.Error(err))
			} else {
				warm.Add(1)
			}
			left.Add(-1)
			for left.Load() > 0 {
				_, _ = p.loader.GetNotifications()
				poll.Sleep(10 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	return int(warm.Load())
}

// warmUpPair loads peer's metadata into loader, READs null through it (warmUpRead) and forgets it again.
func warmUpPair(loader, peer *nixl.Agent, null nixl.Desc) error {
	md, err := peer.LocalMetadata()
	if err != nil {
		return err
	}
	name, err := loader.LoadRemoteMetadata(md)
	if err != nil {
		return err
	}
	err = warmUpRead(loader, name, null)
	if ierr := loader.InvalidateRemoteMetadata(name); err == nil {
		err = ierr
	}
	return err
}

// warmUpRead READs desc from remote into the same addresses of a (warmUpWorkers), bounded by a few seconds.
func warmUpRead(a *nixl.Agent, remote string, desc nixl.Desc) error {
	x, err := a.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{desc}, nixl.DRAM, []nixl.Desc{desc}, remote)
	if err != nil {
		return err
	}
	defer x.Close()
	if _, err := x.Post(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return x.Wait(ctx)
}

// drainReadAgents progresses every read agent's worker until it reports no more work (NIXL's progress loop,
// which GetNotifications runs on an agent without a progress thread): a released request whose copies UCX
// still queues (a dead peer) is completed so, before any endpoint or worker is destroyed.
func (r *registered) drainReadAgents() {
	for _, ra := range r.readAgents {
		for range 3 {
			_, _ = ra.agent.GetNotifications()
		}
	}
}

// closeReadAgents drains and closes the read agents (before the role's agent).
func (r *registered) closeReadAgents() error {
	r.drainReadAgents()
	var errs []error
	for _, ra := range r.readAgents {
		if ra.reg != nil {
			errs = append(errs, ra.reg.Close())
		}
		errs = append(errs, ra.agent.Close())
	}
	r.readAgents = nil
	return errors.Join(errs...)
}

// readAgentNamed reports whether name is one of the role's read agents.
func (r *registered) readAgentNamed(name string) bool {
	for _, ra := range r.readAgents {
		if ra.agent.Name() == name {
			return true
		}
	}
	return false
}

// stripeLists are one read agent's prepared lists for a prefill rank.
type stripeLists struct {
	agent         *nixl.Agent
	local, remote *nixl.Prepped
}

func (s stripeLists) close() {
	if s.remote != nil {
		_ = s.remote.Close()
	}
	if s.local != nil {
		_ = s.local.Close()
	}
}

// split divides n descriptor indices into at most k contiguous stripes of nearly equal size (none empty):
// the bounds [lo, hi) of each.
func split(n, k int) [][2]int {
	k = min(k, n)
	out := make([][2]int, 0, k)
	for i := range k {
		out = append(out, [2]int{i * n / k, (i + 1) * n / k})
	}
	return out
}

// striped are the READs of a pull made on read agents (Decode.post), unposted, with the bytes each moves and
// the prefill ranks' agents to notify once all are done; posting is the longest any took to post (run).
type striped struct {
	xfers   []*nixl.Xfer
	bytes   []int64
	notify  []string
	posting time.Duration
}

// run posts every READ and polls it (stripeBackoff) on a goroutine of its own, concurrently: over UCX's cma
// the copy runs in the post and in the polls, so each read agent copies on its own core. It adds the bytes
// posted to res and records the longest post as the post phase (res.Post, st.posting), and returns the first
// error once every goroutine returned (each returns once its request is done or failed, or ctx ends).
func (st *striped) run(ctx context.Context, res *Result) error {
	errs := make([]error, len(st.xfers))
	posts := make([]time.Duration, len(st.xfers))
	var wg sync.WaitGroup
	for i, x := range st.xfers {
		wg.Go(func() {
			t := time.Now()
			_, err := x.Post()
			posts[i] = time.Since(t)
			if err != nil {
				errs[i] = err
				return
			}
			if cerr := stripeBackoff.Until(ctx, func() bool {
				var s nixl.State
				s, err = x.Status()
				return err != nil || s == nixl.Done
			}); cerr != nil {
				err = fmt.Errorf("connector: waiting for a READ stripe: %w", cerr)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	st.posting = slices.Max(posts)
	res.Post = st.posting
	for i, err := range errs {
		if err != nil {
			return err
		}
		res.Bytes += st.bytes[i]
	}
	return nil
}
