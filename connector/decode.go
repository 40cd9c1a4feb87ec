package connector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/lifetime"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// DecodeConfig configures a decode worker (one TP rank of a decode engine): the fields both roles share
// (RoleConfig, whose peers here are the prefill workers; the Cache is the one the READs land in, and a
// HostBuffered cache is copied to the device after each request), and the decode's own.
type DecodeConfig struct {
	RoleConfig
	// PeerOrder, when set, is the physical block order of the prefill side's bytes where it differs from the
	// kv_cache_layout label it publishes: a vLLM prefill worker with kv_buffer_device="cpu" in layout eras
	// A/B holds NHD bytes under an "HND" label. Bytes are copied as they are, so the local cache's order must
	// equal the peer's physical order. Left 0, the order is the label's, or layout.CPUAttn when the peer's
	// attn_backend_name (before 0.20: the hashed backend name) is "CPU_ATTN" (protocol.Profile.BackendOrder).
	PeerOrder layout.BlockOrder
	// HandshakeTimeout bounds one side-channel round trip, and the warm-up READ after a handshake. Zero:
	// sidechannel.FetchOptions' default (the profile's HandshakeTimeout, 5 s in vLLM). NewDecode refuses a
	// negative one.
	HandshakeTimeout time.Duration
	// HandshakeAttempts is how many times in all a prefill rank's metadata is asked for before a handshake
	// fails (sidechannel.FetchOptions.Attempts). Zero: sidechannel.DefaultAttempts (3). NewDecode refuses
	// a negative one.
	HandshakeAttempts int
	// ReadAgents is how many NIXL agents of its own, besides the role's, split every READ (stripes.go): each
	// registers the cache, loads the prefill metadata and polls its share of a READ on its own goroutine, so
	// a READ from a same-host peer (UCX's cma) copies on that many cores; the notification follows from the
	// role's agent once all are done. Zero: 4 for a DRAM cache with gonixl's default UCX backend
	// (DefaultBackends, ParseBackends' "UCX") on a host of two CPUs or more (more stripes than cores get a READ
	// more of a CPU that busy peers share), none otherwise (a GPU cache; explicit backends; one CPU). 1 turns
	// them off. NewDecode refuses a negative count.
	ReadAgents int
	// ReadSpin is how long the decode polls a request's READ back to back (each poll progresses it:
	// nixl.Xfer.WaitBusy) before it backs off to sleeps between polls; read agents keep their own pacing.
	// Zero: DefaultReadSpin for a cache in GPU memory, none for DRAM (where cores are what the READ's copies
	// run on). Negative: none (nixl.Xfer.Wait's 64 spins).
	ReadSpin time.Duration
}

// DefaultReadSpin is DecodeConfig.ReadSpin's default for a cache in GPU memory: longer than a demo request's
// READ takes (1–10 ms), so that it completes on the polling thread, which on a host whose idle cores wake
// slowly (a virtual machine's) would otherwise sleep and wake between polls, as UCX's progress thread would
// for each of the READ's rendezvous messages (BenchmarkDRAMToVRAM's request shapes: idle_GB/s against
// idlebusy_GB/s).
const DefaultReadSpin = 10 * time.Millisecond

// readSpin resolves DecodeConfig.ReadSpin for a cache of memory type mem.
func readSpin(cfg time.Duration, mem nixl.MemType) time.Duration {
	switch {
	case cfg < 0:
		return 0
	case cfg > 0:
		return cfg
	case mem == nixl.VRAM:
		return DefaultReadSpin
	}
	return 0
}

// check refuses what the decode's own fields cannot mean, before anything is derived or registered.
func (cfg *DecodeConfig) check() error {
	if cfg.HandshakeTimeout < 0 {
		return fmt.Errorf("connector: DecodeConfig.HandshakeTimeout is %v: set a positive duration, or 0 for the profile's", cfg.HandshakeTimeout)
	}
	if cfg.ReadAgents < 0 {
		return fmt.Errorf("connector: DecodeConfig.ReadAgents is %d: set a positive count, 1 for none, or 0 for the default", cfg.ReadAgents)
	}
	if cfg.HandshakeAttempts < 0 {
		return fmt.Errorf("connector: DecodeConfig.HandshakeAttempts is %d: set a positive count, or 0 for sidechannel.DefaultAttempts (%d)", cfg.HandshakeAttempts, sidechannel.DefaultAttempts)
	}
	return nil
}

// Decode is the decode role: it handshakes with prefill engines (once per engine, cached, redone after a
// failure), checks compatibility, and READs a request's blocks into local blocks with one NIXL request per
// prefill rank it reads (one with equal TP sizes), notifying the prefill side. Heterogeneous tensor
// parallelism follows vLLM (layout.ReadPlan): with more decode than prefill ranks each decode rank reads its
// heads' slice of one prefill rank's blocks; with more prefill ranks it fills its blocks from several.
// It is safe for concurrent use.
type Decode struct {
	cfg     DecodeConfig
	log     *zap.Logger
	metrics *Metrics
	reg     *registered
	hash    string

	hs       *handshakes             // the handshake cache (handshakes.go)
	mu       sync.Mutex              // guards closed and the pulls' Add
	agentsMu sync.Mutex              // guards agents and the NIXL loads and invalidations (remoteagents.go)
	agents   map[string]*loadedAgent // remote NIXL agents loaded, by the name their blob claims
	aliased  bool                    // loadAgent loads each blob under an alias of its own: every backend is UCX
	aliasSeq int                     // numbers the aliases
	warmed   int                     // agents whose UCX worker NewDecode warmed up (registered.warmUpWorkers)
	readSpin time.Duration           // how long a READ is polled back to back (DecodeConfig.ReadSpin, resolved)
	// loadFailures counts blobs NIXL failed to load; from maxUnprobedFailures on (always when not aliased),
	// probe checks each new blob before the role's agents load it (remoteagents.go).
	loadFailures int
	probe        *nixl.Agent
	probeSeq     int
	probeInit    chan struct{} // closed once startProbe's background creation of probe returned
	failLog      *zap.Logger   // log, sampled (failLogFirst a second, then every failLogThereafter-th)
	closed       bool          // guarded by mu: set by Close
	closeOnce    lifetime.Once
	pulls        sync.WaitGroup // in-flight Pull calls; Close waits for them
	closing      context.Context
	stop         context.CancelFunc // cancels closing: every in-flight pull's context
}

// NewDecode starts a decode worker: it resolves the config (RoleConfig: the Profile, Compat and, when Cache
// is nil, a DRAM cache that VLLMVersion and Model imply) and registers the cache.
func NewDecode(cfg DecodeConfig) (_ *Decode, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	core, err := cfg.RoleConfig.resolve(roleDecode)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			core.abandon()
		}
	}()
	var hash string
	if !cfg.Compat.SkipCheck {
		if hash, err = cfg.Profile.CompatHash(cfg.Compat.CompatInputs); err != nil {
			return nil, fmt.Errorf("connector: compatibility hash: %w", err)
		}
	}
	// A decode role serves no side channel: its data device defaults to none (RoleConfig.DataDevice).
	reg, err := core.register(&cfg.RoleConfig, fmt.Sprintf("%s-tp%d", cfg.EngineID, cfg.Rank.TP), "")
	if err != nil {
		return nil, err
	}
	n := cfg.ReadAgents
	if n == 0 {
		n = defaultReadAgents(reg.cache.MemType(), reg.sized)
	}
	if n > 1 {
		if err := reg.startReadAgents(cfg.Library, n); err != nil {
			_ = reg.close()
			return nil, err
		}
	}
	warmed := reg.warmUpWorkers(core.log)
	d := &Decode{cfg: cfg, log: core.log, metrics: core.metrics, reg: reg, hash: hash, failLog: sampled(core.log),
		agents: map[string]*loadedAgent{}, warmed: warmed, readSpin: readSpin(cfg.ReadSpin, reg.cache.MemType())}
	d.hs = newHandshakes(d.release)
	d.closing, d.stop = context.WithCancel(context.Background())
	d.aliased = allUCX(reg.backends)
	d.startProbe()
	return d, nil
}

// Cache returns the KV cache the READs land in (the one it created from the Model when RoleConfig.Cache was nil).
func (d *Decode) Cache() Cache { return d.cfg.Cache }

// Profile returns the vLLM release the role speaks.
func (d *Decode) Profile() protocol.Profile { return d.cfg.Profile }

// Agent returns the NIXL agent.
func (d *Decode) Agent() *nixl.Agent { return d.reg.agent }

// Metrics returns the role's metrics.
func (d *Decode) Metrics() *Metrics { return d.metrics }

// EngineID returns the engine id.
func (d *Decode) EngineID() string { return d.cfg.EngineID }

// Result reports one pulled request.
type Result struct {
	RequestID string
	Handshake time.Duration // 0 when the handshake was cached
	Transfer  time.Duration // post to completion of the READ
	Post      time.Duration // the part of Transfer spent posting (all of it for a READ done inline, e.g. by UCX's cma)
	Wait      time.Duration // the part of Transfer after the last post: progress and completion polls
	Copy      time.Duration // host → device copy (host-buffered caches)
	Bytes     int64
	Blocks    int
}

// GBps is the transfer's throughput in GB/s.
func (r Result) GBps() float64 {
	if r.Transfer <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Transfer.Seconds() / 1e9
}

// ErrBadParams is wrapped by errors about kv_transfer_params that cannot be served (missing fields, block
// ids out of range or not matching the local blocks); nothing is transferred.
var ErrBadParams = errors.New("connector: unusable kv_transfer_params")

// Pull READs the blocks that kv (P's kv_transfer_params) names into localBlocks (same count, in token order),
// then notifies the prefill side. Everything is validated before any transfer; ctx bounds the whole pull,
// and Close cancels it (the error then wraps nixl.ErrClosed).
func (d *Decode) Pull(ctx context.Context, requestID string, kv protocol.KVTransferParams, localBlocks []int) (Result, error) {
	res := Result{RequestID: requestID}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return res, fmt.Errorf("connector: pull %s: the decode role is closed: %w", requestID, nixl.ErrClosed)
	}
	d.pulls.Add(1) // under mu with the closed check: no Add after Close's Wait began
	d.mu.Unlock()
	defer d.pulls.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(d.closing, cancel)()
	ctx, task := trace.NewTask(ctx, "gonixl.Pull")
	defer task.End()
	trace.Log(ctx, "request_id", requestID)
	res, err := d.pull(ctx, requestID, kv, localBlocks)
	if err != nil && d.closing.Err() != nil {
		err = fmt.Errorf("%w (%w: the decode role was closed)", err, nixl.ErrClosed)
	}
	return res, err
}

func (d *Decode) pull(ctx context.Context, requestID string, kv protocol.KVTransferParams, localBlocks []int) (Result, error) {
	res := Result{RequestID: requestID}
	log := d.log.With(zap.String("request_id", requestID), zap.String("remote_engine_id", kv.RemoteEngineID),
		zap.String("remote_request_id", LocalRequestID(kv.RemoteRequestID))) // never the suffix: it is what lets a peer free the blocks
	fail := func(err error) (Result, error) {
		d.metrics.requestErrors.Add(1)
		if ce := d.failLog.Check(zap.WarnLevel, "pull failed"); ce != nil { // sampled: a flood of bad requests cannot flood the log
			ce.Write(zap.String("request_id", requestID), zap.String("remote_engine_id", kv.RemoteEngineID),
				zap.String("remote_request_id", LocalRequestID(kv.RemoteRequestID)), zap.Error(err))
		}
		return res, err
	}
	req, err := d.validate(kv, localBlocks)
	if err != nil {
		return fail(err)
	}
	r := trace.StartRegion(ctx, "gonixl.engine")
	re, hsTook, err := d.engine(ctx, req)
	r.End()
	if err != nil {
		return fail(err)
	}
	defer d.hs.put(re)
	res.Handshake = hsTook
	r = trace.StartRegion(ctx, "gonixl.prepare")
	t := time.Now()
	err = d.planPull(re, &req)
	req.planned = time.Since(t)
	r.End()
	if err != nil {
		return fail(err)
	}
	if hp := d.reg.caps.pipeline; hp != nil && re.plan.BlockSizeRatio() == 1 && len(localBlocks) > 1 {
		if readErr, copyErr := d.pullSliced(ctx, re, hp, req, &res); readErr != nil {
			d.forget(re) // pullSliced closed its requests
			return fail(req.readError(readErr))
		} else if copyErr != nil {
			return fail(copyErr)
		}
		return d.pulled(log, res, len(req.remote)), nil
	}
	if err := d.read(ctx, re, req, &res, log); err != nil {
		return fail(err)
	}
	if hb := d.reg.caps.hostBuf; hb != nil {
		r := trace.StartRegion(ctx, "gonixl.copy")
		t := time.Now()
		err := hb.CopyToDevice(ctx, localBlocks)
		res.Copy = time.Since(t)
		r.End()
		if err != nil {
			return fail(fmt.Errorf("connector: host → device copy: %w", err))
		}
		d.metrics.observe(timingCopy, res.Copy)
	}
	return d.pulled(log, res, len(req.remote)), nil
}

// read posts the request's READs and awaits them, filling res's Bytes, Transfer (post to completion) and
// Blocks. After a failure it releases the requests and drops the handshake: the peer may be gone, so the
// next request handshakes again. Other pulls may still use this engine's lists: they are closed when the
// last of them returns (put), never under a live transfer.
func (d *Decode) read(ctx context.Context, re *remoteEngine, req pullRequest, res *Result, log *zap.Logger) error {
	start := time.Now()
	xfers, st, err := d.post(ctx, re, req, res)
	defer closeXfers(st.xfers, nil)
	defer closeXfers(xfers, nil)
	if err == nil {
		r := trace.StartRegion(ctx, "gonixl.wait")
		posted := time.Now()
		err = d.await(ctx, re, req, xfers, &st, res)
		res.Wait = time.Since(posted) - st.posting
		d.metrics.observe(timingWait, res.Wait)
		r.End()
	}
	res.Transfer = time.Since(start)
	if err != nil {
		closeXfers(xfers, log) // cancel the requests before dropping the handshake
		closeXfers(st.xfers, log)
		d.reg.drainReadAgents()
		d.forget(re)
		return req.readError(err)
	}
	res.Blocks = len(req.remote)
	return nil
}

// pullRequest is one pull: checked against the request and the local cache by validate, then against the
// prefill engine's plan, and turned into descriptor indices and a notification, by planPull.
type pullRequest struct {
	kv        protocol.KVTransferParams
	local     []int  // local block ids, checked against the local cache
	remote    []int  // remote block ids, checked against the prefill engine's cache by planPull
	addr      string // the prefill engine's side channel
	prefillTP int

	localIdx, remoteIdx []int         // descriptor indices of the whole request (planPull)
	notif               []byte        // the encoded notification (planPull)
	planned             time.Duration // how long planPull took (part of the prepare phase)
}

// readError wraps a failed READ of the request.
func (r *pullRequest) readError(err error) error {
	return fmt.Errorf("connector: READ of %d blocks from %s: %w", len(r.remote), r.kv.RemoteEngineID, err)
}

// validate checks what can be checked before a handshake: kv_transfer_params' fields and the local block
// ids (against the local cache, once: nothing checks them again).
func (d *Decode) validate(kv protocol.KVTransferParams, localBlocks []int) (pullRequest, error) {
	req, err := newPullRequest(kv)
	if err != nil {
		return req, err
	}
	if err := d.reg.geom.CheckBlockIDs(localBlocks, 0); err != nil {
		return pullRequest{}, fmt.Errorf("%w: local blocks: %v", ErrBadParams, err)
	}
	req.local = localBlocks
	return req, nil
}

// newPullRequest checks kv_transfer_params' fields (what names the prefill engine, the request and its
// blocks) and returns the request they describe, without local blocks.
func newPullRequest(kv protocol.KVTransferParams) (pullRequest, error) {
	if err := kv.ValidateForDecode(); err != nil {
		return pullRequest{}, fmt.Errorf("%w: %v", ErrBadParams, err)
	}
	if len(kv.RemoteBlockIDs) != 1 {
		return pullRequest{}, fmt.Errorf("%w: %d KV-cache groups; gonixl serves models with one group", ErrBadParams, len(kv.RemoteBlockIDs))
	}
	if !validHost(kv.RemoteHost) || kv.RemotePort <= 0 || kv.RemotePort > 65535 {
		return pullRequest{}, fmt.Errorf("%w: remote_host %q / remote_port %d do not name a side channel (want an IP address or a host name, and a port 1-65535)", ErrBadParams, kv.RemoteHost, kv.RemotePort)
	}
	if kv.RemoteRequestID == "" {
		return pullRequest{}, fmt.Errorf("%w: remote_request_id is empty (the prefill side could never match the notification)", ErrBadParams)
	}
	req := pullRequest{kv: kv, prefillTP: kv.TPSize,
		addr: "tcp://" + net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(kv.RemoteHost, "["), "]"), strconv.Itoa(kv.RemotePort))}
	if req.prefillTP <= 0 {
		req.prefillTP = 1 // vLLM assumes 1 when tp_size is absent
	}
	req.remote = make([]int, len(kv.RemoteBlockIDs[0]))
	for i, v := range kv.RemoteBlockIDs[0] {
		req.remote[i] = int(v)
	}
	return req, nil
}

// engine returns the handshaken prefill engine req names, with a reference for the caller (put it back),
// after dropping a cached handshake older than the params' registration generation.
func (d *Decode) engine(ctx context.Context, req pullRequest) (*remoteEngine, time.Duration, error) {
	d.advanceGeneration(req.kv.RemoteEngineID, req.kv.RemoteRegistrationGeneration)
	return d.remote(ctx, req.kv.RemoteEngineID, req.addr, req.prefillTP, req.kv.RemoteRequestID)
}

// planPull checks the remote block ids against the handshaken prefill engine (once) and the local block
// count against the block size ratio, then computes the request's descriptor indices and notification.
func (d *Decode) planPull(re *remoteEngine, req *pullRequest) error {
	ids := req.remote
	if err := re.plan.Remote.CheckBlockIDs(ids, 0); err != nil {
		return fmt.Errorf("%w: remote block ids against the prefill engine's %d blocks: %v", ErrBadParams, re.plan.Remote.NumBlocks, err)
	}
	if r := re.plan.BlockSizeRatio(); len(req.local) != (len(ids)+r-1)/r {
		return fmt.Errorf("%w: %d remote blocks need %d local blocks (block size ratio %d), got %d", ErrBadParams,
			len(ids), (len(ids)+r-1)/r, r, len(req.local))
	}
	req.localIdx, req.remoteIdx = re.plan.AppendIndices(nil, nil, req.local, ids)
	count := re.plan.NotifsExpected()
	if d.cfg.Profile.Notif == protocol.NotifDecodeTPSize {
		count = d.cfg.TPSize
	}
	notif, err := d.cfg.Profile.EncodeNotification(protocol.Notification{RequestID: req.kv.RemoteRequestID, Count: count})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadParams, err)
	}
	req.notif = notif
	return nil
}

// post makes one READ per prefill rank read, each notifying its rank on completion, then posts them all back
// to back, and adds the bytes posted to res. A rank read through read agents (source.stripes) gets one READ
// per read agent instead, a contiguous share of the request's descriptors each, without a notification:
// those are returned in st, unposted, for await to post and poll on a goroutine each, and notify those ranks
// once all are done. It returns the requests made, posted or not (xfers and st.xfers), for the caller to close,
// and records the prepare (planPull included) and post phases.
func (d *Decode) post(ctx context.Context, re *remoteEngine, req pullRequest, res *Result) (xfers []*nixl.Xfer, st striped, err error) {
	err = d.reg.do(func() error {
		r := trace.StartRegion(ctx, "gonixl.prepare")
		t := time.Now()
		for _, src := range re.sources {
			if len(src.stripes) == 0 {
				x, err := d.reg.agent.MakeXfer(nixl.Read, src.local, req.localIdx, src.remote, req.remoteIdx, d.reg.xferOpts(req.notif)...)
				if err != nil {
					r.End()
					return err
				}
				xfers = append(xfers, x)
				continue
			}
			for i, b := range split(len(req.localIdx), len(src.stripes)) {
				sl := src.stripes[i]
				x, err := sl.agent.MakeXfer(nixl.Read, sl.local, req.localIdx[b[0]:b[1]], sl.remote, req.remoteIdx[b[0]:b[1]], d.reg.xferOpts(nil)[1:]...)
				if err != nil {
					r.End()
					return err
				}
				st.xfers, st.bytes = append(st.xfers, x), append(st.bytes, int64(b[1]-b[0])*src.pairLen)
			}
			st.notify = append(st.notify, src.agent)
		}
		d.metrics.observe(timingPrepare, req.planned+time.Since(t))
		r.End()
		if len(xfers) == 0 {
			return nil // all striped: await posts them
		}
		defer trace.StartRegion(ctx, "gonixl.post").End()
		t = time.Now()
		defer func() { res.Post = time.Since(t); d.metrics.observe(timingPost, res.Post) }()
		for i, x := range xfers { // every source unstriped (read agents serve all or none): xfers[i] reads re.sources[i]
			if _, err := x.Post(); err != nil {
				return err
			}
			res.Bytes += int64(len(req.localIdx)) * re.sources[i].pairLen
		}
		return nil
	})
	return xfers, st, err
}

// await waits for posted READs, renewing the request's lease on the prefill side meanwhile (heartbeat), then
// posts and polls the striped READs (each on its own goroutine, striped.run) and sends their notifications.
func (d *Decode) await(ctx context.Context, re *remoteEngine, req pullRequest, xfers []*nixl.Xfer, st *striped, res *Result) error {
	defer d.heartbeat(ctx, re.agents(), req.kv.RemoteRequestID, false)()
	for _, x := range xfers {
		if err := x.WaitBusy(ctx, d.readSpin); err != nil {
			return err
		}
	}
	if len(st.xfers) == 0 {
		return nil
	}
	err := d.reg.do(func() error { return st.run(ctx, res) })
	d.metrics.observe(timingPost, st.posting)
	if err != nil {
		return err
	}
	for _, agent := range st.notify {
		if err := d.reg.agent.SendNotification(agent, req.notif); err != nil {
			return fmt.Errorf("connector: notifying %s after the READ (the prefill side frees the blocks when its lease ends): %w", agent, err)
		}
	}
	return nil
}

// closeXfers releases requests (Close is idempotent), logging failures when log is set.
func closeXfers(xfers []*nixl.Xfer, log *zap.Logger) {
	for _, x := range xfers {
		if err := x.Close(); err != nil && log != nil {
			log.Warn("releasing the failed READ", zap.Error(err))
		}
	}
}

// pulled records a pulled request of blocks blocks.
func (d *Decode) pulled(log *zap.Logger, res Result, blocks int) Result {
	res.Blocks = blocks
	d.metrics.requests.Add(1)
	d.metrics.bytes.Add(res.Bytes)
	d.metrics.observe(timingTransfer, res.Transfer)
	log.Debug("pulled", zap.Int("blocks", res.Blocks), zap.Int64("bytes", res.Bytes), zap.Duration("transfer", res.Transfer), zap.Float64("gbps", res.GBps()))
	return res
}

// fetchOptions are the side-channel options of a handshake (DecodeConfig.HandshakeTimeout and
// HandshakeAttempts; their defaults are sidechannel.FetchOptions').
func (d *Decode) fetchOptions() sidechannel.FetchOptions {
	return sidechannel.FetchOptions{Timeout: d.cfg.HandshakeTimeout, Attempts: d.cfg.HandshakeAttempts, Logger: d.log}
}

// fetch asks the prefill engine's side channel for one rank's metadata and checks it (hash, engine id).
func (d *Decode) fetch(ctx context.Context, engineID, addr string, rank int) (protocol.AgentMetadata, layout.Geometry, error) {
	p := d.cfg.Profile
	reply, err := sidechannel.Fetch(ctx, p, addr, protocol.Rank{TP: rank}, d.fetchOptions())
	if err != nil {
		return protocol.AgentMetadata{}, layout.Geometry{}, fmt.Errorf("connector: handshake with %s rank %d at %s: %w", engineID, rank, addr, err)
	}
	md, err := p.OpenHandshake(reply.Payload, protocol.HandshakeCheck{LocalHash: d.hash, EnforceHash: !d.cfg.Compat.SkipCheck,
		ExpectedEngineID: engineID, LocalInputs: &d.cfg.Compat.CompatInputs})
	if err != nil {
		return md, layout.Geometry{}, fmt.Errorf("connector: handshake with %s rank %d at %s: %w", engineID, rank, addr, err)
	}
	order, err := p.ParseLayoutName(md.KVCacheLayout) // the row's names ("HND" up to 0.28, "LBHNC" from 0.29)
	if err != nil {
		return md, layout.Geometry{}, fmt.Errorf("connector: prefill engine %s rank %d: %w", engineID, rank, err)
	}
	// The bytes' format follows the peer's attention backend (attn_backend_name from 0.20; before, the hashed
	// name, which an enforced hash makes the peer's): a CPU_ATTN peer holds CPU_ATTN blocks under HND's label.
	backend := md.AttnBackendName
	if backend == "" {
		backend = backendName(p, d.cfg.Compat.CompatInputs)
	}
	cpu := d.reg.geom.Order
	if !cpu.IsCPUAttn() {
		cpu = 0
	}
	if order, err = p.BackendOrder(order, backend, cpu); err != nil {
		return md, layout.Geometry{}, fmt.Errorf("connector: prefill engine %s rank %d: %w", engineID, rank, err)
	}
	geom, err := layout.PeerGeometry(d.reg.geom, layout.Peer{
		NumBlocks:     int(md.NumBlocks),
		BlockLens:     md.BlockLens,
		BlockSize:     int(md.BlockSize),
		KVCacheLayout: md.KVCacheLayout,
		Order:         order,
		NumRegions:    len(md.KVCachesBaseAddr),
	})
	if err != nil {
		return md, geom, fmt.Errorf("connector: prefill engine %s rank %d has an incompatible KV cache: %w", engineID, rank, err)
	}
	if d.cfg.PeerOrder != 0 {
		geom.Order = d.cfg.PeerOrder
	}
	return md, geom, nil
}

// handshake fetches the metadata of the prefill ranks this decode rank reads, plans the reads (layout.ReadPlan:
// which ranks, which head slices), loads each rank's NIXL agent, prepares both descriptor lists per rank and
// warms the connection up (warmUp, warmUpNotification; remoteRequestID is the request that asked for the
// handshake).
func (d *Decode) handshake(ctx context.Context, engineID string, re *remoteEngine, remoteRequestID string) (err error) {
	dTP, dRank := d.cfg.TPSize, d.cfg.Rank.TP
	first := dRank * re.tp / dTP // the first prefill rank this rank reads, whichever TP is larger
	md, geom, err := d.fetch(ctx, engineID, re.addr, first)
	if err != nil {
		return err
	}
	total := int(d.cfg.Compat.NumKVHeads)
	if total <= 0 {
		total = d.reg.geom.NumKVHeads * dTP
	}
	if re.plan, err = layout.NewReadPlan(d.reg.geom, dTP, dRank, geom, re.tp, total); err != nil {
		return fmt.Errorf("%w: decode rank %d of %d cannot read prefill engine %s (TP %d): %v", ErrBadParams, dRank, dTP, engineID, re.tp, err)
	}
	// Our lists are local to this agent: whole-block descriptors where vLLM has K/V halves, so NIXL merges a
	// run of consecutive blocks into one descriptor per region (layout.ReadPlan.Merged).
	re.plan = re.plan.Merged()
	for _, rank := range re.plan.SourceRanks() {
		if rank != first {
			var g layout.Geometry
			if md, g, err = d.fetch(ctx, engineID, re.addr, rank); err != nil {
				return err
			}
			if g != geom {
				return fmt.Errorf("connector: prefill engine %s: rank %d's cache (%v) differs from rank %d's (%v)", engineID, rank, g, first, geom)
			}
		}
		src := &source{rank: rank, meta: md}
		re.sources = append(re.sources, src)
		if src.agent, src.agentName, err = d.loadAgent(engineID, md.AgentMetadata); err != nil {
			return fmt.Errorf("connector: loading prefill engine %s rank %d's NIXL metadata: %w", engineID, rank, err)
		}
		if err = d.checkRegions(engineID, src.agent, md, geom); err != nil {
			return err
		}
		rdescs, err := re.plan.RemoteDescs(md.KVCachesBaseAddr, uint64(md.DeviceID))
		if err != nil {
			return err
		}
		if src.remote, err = d.prepRemote(src.agent, md, nixl.DescsOf(rdescs)); err != nil {
			return fmt.Errorf("connector: preparing prefill engine %s rank %d's %d descriptors: %w", engineID, rank, len(rdescs), err)
		}
		ldescs, err := re.plan.LocalDescs(d.cfg.Cache.RegionBases(), d.cfg.Cache.DeviceID(), rank)
		if err != nil {
			return err
		}
		if len(ldescs) > 0 {
			src.pairLen = int64(ldescs[0].Len)
		}
		if err = d.reg.do(func() (err error) {
			src.local, err = d.reg.agent.Prep("", d.cfg.Cache.MemType(), nixl.DescsOf(ldescs))
			return err
		}); err != nil {
			return fmt.Errorf("connector: preparing the local descriptors for prefill rank %d: %w", rank, err)
		}
		for _, ra := range d.reg.readAgents {
			sl := stripeLists{agent: ra.agent}
			if err = d.reg.do(func() (err error) {
				if sl.remote, err = ra.agent.Prep(src.agent, src.remote.MemType(), nixl.DescsOf(rdescs)); err != nil {
					return err
				}
				sl.local, err = ra.agent.Prep("", d.cfg.Cache.MemType(), nixl.DescsOf(ldescs))
				return err
			}); err != nil {
				sl.close()
				return fmt.Errorf("connector: preparing prefill rank %d's descriptors in read agent %s: %w", rank, ra.agent.Name(), err)
			}
			src.stripes = append(src.stripes, sl)
		}
		d.warmUps(ctx, re, src)
		d.warmUpNotification(ctx, src, remoteRequestID)
		d.log.Info("handshake done", zap.String("remote_engine_id", engineID), zap.String("addr", re.addr), zap.Int("remote_rank", rank),
			zap.String("remote_agent", src.agentName), zap.String("remote_geometry", geom.String()))
	}
	return nil
}

// warmUp READs the null block (block 0, which no request names: layout.ErrNullBlock) of every region of
// src into the local null block, without a notification, so that what UCX does on a peer's first transfer
// (the endpoint's wire-up, the remote keys' unpacking, a GPU peer's IPC mappings and staging buffers) is
// done in the handshake, not in the first request's READ (the demo's first request, docs/measured.md;
// gonixl_xfer_wait_time_seconds shows it). The null block's descriptors are repeated up to warmUpDescs, so
// that NIXL's UCX thread pool hands a share to every one of its threads: each has its own UCX worker and
// endpoint to the peer, and a request that reaches a thread the warm-up missed pays that endpoint's set-up
// in its post (the demo's "post ms" column, gonixl_xfer_post_time_seconds). A failed warm-up is only
// logged: the request's own READ then reports what is wrong.
func (d *Decode) warmUp(ctx context.Context, re *remoteEngine, src *source) {
	d.warmUpWith(ctx, re, src, stripeLists{agent: d.reg.agent, local: src.local, remote: src.remote})
}

// warmUps warms up src's connection from the role's agent and from each read agent (their own endpoints),
// all at once.
func (d *Decode) warmUps(ctx context.Context, re *remoteEngine, src *source) {
	if len(src.stripes) == 0 {
		d.warmUp(ctx, re, src)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { d.warmUp(ctx, re, src) })
	for _, sl := range src.stripes {
		wg.Go(func() { d.warmUpWith(ctx, re, src, sl) })
	}
	wg.Wait()
}

// warmUpWith is warmUp through l's agent and lists.
func (d *Decode) warmUpWith(ctx context.Context, re *remoteEngine, src *source, l stripeLists) {
	defer trace.StartRegion(ctx, "gonixl.warmup").End()
	li, ri := re.plan.AppendIndices(nil, nil, []int{0}, []int{0})
	for n, want := len(li), warmUpDescs(d.reg.backends); n > 0 && len(li) < want; {
		m := min(n, want-len(li))
		li, ri = append(li, li[:m]...), append(ri, ri[:m]...)
	}
	var x *nixl.Xfer
	err := d.reg.do(func() (err error) {
		if x, err = l.agent.MakeXfer(nixl.Read, l.local, li, l.remote, ri, d.reg.xferOpts(nil)[1:]...); err != nil {
			return err
		}
		_, err = x.Post()
		return err
	})
	if err == nil {
		// Bounded like one side-channel round trip: a warm-up that stalls (a peer not progressing, a dead
		// link) must not take the first pull's whole deadline while every other pull for the engine waits.
		wctx, cancel := context.WithTimeout(ctx, d.fetchOptions().WithDefaults(d.cfg.Profile).Timeout)
		err = x.Wait(wctx)
		cancel()
	}
	if x != nil {
		if cerr := x.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		d.log.Warn("warm-up READ of the null block failed; the first request's READ sets the connection up", zap.String("agent", l.agent.Name()), zap.String("remote_agent", src.agentName), zap.Error(err))
	}
}

// warmUpNotification sends src a lease heartbeat for the request that asked for the handshake, where the
// profile has leases: the first notification to a peer sets up what UCX needs to send NIXL's notifications
// (an active message) to it, which the warm-up READ, sent without one, does not, and the first request's
// READ, whose notification goes out after its data, would otherwise pay it in its wait (the demo's first
// request, docs/measured.md). A heartbeat is what vLLM's decode worker sends for a waiting request: it only
// renews that request's lease. Rows without leases have no notification a prefill worker ignores (vLLM
// logs one for an unknown request as an error), so there the first request pays it.
func (d *Decode) warmUpNotification(ctx context.Context, src *source, remoteRequestID string) {
	p := d.cfg.Profile
	if !p.Leases || p.HeartbeatInterval <= 0 {
		return
	}
	msg, err := p.EncodeHeartbeat([]string{remoteRequestID})
	if err == nil {
		defer trace.StartRegion(ctx, "gonixl.heartbeat").End()
		if err = d.reg.agent.SendNotification(src.agent, msg); err == nil {
			d.metrics.heartbeats.Add(1)
		}
	}
	if err != nil {
		d.log.Warn("warm-up heartbeat failed; the first request's notification sets it up", zap.String("remote_agent", src.agentName), zap.Error(err))
	}
}

// prepRemote prepares a prefill rank's descriptors in the memory type its metadata names (DRAM when it names
// none; VRAM is tried too, for a GPU prefill worker of a vLLM version that does not say).
func (d *Decode) prepRemote(agent string, md protocol.AgentMetadata, descs []nixl.Desc) (*nixl.Prepped, error) {
	pl, err := d.reg.agent.Prep(agent, regionMem(md), descs)
	if err != nil && len(md.RegionMemTypes) == 0 {
		if pl2, err2 := d.reg.agent.Prep(agent, nixl.VRAM, descs); err2 == nil {
			return pl2, nil
		}
	}
	return pl, err
}

// Close cancels in-flight pulls and waits for them to return (each returns promptly once its context is
// cancelled: transfers are released, handshakes abandoned), then releases the remote and local descriptor
// lists, the registration and the agent. Pulls after Close fail with an error wrapping nixl.ErrClosed.
// The first Close returns the first error it met; later ones return nil (see the package doc).
func (d *Decode) Close() error {
	return d.closeOnce.Close(func() error {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
		remotes := d.hs.close()
		d.stop()
		d.pulls.Wait()
		for _, re := range remotes {
			d.hs.put(re) // the cache's reference; no pull holds one any more
		}
		d.closeProbe()
		return d.reg.close()
	})
}
