package connector

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/trace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/blockhash"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/lifetime"
	"github.com/gonixl/gonixl/internal/poll"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// PrefillConfig configures a prefill worker (one TP rank of a prefill engine): the fields both roles share
// (RoleConfig, whose peers here are the decode workers), and the prefill's own.
type PrefillConfig struct {
	RoleConfig
	// Host is the side-channel host: it binds there and advertises it as remote_host. Empty: "127.0.0.1"
	// (localhost unless told otherwise); use a routable address across nodes.
	Host string
	// Port is the side-channel port (remote_port); 0 picks a free port. vLLM's default is Profile.SideChannelPort.
	Port int
	// KVCacheLayout is the kv_cache_layout label published in the handshake, one of the profile's names
	// (Profile.Labels: "HND"/"NHD" up to vLLM 0.28, "LBHNC"/"LBNHC" from 0.29); "" publishes the profile's name
	// for the cache's physical block order (Profile.LayoutName). vLLM compares labels, not bytes, and a vLLM
	// decode worker with kv_buffer_device="cpu" in layout eras A/B (e.g. 0.16) holds NHD bytes under its device
	// label (usually "HND"): serve it with an NHD cache (Geometry.Order) and KVCacheLayout "HND"
	// (Profile.LabelQuirks lists the known cases).
	KVCacheLayout string
	// SideChannel, when set, is a side channel shared by the workers of one engine (vLLM serves every TP rank
	// of an engine on one port): the role publishes its rank's payload there and withdraws it on Close, but
	// neither binds nor closes it. Host and Port are then ignored. Nil: the role binds its own on Host:Port.
	SideChannel *sidechannel.Server
	// NotifyFrom, when set, lists the remote NIXL agents whose notifications (transfer completions,
	// heartbeats) are honoured: exact agent names, or prefixes ending in "*" (gonixl decode agents are named
	// "<engine id>-tp<rank>"). Others are dropped, counted (Metrics.RejectedNotifications) and logged. The
	// name is the one the sending agent chose, so this is a second fence only: what stops a peer without a
	// request's params from freeing or extending its blocks is the unguessable suffix of the
	// remote_request_id Hold hands out, which every notification must carry. Empty: every agent, as vLLM does.
	NotifyFrom []string
	// NotifyKey keys the unguessable suffix of the remote_request_id Hold hands out (HMAC-SHA256 of the
	// request id). The ranks of one engine must hand out the same id for a request, as vLLM's one scheduler
	// does: ranks sharing a SideChannel server share a key automatically; ranks in separate processes must
	// be given the same secret key here (at least 16 random bytes). Empty: a random key.
	NotifyKey []byte
	// HoldTimeout overrides how long unread blocks are held: the profile's lease (renewed by heartbeats) or
	// abort timeout when 0. A negative value is refused (it would free the blocks before any peer reads them).
	HoldTimeout time.Duration
	// PrefixCache, when set, keeps prompts' full blocks cached under vLLM's block hashes after their decode
	// peers have read them, so that HoldTokens serves a shared prefix from them. Nil: no reuse; every block
	// goes back to the pool when its request is done.
	PrefixCache *PrefixCacheConfig
	// KVEvents, when set, publishes the prefix cache's changes as vLLM's KV events for KV-aware routers; it
	// needs PrefixCache. Nil: none.
	KVEvents *KVEventsConfig
	// BusyPoll is how long the role's loop sleeps between its polls of NIXL (progress and notifications)
	// while blocks are held, that is while a decode peer may be reading them: a READ into a peer's GPU
	// memory over UCX, or over TCP, advances only as this side progresses. 0: the loop polls back to back,
	// yielding the processor once a millisecond, so one core is busy while any block is held (as NIXL's own
	// progress thread is at its default delay). A positive value sleeps that long (plus the kernel's timer
	// slack) and spares the core at a cost to READs into GPU memory that scripts/gpu-perreq.sh measures
	// (VARIANTS=poll50:-prefill-busy-poll=50us; docs/measured.md, "the prefill loop polling back to back").
	// Negative is refused. With nothing held the loop wakes for new holds and otherwise polls once a
	// millisecond.
	BusyPoll time.Duration

	// clock replaces time.Now for holds, leases and expiry (tests inject a fake clock); nil = time.Now.
	clock func() time.Time
	// idlePoll replaces idlePoll, the loop's interval while nothing is held (tests: an hour shows that a hold
	// wakes the loop); 0 = idlePoll.
	idlePoll time.Duration
}

// check refuses what the prefill's own fields cannot mean, before anything is derived or registered.
func (cfg *PrefillConfig) check() error {
	if cfg.BusyPoll < 0 {
		return fmt.Errorf("connector: PrefillConfig.BusyPoll is %v: set 0 to poll back to back while blocks are held, or a positive interval", cfg.BusyPoll)
	}
	if cfg.HoldTimeout < 0 {
		return fmt.Errorf("connector: PrefillConfig.HoldTimeout is %v: set a positive duration, or 0 for the profile's lease or abort timeout", cfg.HoldTimeout)
	}
	if n := len(cfg.NotifyKey); n > 0 && n < minNotifyKey {
		return fmt.Errorf("connector: PrefillConfig.NotifyKey has %d bytes: give at least %d random bytes (the same on every rank of the engine)", n, minNotifyKey)
	}
	if cfg.TPSize > 1 && cfg.SideChannel == nil && len(cfg.NotifyKey) == 0 {
		// Ranks in separate processes would each draw a random key, and every rank but the one whose
		// remote_request_id the decode echoes would drop its notifications as forged (blocks held to expiry).
		return fmt.Errorf("connector: PrefillConfig.TPSize is %d with no shared SideChannel: set NotifyKey to the same secret (at least %d random bytes) on every rank, or share one sidechannel.Server between the ranks of one process", cfg.TPSize, minNotifyKey)
	}
	return nil
}

// Prefill is the prefill role: it owns a registered KV cache, serves the side channel, and for each request
// fills blocks and holds them for the decode peer (Hold), and frees them when the peer's notifications
// arrive or the lease / abort timeout passes. It is safe for concurrent use.
type Prefill struct {
	cfg     PrefillConfig
	log     *zap.Logger
	metrics *Metrics
	reg     *registered
	pool    *BlockPool
	prefix  *prefixState        // nil without PrefillConfig.PrefixCache
	server  *sidechannel.Server // owned side channel
	shared  *sidechannel.Server // or one shared by the engine's workers
	payload []byte
	// notifyKey keys the suffix of the remote_request_ids handed out (notifauth.go).
	notifyKey []byte
	hold      time.Duration
	port      int
	now       func() time.Time // the clock of holds and leases
	passes    atomic.Int64     // expiry passes of the loop (tests wait for one)
	// generation is remote_registration_generation (vLLM 0.33+): 1 for the first registration of the cache,
	// bumped by Reregister. hash is the compatibility hash the payload carries.
	generation atomic.Int64
	hash       string
	regMu      sync.Mutex // serialises Reregister and the deregistration in Close
	regClosed  bool       // guarded by regMu

	// busy wakes the loop out of its idle interval when a request becomes held (capacity 1): a decode peer
	// starts reading as soon as it has the params, and the loop must be progressing by then.
	busy chan struct{}

	mu      sync.Mutex
	held    map[string]*heldReq
	pending map[string]bool // ids being prefilled (claimed, not yet held)
	stopped bool            // set by Close: Hold fails with nixl.ErrClosed

	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed lifetime.Once
}

type heldReq struct {
	id       string
	blocks   []int
	expected int // notifications still expected; 0 until the first one tells how many
	got      int
	expiry   time.Time
	bytes    int64
	token    string    // the unguessable suffix of the remote_request_id handed out (notifauth.go)
	since    time.Time // when the request was published (wall clock, for gonixl_held_time_seconds)
}

// randomID is prefix and 16 random hex digits (RoleConfig.EngineID's default).
func randomID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// NewPrefill starts a prefill worker: it resolves the config (RoleConfig: the Profile, Compat and, when Cache
// is nil, a DRAM cache that VLLMVersion and Model imply), registers the cache, publishes the rank's handshake
// on the side channel and starts the notification loop.
func NewPrefill(cfg PrefillConfig) (_ *Prefill, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	core, err := cfg.RoleConfig.resolve(rolePrefill)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			core.abandon()
		}
	}()
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.SideChannel != nil {
		if h, _, err := net.SplitHostPort(cfg.SideChannel.Addr()); err == nil {
			cfg.Host = h
		}
	}
	// What the handshake publishes, checked before anything is registered.
	if cfg.KVCacheLayout != "" {
		if _, err := cfg.Profile.ParseLayoutName(cfg.KVCacheLayout); err != nil {
			return nil, fmt.Errorf("connector: PrefillConfig.KVCacheLayout: %w", err)
		}
	}
	backend := backendName(cfg.Profile, cfg.Compat.CompatInputs)
	if err := checkBackendOrder(cfg.Profile, backend, cfg.Cache.Geometry().Order); err != nil {
		return nil, err
	}
	hash, err := cfg.Profile.CompatHash(cfg.Compat.CompatInputs)
	if err != nil {
		return nil, fmt.Errorf("connector: compatibility hash: %w", err)
	}
	log := core.log
	if js, err := cfg.Profile.FactorsJSON(cfg.Compat.CompatInputs); err == nil {
		log.Info("compatibility hash", zap.String("hash", hash), zap.String("inputs", js))
	}
	reg, err := core.register(&cfg.RoleConfig, fmt.Sprintf("%s-pp%d-tp%d", cfg.EngineID, cfg.Rank.PP, cfg.Rank.TP), cfg.Host)
	if err != nil {
		return nil, err
	}
	// vLLM's scheduler counts registrations from 0 and bumps the count when it publishes a changed handshake
	// payload, so its first kv_transfer_params carry remote_registration_generation 1.
	p := &Prefill{cfg: cfg, log: log, metrics: core.metrics, reg: reg, held: map[string]*heldReq{}, pending: map[string]bool{},
		notifyKey: notifyKey(cfg), hash: hash, shared: cfg.SideChannel, hold: holdTimeout(cfg), busy: make(chan struct{}, 1)}
	p.generation.Store(1)
	p.pool = NewBlockPool(reg.geom.NumBlocks)
	if p.prefix, err = newPrefixState(cfg, reg.geom, p.pool, p.metrics, log); err != nil {
		reg.close()
		return nil, err
	}
	closePrefix := func() {
		if p.prefix != nil {
			_ = p.prefix.close()
		}
	}
	p.now = cfg.clock
	if p.now == nil {
		p.now = time.Now
	}
	payload, err := p.handshakePayload()
	if err != nil {
		closePrefix()
		reg.close()
		return nil, err
	}
	p.payload = payload
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	srv := cfg.SideChannel
	if srv != nil {
		srv.SetPayload(cfg.Rank, payload)
	} else {
		srv, err = sidechannel.NewServer(ctx, cfg.Profile, sidechannel.ServerConfig{
			Host:     cfg.Host,
			Port:     cfg.Port,
			Payloads: map[protocol.Rank][]byte{cfg.Rank: payload},
			Logger:   log,
		})
		if err != nil {
			cancel()
			closePrefix()
			reg.close()
			return nil, fmt.Errorf("connector: side channel on %s:%d: %w", cfg.Host, cfg.Port, err)
		}
		p.server = srv // owned
	}
	p.port = srv.Port()
	p.wg.Add(1)
	go func() {
		ran := false
		err := p.reg.do(func() error { ran = true; p.loop(ctx); return nil })
		if !ran {
			p.log.Warn("the notification loop runs without the device context (reads into a GPU on this host may fall back to a slow path)", zap.Error(err))
			p.loop(ctx)
		}
	}()
	log.Info("prefill worker ready", zap.String("side_channel", srv.Endpoint()), zap.String("vllm_profile", cfg.Profile.Name),
		zap.String("geometry", reg.geom.String()), zap.String("nixl_agent", reg.agent.Name()))
	return p, nil
}

// holdTimeout is how long the role holds unread blocks: PrefillConfig.HoldTimeout, else the profile's lease
// (renewed by heartbeats) or abort timeout.
func holdTimeout(cfg PrefillConfig) time.Duration {
	switch {
	case cfg.HoldTimeout > 0:
		return cfg.HoldTimeout
	case cfg.Profile.Leases:
		return cfg.Profile.LeaseDuration
	}
	return cfg.Profile.AbortTimeout
}

// handshakePayload encodes the rank's handshake as the side channel serves it: the NIXL agent metadata of the
// registered cache, the published backend name and layout label, under the compatibility hash. NewPrefill and
// Reregister publish it.
func (p *Prefill) handshakePayload() ([]byte, error) {
	md, err := buildMetadata(p.cfg.Profile, p.cfg.EngineID, p.reg)
	if err != nil {
		return nil, err
	}
	md.AttnBackendName = p.publishedBackend()
	if p.cfg.KVCacheLayout != "" {
		md.KVCacheLayout = p.cfg.KVCacheLayout
	}
	payload, err := p.cfg.Profile.EncodeHandshake(p.hash, md)
	if err != nil {
		return nil, fmt.Errorf("connector: encoding the handshake: %w", err)
	}
	return payload, nil
}

// sideChannel is the server the role publishes on: its own, or the engine's shared one.
func (p *Prefill) sideChannel() *sidechannel.Server {
	if p.server != nil {
		return p.server
	}
	return p.shared
}

// checkBackendOrder refuses a prefill cache whose block format is not the one a vLLM decode engine expects from
// the backend name the handshake publishes: CPU_ATTN's format under "CPU_ATTN", the label's order otherwise (a
// vLLM CPU decode repacks a non-CPU_ATTN peer's standard blocks; it would repack CPU_ATTN blocks into garbage).
func checkBackendOrder(p protocol.Profile, backend string, order layout.BlockOrder) error {
	want, err := p.BackendOrder(order.LabelOrder(), backend, order)
	if err != nil {
		return fmt.Errorf("connector: %w", err)
	}
	if want != order {
		return fmt.Errorf("%w: the cache's blocks are %v but the handshake publishes attn_backend_name %q, whose vLLM peers read %v "+
			"(state the model's AttnBackend and leave Model.Order to it: \"CPU_ATTN\" stages layout.CPUAttn)",
			layout.ErrInvalidGeometry, order, backend, want)
	}
	return nil
}

// checkPlan refuses a cache whose region plan is not the profile's layout era (the decode peer would compute
// other descriptor indices and read the wrong bytes).
func checkPlan(p protocol.Profile, c Cache) error {
	if c == nil {
		return errors.New("connector: nil cache")
	}
	want, err := planFor(p)
	if err != nil {
		return err
	}
	if got := c.Geometry().Plan; got != want {
		return fmt.Errorf("connector: cache region plan %v does not match vLLM %s's layout era %v (plan %v)", got, p.Name, p.Layout, want)
	}
	return nil
}

// EngineID returns the engine id.
func (p *Prefill) EngineID() string { return p.cfg.EngineID }

// Cache returns the KV cache the role serves (the one it created from the Model when RoleConfig.Cache was nil).
func (p *Prefill) Cache() Cache { return p.cfg.Cache }

// Profile returns the vLLM release the role speaks.
func (p *Prefill) Profile() protocol.Profile { return p.cfg.Profile }

// Port returns the side-channel port (remote_port).
func (p *Prefill) Port() int { return p.port }

// Agent returns the NIXL agent.
func (p *Prefill) Agent() *nixl.Agent { return p.reg.agent }

// Metrics returns the role's metrics.
func (p *Prefill) Metrics() *Metrics { return p.metrics }

// FillFunc puts a request's KV into the cache at the given block ids (in token order) and returns only when
// every block is complete.
type FillFunc func(ctx context.Context, blockIDs []int) error

// ErrDuplicateRequest is wrapped by Hold's error for a request id that is already being prefilled or held
// for a decode peer (HTTP servers answer 409).
var ErrDuplicateRequest = errors.New("connector: duplicate request id")

// Hold runs one prefill request: it takes blocks for numTokens tokens, calls fill to put the KV there (Neuron
// staging, a CPU computation, …), holds the blocks for the decode peer and returns the kv_transfer_params of
// vLLM's prefill response. The blocks stay held (Held counts such requests) until the decode peers'
// notifications arrive, the hold lapses (PrefillConfig.HoldTimeout) or Abort. On any error the blocks are freed
// and nothing is published. A request id already in use fails with ErrDuplicateRequest; when the role's block
// pool has too few free blocks the error wraps ErrNoBlocks; after Close it wraps nixl.ErrClosed. The role owns allocation and the hold clock: fill
// only writes blocks.
func (p *Prefill) Hold(ctx context.Context, requestID string, numTokens int, fill FillFunc) (protocol.KVTransferParams, error) {
	var pf PrefixFillFunc
	if fill != nil {
		pf = func(ctx context.Context, blocks []int, _ int) error { return fill(ctx, blocks) }
	}
	return p.holdRequest(ctx, requestID, numTokens, nil, "", pf)
}

// holdRequest is Hold and HoldTokens: tokens is nil for Hold, whose blocks are never cache hits.
func (p *Prefill) holdRequest(ctx context.Context, requestID string, numTokens int, tokens []int64, salt string, fill PrefixFillFunc) (protocol.KVTransferParams, error) {
	log := p.log.With(zap.String("request_id", requestID))
	if requestID == "" || numTokens <= 0 {
		return protocol.KVTransferParams{}, fmt.Errorf("connector: prefill needs a request id and at least one token (got %q, %d)", requestID, numTokens)
	}
	// Claim the id for the whole prefill, so that two overlapping prefills of one id cannot both publish
	// (the second would overwrite the first's held entry and leak its blocks).
	p.mu.Lock()
	_, dup := p.held[requestID]
	dup = dup || p.pending[requestID]
	if !dup && !p.stopped {
		p.pending[requestID] = true
	}
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		return protocol.KVTransferParams{}, fmt.Errorf("connector: request %q: the prefill role is closed: %w", requestID, nixl.ErrClosed)
	}
	if dup {
		return protocol.KVTransferParams{}, fmt.Errorf("%w: request %q is already being prefilled or held for a decode peer", ErrDuplicateRequest, requestID)
	}
	unclaim := func() {
		p.mu.Lock()
		delete(p.pending, requestID)
		p.mu.Unlock()
	}
	blocks, hashes, hits, err := p.alloc(p.reg.geom.NeededBlocks(numTokens), tokens, salt)
	if err != nil {
		unclaim()
		p.metrics.requestErrors.Add(1)
		return protocol.KVTransferParams{}, fmt.Errorf("connector: request %q, %d tokens: %w", requestID, numTokens, err)
	}
	start := time.Now()
	if fill != nil {
		r := trace.StartRegion(ctx, "gonixl.stage")
		err := fill(ctx, blocks, hits)
		r.End()
		if err != nil {
			p.free(blocks)
			unclaim()
			p.metrics.requestErrors.Add(1)
			log.Warn("prefill fill failed; blocks freed", zap.Error(err))
			return protocol.KVTransferParams{}, err
		}
	}
	p.metrics.observe(timingStage, time.Since(start))
	if p.prefix != nil {
		if err := p.prefix.commit(blocks, hashes, hits, tokens, salt); err != nil {
			p.free(blocks)
			unclaim()
			p.metrics.requestErrors.Add(1)
			return protocol.KVTransferParams{}, fmt.Errorf("connector: request %q: prefix cache: %w", requestID, err)
		}
	}
	bytes := int64(len(blocks)) * p.reg.geom.BlockLen() * int64(p.reg.geom.NumRegions())
	p.mu.Lock()
	delete(p.pending, requestID)
	if p.stopped { // Close ran during the fill: nothing serves the blocks any more
		p.mu.Unlock()
		p.free(blocks)
		return protocol.KVTransferParams{}, fmt.Errorf("connector: request %q: the prefill role was closed during the fill: %w", requestID, nixl.ErrClosed)
	}
	token := p.notifToken(requestID)
	p.held[requestID] = &heldReq{id: requestID, blocks: blocks, expiry: p.now().Add(p.hold), bytes: bytes, token: token,
		since: time.Now()}
	p.mu.Unlock()
	select { // the loop, idle, would notice the hold only at its next tick (up to idlePoll)
	case p.busy <- struct{}{}:
	default:
	}
	p.metrics.requests.Add(1)
	p.metrics.bytes.Add(bytes)
	p.metrics.blocksHeld.Add(int64(len(blocks)))
	ids := make([]int64, len(blocks))
	for i, b := range blocks {
		ids[i] = int64(b)
	}
	kv := protocol.KVTransferParams{
		DoRemotePrefill: true,
		RemoteBlockIDs:  protocol.BlockIDs{ids},
		RemoteEngineID:  p.cfg.EngineID,
		// A notification must carry the suffix to free or extend the blocks (notifauth.go).
		RemoteRequestID: requestID + remoteIDSep + token,
		RemoteHost:      p.cfg.Host,
		RemotePort:      p.port,
		TPSize:          p.cfg.TPSize,
		DCPSize:         1,
		PPSize:          1,
		RemoteNumTokens: int64(numTokens),
		TransferMode:    "pull",
		// vLLM 0.33's value; sent on the rows whose ParamsKeys have it.
		RemoteRegistrationGeneration: p.generation.Load(),
		// P's prefix-cache hits (vLLM 0.31+ sends prefill_stats.num_cached_tokens): HoldTokens' hits, else 0
		// (a caller with its own prefix cache sets the field before returning the params).
		RemotePrefillCachedTokens: int64(hits * p.reg.geom.BlockSize),
	}
	log.Debug("blocks held for decode", zap.Int("blocks", len(blocks)), zap.Int("tokens", numTokens), zap.Duration("hold", p.hold))
	return kv, nil
}

// Abort frees a held request's blocks now (e.g. the client went away). It reports whether it was held.
func (p *Prefill) Abort(requestID string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.held[requestID]
	if h == nil {
		return false
	}
	delete(p.held, requestID)
	p.release(h)
	return true
}

// Held returns how many requests are held for decode peers.
func (p *Prefill) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// release gives a held request's blocks back and updates the gauge. Callers hold p.mu and have removed h
// from p.held, so Held() == 0 implies every block is back and counted.
func (p *Prefill) release(h *heldReq) {
	p.free(h.blocks)
	p.metrics.blocksHeld.Add(-int64(len(h.blocks)))
}

// alloc takes a request's blocks: from the prefix cache when there is one (cached prefix first), else from
// the pool. hashes are the prompt's full-block hashes (prefix cache and tokens only), hits the cached blocks.
func (p *Prefill) alloc(need int, tokens []int64, salt string) (blocks []int, hashes []blockhash.Hash, hits int, err error) {
	if p.prefix != nil {
		return p.prefix.alloc(need, tokens, salt)
	}
	blocks, err = p.pool.Alloc(need)
	return blocks, nil, 0, err
}

// free drops a request's hold of blocks from alloc.
func (p *Prefill) free(blocks []int) {
	if p.prefix != nil {
		p.prefix.release(blocks)
		return
	}
	p.pool.Free(blocks)
}

// Progress intervals of the prefill loop: while blocks are held a decode peer may be reading them, and a
// target over TCP (or feeding UCX's GPU pipeline) serves those reads only when it progresses
// (PrefillConfig.BusyPoll); idle, it only has handshakes to answer. A new hold wakes the idle loop at once
// (Prefill.busy). A positive BusyPoll is slept with poll.Sleep: a Go timer of 50 µs lasts many times
// longer on the hosts measured (internal/poll's BenchmarkSleep, x_timer; docs/measured.md, "Per-request
// cost (issue 25)").
const (
	idlePoll = time.Millisecond
	// busyYield: polling back to back, the loop yields the processor at most this often. It runs locked to
	// its OS thread where it holds a device context, and there a yield at every poll left tens of
	// microseconds between polls (internal/poll's BenchmarkGosched, x_unlocked).
	busyYield = time.Millisecond
	// expiryPeriod is how often the loop frees the requests whose hold lapsed (on the role's clock).
	expiryPeriod = 50 * time.Millisecond
)

// Log lines about what any peer with the agent metadata can send (notifications from agents outside
// NotifyFrom, for requests not held, with a forged suffix) are sampled by their counter: the first
// peerLogFirst, then every peerLogEvery-th, so a flood cannot flood the log.
const (
	peerLogFirst = 10
	peerLogEvery = 1000
)

// logPeerLine reports whether the n-th such event (counted from 1) is logged.
func logPeerLine(n int64) bool { return n <= peerLogFirst || n%peerLogEvery == 0 }

// loop drives the agent's progress, drains NIXL notifications (completions and heartbeats) and frees expired
// requests.
func (p *Prefill) loop(ctx context.Context) {
	defer p.wg.Done()
	idle := cmp.Or(p.cfg.idlePoll, idlePoll)
	t := time.NewTimer(idle)
	defer t.Stop()
	lastExpiry := p.now()
	lastYield := time.Now()
	busy := false
	for {
		if busy {
			if p.cfg.BusyPoll > 0 {
				poll.Sleep(p.cfg.BusyPoll)
			} else if now := time.Now(); now.Sub(lastYield) >= busyYield {
				runtime.Gosched()
				lastYield = now
			}
			if ctx.Err() != nil {
				return
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-p.busy: // Reset below (or the busy branch) replaces the pending tick (Go 1.23 timers)
			}
		}
		if busy = p.Held() > 0; !busy {
			t.Reset(idle)
		}
		ns, err := p.reg.agent.GetNotifications()
		if err != nil {
			if errors.Is(err, nixl.ErrClosed) {
				return
			}
			p.log.Warn("reading NIXL notifications failed", zap.Error(err))
		}
		for _, n := range ns {
			p.handleNotification(n)
		}
		if now := p.now(); now.Sub(lastExpiry) >= expiryPeriod {
			lastExpiry = now
			p.expire(now)
			p.passes.Add(1)
		}
	}
}

// notifyAllowed reports whether a notification from agent is honoured (PrefillConfig.NotifyFrom).
func (p *Prefill) notifyAllowed(agent string) bool {
	if len(p.cfg.NotifyFrom) == 0 {
		return true
	}
	for _, a := range p.cfg.NotifyFrom {
		if prefix, ok := strings.CutSuffix(a, "*"); ok && strings.HasPrefix(agent, prefix) || a == agent {
			return true
		}
	}
	return false
}

func (p *Prefill) handleNotification(raw nixl.Notification) {
	if !p.notifyAllowed(raw.Agent) {
		// Sampled (logPeerLine): a peer flooding such notifications cannot flood the log.
		if n := p.metrics.rejectedNotifications.Add(1); logPeerLine(n) {
			p.log.Warn("notification from an agent outside NotifyFrom dropped", zap.String("from", raw.Agent),
				zap.Int("msg_bytes", len(raw.Msg)), zap.Int64("rejected_so_far", n))
		}
		return
	}
	n, err := p.cfg.Profile.DecodeNotification(raw.Msg)
	if err != nil {
		p.metrics.badMessages.Add(1)
		p.log.Warn("ignoring malformed notification", zap.String("from", raw.Agent), zap.ByteString("msg", raw.Msg), zap.Error(err))
		return
	}
	if n.IsHeartbeat() {
		p.metrics.heartbeats.Add(1)
		ext := p.leaseExtension()
		var forged []string
		p.mu.Lock()
		for _, id := range n.Heartbeat {
			h, bad := p.heldFor(id)
			if bad {
				forged = append(forged, id)
			}
			if h != nil {
				if e := p.now().Add(ext); e.After(h.expiry) {
					h.expiry = e
				}
			}
		}
		p.mu.Unlock()
		for _, id := range forged {
			p.forged(raw.Agent, id, true)
		}
		return
	}
	p.metrics.notifications.Add(1)
	trace.Log(context.Background(), "gonixl.notification", LocalRequestID(n.RequestID))
	p.mu.Lock()
	h, forged := p.heldFor(n.RequestID)
	if h == nil {
		p.mu.Unlock()
		if forged {
			p.forged(raw.Agent, n.RequestID, false)
			return
		}
		// Rate-limited like the forgeries: anyone with the agent metadata can send these.
		if b := p.metrics.badMessages.Add(1); logPeerLine(b) {
			p.log.Warn("notification for a request that is not held (already freed, expired, or unknown)",
				zap.String("request_id", LocalRequestID(n.RequestID)), zap.String("from", raw.Agent), zap.Int64("bad_so_far", b))
		}
		return
	}
	log := p.log.With(zap.String("request_id", h.id), zap.String("from", raw.Agent))
	if h.expected == 0 {
		exp, err := p.cfg.Profile.ExpectedNotifications(n, p.cfg.TPSize)
		if err != nil || exp < 1 {
			exp = 1
		}
		h.expected = exp
	}
	h.got++
	done := h.got >= h.expected
	if done {
		delete(p.held, h.id)
		p.release(h)
		p.metrics.blocksFreed.Add(int64(len(h.blocks)))
	}
	p.mu.Unlock()
	if done {
		p.metrics.observe(timingHeld, time.Since(h.since))
		log.Debug("decode peer finished reading; blocks freed", zap.Int("blocks", len(h.blocks)))
	}
}

// leaseExtension is how far a heartbeat pushes a lease: vLLM's kv_lease_duration·2/3, where HoldTimeout (when
// set) plays kv_lease_duration, so a shortened hold is not stretched to the default 20 s by one heartbeat.
func (p *Prefill) leaseExtension() time.Duration {
	pr := p.cfg.Profile
	if pr.LeaseExtension <= 0 || pr.LeaseDuration <= 0 {
		return p.hold
	}
	return time.Duration(float64(p.hold) * (float64(pr.LeaseExtension) / float64(pr.LeaseDuration)))
}

func (p *Prefill) expire(now time.Time) {
	var gone []*heldReq
	p.mu.Lock()
	for id, h := range p.held {
		if now.After(h.expiry) {
			gone = append(gone, h)
			delete(p.held, id)
			p.release(h)
			p.metrics.blocksExpired.Add(int64(len(h.blocks)))
			p.metrics.requestsExpired.Add(1)
		}
	}
	p.mu.Unlock()
	for _, h := range gone {
		p.log.Warn("decode peer never confirmed reading; blocks freed at expiry",
			zap.String("request_id", h.id), zap.Int("blocks", len(h.blocks)), zap.Duration("held_for", p.hold))
	}
}

// Close stops the side channel and the notification loop, deregisters the cache and closes the agent, then
// returns the blocks still held for decode peers to the pool. The first Close returns the first error it met;
// later ones return nil (see the package doc).
func (p *Prefill) Close() error {
	return p.closed.Close(func() (err error) {
		p.cancel()
		if p.shared != nil {
			p.shared.SetPayload(p.cfg.Rank, nil)
		}
		if p.server != nil {
			err = p.server.Close()
		}
		p.wg.Wait()
		p.regMu.Lock()
		p.regClosed = true
		if cerr := p.reg.close(); err == nil {
			err = cerr
		}
		p.regMu.Unlock()
		// The cache is deregistered and the agent gone, so no decode peer can read the held blocks any more:
		// give them back to the pool.
		p.mu.Lock()
		p.stopped = true
		held := p.held
		p.held = map[string]*heldReq{}
		for _, h := range held {
			p.release(h)
		}
		p.mu.Unlock()
		if p.prefix != nil { // every block is released: evict the cache, AllBlocksCleared, close the publisher
			if cerr := p.prefix.close(); err == nil {
				err = cerr
			}
		}
		p.log.Info("prefill worker closed", zap.Int("dropped_requests", len(held)))
		return err
	})
}
