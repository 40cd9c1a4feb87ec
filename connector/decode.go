package connector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// DecodeConfig configures a decode worker (one TP rank of a decode engine).
type DecodeConfig struct {
	// Profile is the vLLM version the prefill peers run.
	Profile protocol.Profile
	// Library is the loaded NIXL.
	Library *nixl.Library
	// Cache is the local KV cache the READs land in (DRAM, or VRAM; HostBuffered caches are copied to the
	// device after each request).
	Cache Cache
	// EngineID identifies this engine; default: a random id.
	EngineID string
	// Backends is the NIXL backend list (default UCX).
	Backends []nixl.BackendSpec
	// TPRank and TPSize are this worker's TP rank and its engine's TP size (default 1).
	TPRank, TPSize int
	// Compat holds the compatibility-hash inputs and the opt-out (SkipCheck).
	Compat Compat
	// HandshakeTimeout bounds one side-channel round trip (default: the profile's, 5 s in vLLM).
	HandshakeTimeout time.Duration
	// HandshakeRetries is how many times a failed handshake is retried (default 2).
	HandshakeRetries int
	// Logger receives logs carrying request and engine ids; nil = none.
	Logger *zap.Logger
	// Metrics receives counters; nil = a private Metrics.
	Metrics *Metrics
}

// Decode is the decode role: it handshakes with prefill engines (once per engine, cached, redone after a
// failure), checks compatibility, and READs a request's blocks into local blocks with one NIXL request,
// notifying the prefill side. It is safe for concurrent use.
type Decode struct {
	cfg     DecodeConfig
	log     *zap.Logger
	metrics *Metrics
	reg     *registered
	local   *nixl.Prepped
	hash    string

	mu      sync.Mutex
	remotes map[string]*remoteEngine // by engine id
}

// remoteEngine is a handshaken prefill rank.
type remoteEngine struct {
	once    chan struct{} // closed when the handshake finished (ok or not)
	err     error
	agent   string
	geom    layout.Geometry
	prepped *nixl.Prepped
	addr    string
	meta    protocol.AgentMetadata
	took    time.Duration
}

// NewDecode registers the local cache and prepares its descriptor list.
func NewDecode(cfg DecodeConfig) (*Decode, error) {
	if cfg.Profile.Name == "" {
		return nil, errors.New("connector: DecodeConfig.Profile is not set (use protocol.ProfileFor)")
	}
	if cfg.EngineID == "" {
		cfg.EngineID = randomID("gonixl-d-")
	}
	if cfg.TPSize <= 0 {
		cfg.TPSize = 1
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = cfg.Profile.HandshakeTimeout
		if cfg.HandshakeTimeout == 0 {
			cfg.HandshakeTimeout = 5 * time.Second
		}
	}
	if cfg.HandshakeRetries == 0 {
		cfg.HandshakeRetries = 2
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("role", "decode"), zap.String("engine_id", cfg.EngineID), zap.Int("tp_rank", cfg.TPRank))
	metrics := cfg.Metrics
	if metrics == nil {
		metrics = &Metrics{}
	}
	if err := checkPlan(cfg.Profile, cfg.Cache); err != nil {
		return nil, err
	}
	reg, err := register(cfg.Library, fmt.Sprintf("%s-tp%d", cfg.EngineID, cfg.TPRank), cfg.Backends, cfg.Cache, log)
	if err != nil {
		return nil, err
	}
	d := &Decode{cfg: cfg, log: log, metrics: metrics, reg: reg, remotes: map[string]*remoteEngine{}}
	descs, err := reg.localDescs()
	if err == nil {
		d.local, err = reg.agent.Prep("", cfg.Cache.MemType(), descs)
	}
	if err != nil {
		reg.close()
		return nil, err
	}
	if cfg.Profile.Payload == protocol.PayloadM1 && !cfg.Compat.SkipCheck {
		if d.hash, err = cfg.Profile.CompatHash(cfg.Compat.CompatInputs); err != nil {
			d.Close()
			return nil, fmt.Errorf("connector: compatibility hash: %w", err)
		}
	}
	return d, nil
}

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
// then notifies the prefill side. Everything is validated before any transfer; ctx bounds the whole pull.
func (d *Decode) Pull(ctx context.Context, requestID string, kv protocol.KVTransferParams, localBlocks []int) (Result, error) {
	res := Result{RequestID: requestID}
	log := d.log.With(zap.String("request_id", requestID), zap.String("remote_engine_id", kv.RemoteEngineID),
		zap.String("remote_request_id", kv.RemoteRequestID))
	fail := func(err error) (Result, error) {
		d.metrics.RequestErrors.Add(1)
		log.Warn("pull failed", zap.Error(err))
		return res, err
	}
	if err := kv.ValidateForDecode(); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadParams, err))
	}
	if len(kv.RemoteBlockIDs) != 1 {
		return fail(fmt.Errorf("%w: %d KV-cache groups; gonixl serves models with one group", ErrBadParams, len(kv.RemoteBlockIDs)))
	}
	if kv.RemoteHost == "" || kv.RemotePort <= 0 || kv.RemotePort > 65535 {
		return fail(fmt.Errorf("%w: remote_host %q / remote_port %d do not name a side channel", ErrBadParams, kv.RemoteHost, kv.RemotePort))
	}
	if kv.RemoteRequestID == "" {
		return fail(fmt.Errorf("%w: remote_request_id is empty (the prefill side could never match the notification)", ErrBadParams))
	}
	remoteIDs := kv.RemoteBlockIDs[0]
	if len(remoteIDs) != len(localBlocks) {
		return fail(fmt.Errorf("%w: %d remote blocks for %d local blocks", ErrBadParams, len(remoteIDs), len(localBlocks)))
	}
	if kv.TPSize > 1 && kv.TPSize != d.cfg.TPSize {
		return fail(fmt.Errorf("%w: prefill TP %d != decode TP %d: heterogeneous TP is not supported by gonixl's decode role yet", ErrBadParams, kv.TPSize, d.cfg.TPSize))
	}
	if err := d.reg.geom.CheckBlockIDs(localBlocks, 0); err != nil {
		return fail(fmt.Errorf("%w: local blocks: %v", ErrBadParams, err))
	}
	addr := "tcp://" + net.JoinHostPort(kv.RemoteHost, strconv.Itoa(kv.RemotePort))
	re, hsTook, err := d.remote(ctx, kv.RemoteEngineID, addr)
	if err != nil {
		return fail(err)
	}
	res.Handshake = hsTook
	ids := make([]int, len(remoteIDs))
	for i, v := range remoteIDs {
		ids[i] = int(v)
	}
	if err := re.geom.CheckBlockIDs(ids, 0); err != nil {
		return fail(fmt.Errorf("%w: remote block ids against the prefill engine's %d blocks: %v", ErrBadParams, re.geom.NumBlocks, err))
	}
	remoteIdx, err := re.geom.DescIndices(ids, nil)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadParams, err))
	}
	localIdx, err := d.reg.geom.DescIndices(localBlocks, nil)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadParams, err))
	}
	notif, err := d.cfg.Profile.EncodeNotification(protocol.Notification{RequestID: kv.RemoteRequestID, Count: d.notifCount()})
	if err != nil {
		return fail(fmt.Errorf("%w: %v", ErrBadParams, err))
	}
	x, err := d.reg.agent.MakeXfer(nixl.Read, d.local, localIdx, re.prepped, remoteIdx, nixl.WithNotification(notif))
	if err != nil {
		return fail(err)
	}
	defer x.Close()
	start := time.Now()
	if _, err := x.Post(); err != nil {
		d.forget(kv.RemoteEngineID, re)
		return fail(err)
	}
	stopHB := d.heartbeat(re.agent, kv.RemoteRequestID)
	err = x.Wait(ctx)
	stopHB()
	res.Transfer = time.Since(start)
	if err != nil {
		// The peer may be gone: release (cancel) the request first, then drop the handshake, so the remote
		// agent's metadata and descriptor list are not invalidated under a live transfer; the next request
		// handshakes again.
		if cerr := x.Close(); cerr != nil {
			log.Warn("releasing the failed READ", zap.Error(cerr))
		}
		d.forget(kv.RemoteEngineID, re)
		return fail(fmt.Errorf("connector: READ of %d blocks from %s: %w", len(ids), kv.RemoteEngineID, err))
	}
	res.Blocks = len(ids)
	res.Bytes = int64(len(localIdx)) * d.reg.geom.DescLen()
	if hb, ok := d.cfg.Cache.(HostBuffered); ok {
		t := time.Now()
		if err := hb.CopyToDevice(ctx, localBlocks); err != nil {
			return fail(fmt.Errorf("connector: host → device copy: %w", err))
		}
		res.Copy = time.Since(t)
	}
	d.metrics.Requests.Add(1)
	d.metrics.Bytes.Add(res.Bytes)
	d.metrics.Observe("transfer", res.Transfer)
	log.Debug("pulled", zap.Int("blocks", res.Blocks), zap.Int64("bytes", res.Bytes), zap.Duration("transfer", res.Transfer), zap.Float64("gbps", res.GBps()))
	return res, nil
}

// notifCount is the number after ':' in the notification: D's TP size (0.16) or the number of consumers
// P waits for (0.33: one per decode rank reading this prefill rank).
func (d *Decode) notifCount() int {
	if d.cfg.Profile.Notif == protocol.NotifDecodeTPSize {
		return d.cfg.TPSize
	}
	return 1
}

// heartbeat renews the request's lease while the READ runs, in profiles with leases.
func (d *Decode) heartbeat(agent, remoteRequestID string) func() {
	p := d.cfg.Profile
	if !p.Leases || p.HeartbeatInterval <= 0 {
		return func() {}
	}
	msg, err := p.EncodeHeartbeat([]string{remoteRequestID})
	if err != nil {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(p.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := d.reg.agent.SendNotification(agent, msg); err == nil {
					d.metrics.Heartbeats.Add(1)
				}
			}
		}
	}()
	return func() { close(stop); <-done }
}

// remote returns the handshaken prefill engine, doing the handshake once (concurrent callers wait for it).
func (d *Decode) remote(ctx context.Context, engineID, addr string) (*remoteEngine, time.Duration, error) {
	d.mu.Lock()
	re := d.remotes[engineID]
	if re != nil && re.addr != addr {
		d.mu.Unlock()
		return nil, 0, fmt.Errorf("%w: engine %s was handshaken at %s, now named at %s", ErrBadParams, engineID, re.addr, addr)
	}
	mine := re == nil
	if mine {
		re = &remoteEngine{once: make(chan struct{}), addr: addr}
		d.remotes[engineID] = re
	}
	d.mu.Unlock()
	if mine {
		start := time.Now()
		re.err = d.handshake(ctx, engineID, re)
		re.took = time.Since(start)
		if re.err != nil {
			d.mu.Lock()
			delete(d.remotes, engineID)
			d.mu.Unlock()
		} else {
			d.metrics.Handshakes.Add(1)
			d.metrics.Observe("handshake", re.took)
		}
		close(re.once)
		return re, re.took, re.err
	}
	select {
	case <-re.once:
		return re, 0, re.err
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("connector: waiting for the handshake with %s: %w", engineID, ctx.Err())
	}
}

// handshake fetches the prefill rank's metadata, checks it, loads the NIXL agent and prepares the remote
// descriptor list over all its blocks and regions.
func (d *Decode) handshake(ctx context.Context, engineID string, re *remoteEngine) error {
	p := d.cfg.Profile
	// With equal TP sizes, decode rank r reads prefill rank r.
	rank := protocol.Rank{TP: d.cfg.TPRank}
	reply, err := sidechannel.Fetch(ctx, p, re.addr, rank, sidechannel.FetchOptions{
		Timeout:  d.cfg.HandshakeTimeout,
		Attempts: d.cfg.HandshakeRetries + 1,
		Logger:   d.log,
	})
	if err != nil {
		return fmt.Errorf("connector: handshake with %s at %s: %w", engineID, re.addr, err)
	}
	md, err := p.OpenHandshake(reply.Payload, protocol.HandshakeCheck{LocalHash: d.hash, EnforceHash: !d.cfg.Compat.SkipCheck, ExpectedEngineID: engineID})
	if err != nil {
		return fmt.Errorf("connector: handshake with %s at %s: %w", engineID, re.addr, err)
	}
	geom, err := layout.PeerGeometry(d.reg.geom, layout.Peer{
		NumBlocks:     int(md.NumBlocks),
		BlockLens:     md.BlockLens,
		BlockSize:     int(md.BlockSize),
		KVCacheLayout: md.KVCacheLayout,
		NumRegions:    len(md.KVCachesBaseAddr),
	})
	if err != nil {
		return fmt.Errorf("connector: prefill engine %s has an incompatible KV cache: %w", engineID, err)
	}
	name, err := d.reg.agent.LoadRemoteMetadata(md.AgentMetadata)
	if err != nil {
		return fmt.Errorf("connector: loading prefill engine %s's NIXL metadata: %w", engineID, err)
	}
	descs, err := geom.Descs(md.KVCachesBaseAddr, uint64(md.DeviceID))
	if err != nil {
		_ = d.reg.agent.InvalidateRemoteMetadata(name)
		return err
	}
	mem := nixl.DRAM
	if len(md.RegionMemTypes) > 0 {
		if m, err := nixl.ParseMemType(md.RegionMemTypes[0]); err == nil {
			mem = m
		}
	}
	pl, err := d.reg.agent.Prep(name, mem, toNixl(descs))
	if err != nil && len(md.RegionMemTypes) == 0 {
		// The metadata does not say where the remote memory is: try VRAM too (a GPU prefill worker).
		if pl2, err2 := d.reg.agent.Prep(name, nixl.VRAM, toNixl(descs)); err2 == nil {
			pl, err = pl2, nil
		}
	}
	if err != nil {
		_ = d.reg.agent.InvalidateRemoteMetadata(name)
		return fmt.Errorf("connector: preparing prefill engine %s's %d descriptors: %w", engineID, len(descs), err)
	}
	re.agent, re.geom, re.prepped, re.meta = name, geom, pl, md
	d.log.Info("handshake done", zap.String("remote_engine_id", engineID), zap.String("addr", re.addr),
		zap.String("remote_agent", name), zap.String("remote_geometry", geom.String()))
	return nil
}

// forget drops a remote engine's handshake (after a failed transfer), so the next pull does it again.
func (d *Decode) forget(engineID string, re *remoteEngine) {
	d.mu.Lock()
	if d.remotes[engineID] == re {
		delete(d.remotes, engineID)
	} else {
		re = nil
	}
	d.mu.Unlock()
	if re == nil {
		return
	}
	if re.prepped != nil {
		_ = re.prepped.Close()
	}
	if re.agent != "" {
		_ = d.reg.agent.InvalidateRemoteMetadata(re.agent)
	}
	d.log.Info("dropped handshake after a failure; it is redone on the next request", zap.String("remote_engine_id", engineID))
}

// Close releases the remote lists, the local list, the registration and the agent. Idempotent.
func (d *Decode) Close() error {
	d.mu.Lock()
	remotes := d.remotes
	d.remotes = map[string]*remoteEngine{}
	d.mu.Unlock()
	for _, re := range remotes {
		select {
		case <-re.once:
		default:
			continue
		}
		if re.prepped != nil {
			_ = re.prepped.Close()
		}
	}
	if d.local != nil {
		_ = d.local.Close()
	}
	return d.reg.close()
}
