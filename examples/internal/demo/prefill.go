package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
	"github.com/gonixl/gonixl/nixl"
)

// PrefillConfig configures the demo prefill server.
type PrefillConfig struct {
	VLLMVersion string // the vLLM version the decode peer runs, e.g. "0.16.0"
	Model       connector.Model
	HTTPAddr    string            // e.g. "127.0.0.1:0"
	SideChannel int               // side-channel port; 0 = a free one
	SideHost    string            // side-channel host (connector.PrefillConfig.Host; "" = 127.0.0.1)
	NumBlocks   int               // the scheduler's num_blocks (block 0 is the null block)
	BatchRows   int               // NxDI batch rows of the device KV tensors (concurrent prefills)
	MaxSeq      int               // NxDI cache length (tokens per row)
	Order       layout.BlockOrder // the physical block order staged (sets Model.Order)
	Label       string            // kv_cache_layout label to publish ("" = Order)
	NRTPath     string            // libnrt: "" = the real libnrt.so.1 if present, else the fake one built in a temp dir
	Backends    []nixl.BackendSpec
	HoldTimeout time.Duration // 0: the profile's
	BusyPoll    time.Duration // connector.PrefillConfig.BusyPoll (0 = poll back to back while blocks are held)
	DataDevice  string        // connector.PrefillConfig.DataDevice ("" = loopback, as the side channel)
	NotifyFrom  []string      // connector.PrefillConfig.NotifyFrom (nil = every agent)
	Library     *nixl.Library
	Logger      *zap.Logger
	// CUDAContext: "auto" ("" too: hold GPU 0's primary context when a CUDA driver and device are present),
	// "on" (fail without one) or "off". See openCUDAContext for why a host-memory prefill worker wants one.
	CUDAContext string
	// NoPinStaging leaves the staging arena pageable for CUDA while a context is held (by default it is
	// page-locked with cuMemHostRegister, so UCX's cuda_copy reads it at pinned speed).
	NoPinStaging bool
	// cudaLoad is where the CUDA driver is looked for (tests point it at nothing).
	cudaLoad cuda.LoadOptions
	// Ready is called with the HTTP base URL once the server listens.
	Ready func(url string)
	// KV, when set, is the KV a model computed for a request's prompt (the engine demo: a reference model's),
	// written into the device tensors instead of FillHead's synthetic content; the blocks staged from it are
	// read back with layout.FromPaged and compared with it byte for byte (Timing.VerifiedBytes, Verified).
	KV func(req CompletionRequest) (PromptKV, error)
	// PrefixCache, when set, keeps the full blocks of finished requests for reuse
	// (connector.PrefillConfig.PrefixCache): a prompt whose leading blocks are cached is prefilled with
	// HoldTokens and only its other blocks are computed and staged (Timing.CachedTokens, StagedBlocks). It
	// needs the synthetic KV (KV unset), whose bytes at a position depend only on the tokens up to it.
	PrefixCache *connector.PrefixCacheConfig
	// KVEvents, when set, publishes vLLM's KV events of the prefix cache (connector.PrefillConfig.KVEvents;
	// needs PrefixCache); VersionInfo reports the bound addresses.
	KVEvents *connector.KVEventsConfig
}

// PromptKV is one prompt's KV as a model's prefill leaves it, in NxDI's BHSD layout for one batch row: per
// layer, K and V, each (kv_heads, Tokens, head_dim) contiguous elements of the model's dtype.
type PromptKV struct {
	Tokens int
	K, V   [][]byte
}

// PrefillServer is the demo prefill worker: NxDI-shaped KV tensors on a Neuron device (the fake libnrt when no
// Trainium is present), staged through a pinned DRAM arena registered with NIXL, served over vLLM's protocol.
type PrefillServer struct {
	api
	cfg     PrefillConfig
	rt      *neuron.Runtime
	k, v    []*neuron.Tensor
	stager  *neuron.Stager
	role    *connector.Prefill
	rows    chan int
	fakeDir string
	cudaDev *cuda.Device           // held primary context (nil: none)
	pinned  *cuda.HostRegistration // the staging arena, page-locked for CUDA
}

// OpenNeuron opens the Neuron runtime at path, or the real libnrt.so.1 when present, or else builds the fake
// libnrt into a temporary folder (returned, for removal) and opens that. When ctx ends during the build the
// compiler is stopped, the folder removed and ctx's error returned.
func OpenNeuron(ctx context.Context, path string, log *zap.Logger) (*neuron.Runtime, string, error) {
	if path == "" && neuron.Available(neuron.LoadOptions{}) {
		rt, err := neuron.Load(neuron.LoadOptions{Logger: log})
		return rt, "", err
	}
	dir := ""
	if path == "" {
		var err error
		if dir, err = os.MkdirTemp("", "gonixl-fakenrt-"); err != nil {
			return nil, "", err
		}
		if path, err = neurontest.BuildContext(ctx, dir); err != nil {
			os.RemoveAll(dir)
			return nil, "", fmt.Errorf("building the fake libnrt (no Trainium here): %w", err)
		}
		log.Info("no Neuron runtime found: using gonixl's fake libnrt over host memory", zap.String("path", path))
	}
	rt, err := neuron.Load(neuron.LoadOptions{Path: path, Logger: log})
	if err != nil && dir != "" {
		os.RemoveAll(dir)
	}
	return rt, dir, err
}

// NewPrefillServer allocates the device tensors, the staging arena and the prefill role. When ctx ends
// during start-up (SIGTERM), it stops at the next step, releases what it made (the fake libnrt's temporary
// folder included) and returns ctx's error.
func NewPrefillServer(ctx context.Context, cfg PrefillConfig) (s *PrefillServer, err error) {
	if cfg.Order != 0 {
		cfg.Model.Order = cfg.Order
	}
	switch {
	case cfg.PrefixCache != nil && cfg.KV != nil:
		return nil, errors.New("demo prefill: the prefix cache reuses blocks of the synthetic KV, whose bytes at a position depend only on the tokens up to it; a model's KV (PrefillConfig.KV) cannot be checked across reused blocks")
	case cfg.KVEvents != nil && cfg.PrefixCache == nil:
		return nil, errors.New("demo prefill: KV events (-kv-events) publish the prefix cache's blocks: set a prefix cache (-prefix-cache-blocks)")
	}
	srv := &PrefillServer{cfg: cfg}
	if err := srv.init(cfg.VLLMVersion, cfg.Logger, true, prefillID); err != nil {
		return nil, err
	}
	log := srv.log
	s = srv
	defer func() {
		if err == nil {
			err = ctx.Err() // asked to stop while the last step ran
		}
		if err != nil {
			srv.Close() // not s: a `return nil, err` has set it to nil already
			s = nil
		}
	}()
	g, err := cfg.Model.Geometry(s.profile, cfg.NumBlocks, 1)
	if err != nil {
		return nil, err
	}
	if s.rt, s.fakeDir, err = OpenNeuron(ctx, cfg.NRTPath, log); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	spec := neuron.SourceSpec{DType: g.DType, NumLayers: g.NumLayers,
		Shape: layout.Source{Batch: cfg.BatchRows, Heads: g.NumKVHeads, SeqLen: cfg.MaxSeq, HeadDim: g.HeadDim}}
	size, err := spec.TensorBytes()
	if err != nil {
		return nil, err
	}
	for l := 0; l < g.NumLayers; l++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		k, err := s.rt.Allocate(neuron.PlacementDevice, 0, uint64(size), fmt.Sprintf("past_key_values.%d", 2*l))
		if err != nil {
			return nil, err
		}
		s.k = append(s.k, k)
		v, err := s.rt.Allocate(neuron.PlacementDevice, 0, uint64(size), fmt.Sprintf("past_key_values.%d", 2*l+1))
		if err != nil {
			return nil, err
		}
		s.v = append(s.v, v)
	}
	src, err := neuron.NewDeviceSource(spec, s.k, s.v)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The Stager is the role's cache and its fill function; the role registers the arena, allocates the
	// blocks and holds them for the decode peer.
	if s.stager, err = neuron.NewStager(neuron.StagerConfig{Geometry: g, SchedulerBlocks: cfg.NumBlocks, Source: src,
		Lock: neuron.LockBestEffort, Logger: log}); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.cudaDev, err = openCUDAContext(cfg.CUDAContext, cfg.cudaLoad, log); err != nil {
		return nil, err
	}
	var devCtx connector.DeviceContext
	if s.cudaDev != nil {
		devCtx = s.cudaDev
		if !cfg.NoPinStaging {
			if s.pinned, err = pinArena(s.cudaDev, s.stager); err != nil {
				return nil, fmt.Errorf("page-locking the staging arena for CUDA (-cuda-pin-staging=false skips it): %w", err)
			}
		}
	}
	if s.role, err = connector.NewPrefill(connector.PrefillConfig{
		RoleConfig:    connector.RoleConfig{VLLMVersion: cfg.VLLMVersion, Model: cfg.Model, Library: cfg.Library, Cache: s.stager, Backends: cfg.Backends, Logger: log, DataDevice: cfg.DataDevice, DeviceContext: devCtx},
		Host:          cfg.SideHost,
		Port:          cfg.SideChannel,
		HoldTimeout:   cfg.HoldTimeout,
		BusyPoll:      cfg.BusyPoll,
		KVCacheLayout: cfg.Label,
		NotifyFrom:    cfg.NotifyFrom,
		PrefixCache:   cfg.PrefixCache,
		KVEvents:      cfg.KVEvents,
	}); err != nil {
		return nil, err
	}
	s.rows = make(chan int, cfg.BatchRows)
	for r := 0; r < cfg.BatchRows; r++ {
		s.rows <- r
	}
	return s, nil
}

// Role returns the prefill role.
func (s *PrefillServer) Role() *connector.Prefill { return s.role }

// Close releases everything (idempotent enough for the demo's single call).
func (s *PrefillServer) Close() {
	if s.role != nil {
		s.role.Close()
		s.role = nil
	}
	if s.pinned != nil {
		if err := s.pinned.Close(); err != nil {
			s.log.Warn("unpinning the staging arena", zap.Error(err))
		}
		s.pinned = nil
	}
	if s.stager != nil {
		s.stager.Close()
		s.stager = nil
	}
	for _, t := range append(s.k, s.v...) {
		t.Free()
	}
	s.k, s.v = nil, nil
	if s.rt != nil {
		s.rt.Close()
		s.rt = nil
	}
	if s.fakeDir != "" {
		os.RemoveAll(s.fakeDir)
		s.fakeDir = ""
	}
	if s.cudaDev != nil {
		if err := s.cudaDev.Close(); err != nil {
			s.log.Warn("releasing the CUDA context", zap.Error(err))
		}
		s.cudaDev = nil
	}
}

// CUDADevice returns the CUDA device whose primary context the worker holds, or nil.
func (s *PrefillServer) CUDADevice() *cuda.Device { return s.cudaDev }

// compute writes what a model's prefill would leave in the NxDI KV tensors for one request: every layer's K
// and V, heads × positions [first, len(chain)) of batch row `row` (chain: the prompt's KVChain; positions
// below first hold a cached prefix and are not computed), in one batched device write.
func (s *PrefillServer) compute(row int, chain []uint64, first int) error {
	m := s.cfg.Model
	rowBytes := m.HeadDim * m.DType.Size()
	part := chain[first:]
	n := len(part) * rowBytes
	host := make([]byte, 2*m.Layers*m.KVHeads*n)
	batches := make([]neuron.Batch, 0, 2*m.Layers)
	for l := 0; l < m.Layers; l++ {
		for _, kv := range []layout.KV{layout.K, layout.V} {
			t := s.k[l]
			if kv == layout.V {
				t = s.v[l]
			}
			b := neuron.Batch{Tensor: t}
			for h := 0; h < m.KVHeads; h++ {
				buf := host[:n:n]
				host = host[n:]
				FillHead(buf, rowBytes, part, l, kv, h)
				b.Ops = append(b.Ops, neuron.Op{Offset: uint64(((row*m.KVHeads+h)*s.cfg.MaxSeq + first) * rowBytes), Buf: buf})
			}
			batches = append(batches, b)
		}
	}
	return s.rt.WriteBatch(batches)
}

// writeKV writes a model's KV of one request (PrefillConfig.KV) into batch row `row` of the device tensors,
// in one batched device write.
func (s *PrefillServer) writeKV(row, tokens int, kv PromptKV) error {
	m := s.cfg.Model
	rowBytes := m.HeadDim * m.DType.Size()
	n := tokens * rowBytes
	if kv.Tokens != tokens || len(kv.K) != m.Layers || len(kv.V) != m.Layers {
		return fmt.Errorf("the model's KV has %d tokens and %d/%d layers; the prompt has %d tokens, the model %d layers",
			kv.Tokens, len(kv.K), len(kv.V), tokens, m.Layers)
	}
	batches := make([]neuron.Batch, 0, 2*m.Layers)
	for l := 0; l < m.Layers; l++ {
		for _, part := range []layout.KV{layout.K, layout.V} {
			t, src := s.k[l], kv.K[l]
			if part == layout.V {
				t, src = s.v[l], kv.V[l]
			}
			if len(src) != m.KVHeads*n {
				return fmt.Errorf("layer %d %v: %d bytes of KV, want %d (%d heads × %d tokens × %d)", l, part, len(src), m.KVHeads*n, m.KVHeads, tokens, rowBytes)
			}
			b := neuron.Batch{Tensor: t}
			for h := 0; h < m.KVHeads; h++ {
				b.Ops = append(b.Ops, neuron.Op{Offset: uint64((row*m.KVHeads + h) * s.cfg.MaxSeq * rowBytes), Buf: src[h*n : (h+1)*n]})
			}
			batches = append(batches, b)
		}
	}
	return s.rt.WriteBatch(batches)
}

// checkStaged reads every layer's K and V of a request back from the staged blocks (layout.FromPaged, the
// decode peer's layout) and compares them with the model's KV byte for byte; it returns the bytes compared.
func (s *PrefillServer) checkStaged(kv PromptKV, blocks []int) (int64, error) {
	g := s.stager.Geometry()
	src := layout.Source{Batch: 1, Heads: g.NumKVHeads, SeqLen: kv.Tokens, HeadDim: g.HeadDim}
	q := layout.Seq{Tokens: kv.Tokens, BlockIDs: blocks}
	var n int64
	for l := 0; l < g.NumLayers; l++ {
		for _, part := range []layout.KV{layout.K, layout.V} {
			want := kv.K[l]
			if part == layout.V {
				want = kv.V[l]
			}
			r, err := g.Region(l, part)
			if err != nil {
				return n, err
			}
			got := make([]byte, len(want))
			if err := g.FromPaged(got, src, part, s.stager.Region(r), q); err != nil {
				return n, err
			}
			if !bytes.Equal(got, want) {
				return n, fmt.Errorf("layer %d %v: the staged blocks read back differ from the model's KV", l, part)
			}
			n += int64(len(want))
		}
	}
	return n, nil
}

// Handler returns the OpenAI-shaped HTTP API: POST /v1/completions, GET /version (VersionInfo), /health,
// /metrics.
func (s *PrefillServer) Handler() http.Handler {
	return s.handler(s.VersionInfo(), s.role.Metrics(), s.completions)
}

// VersionInfo is what GET /version answers: the vLLM version, the block size and, with a prefix cache, its
// size and the KV-event sockets' bound addresses.
func (s *PrefillServer) VersionInfo() VersionInfo {
	v := VersionInfo{Version: s.version, BlockSize: s.stager.Geometry().BlockSize}
	if pc := s.cfg.PrefixCache; pc != nil {
		v.PrefixCacheBlocks = pc.MaxBlocks
	}
	if a := s.role.KVEventsAddr(); a != nil {
		v.KVEvents = &KVEventsInfo{Endpoint: zmqEndpoint(a), ReplayEndpoint: zmqEndpoint(s.role.KVEventsReplayAddr()), Topic: s.cfg.KVEvents.Topic}
	}
	return v
}

func (s *PrefillServer) completions(w http.ResponseWriter, r *http.Request) {
	req, _, id, ok := s.accept(w, r)
	if !ok {
		return
	}
	var err error
	tokens := req.NumTokens()
	if tokens == 0 || tokens > s.cfg.MaxSeq {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("prompt has %d tokens; this worker takes 1..%d", tokens, s.cfg.MaxSeq))
		return
	}
	var row int
	select {
	case row = <-s.rows:
	case <-r.Context().Done():
		return
	}
	start := time.Now()
	g := s.stager.Geometry()
	var kv PromptKV
	var chain []uint64 // the synthetic KV's seeds (KVChain), computed into the row inside the fill
	var computed time.Duration
	if s.cfg.KV != nil {
		if kv, err = s.cfg.KV(req); err == nil {
			err = s.writeKV(row, tokens, kv)
		}
		computed = time.Since(start)
	} else {
		chain = KVChain(req.TokenIDs())
	}
	var stage, verify time.Duration
	var verified int64
	cached, staged, filled := 0, 0, false
	var out protocol.KVTransferParams
	if err == nil {
		stageFrom := s.stager.FillFrom(row, tokens)
		// fill computes and stages the prompt from block `from` on: blocks[:from] hold a prefix cached from
		// an earlier request (HoldTokens), whose KV is this prompt's too (KVChain is causal).
		fill := func(ctx context.Context, blocks []int, from int) error {
			filled = true
			first := min(from*g.BlockSize, tokens)
			cached, staged = first, max(g.NeededBlocks(tokens)-from, 0)
			if chain != nil && first < tokens {
				t := time.Now()
				if err := s.compute(row, chain, first); err != nil {
					return err
				}
				computed = time.Since(t)
			}
			t := time.Now()
			if err := stageFrom(ctx, blocks, from); err != nil {
				return err
			}
			stage = time.Since(t)
			if s.cfg.KV == nil {
				return nil
			}
			t = time.Now()
			n, err := s.checkStaged(kv, blocks)
			verify, verified = time.Since(t), n
			return err
		}
		if s.cfg.PrefixCache != nil {
			ids := make([]int64, tokens)
			for i, id := range req.TokenIDs() {
				ids[i] = int64(id)
			}
			out, err = s.role.HoldTokens(r.Context(), id, ids, req.CacheSalt, fill)
		} else {
			out, err = s.role.Hold(r.Context(), id, tokens, func(ctx context.Context, blocks []int) error { return fill(ctx, blocks, 0) })
		}
		if err == nil && !filled { // every block was cached: nothing to compute or stage
			cached = int(out.RemotePrefillCachedTokens)
		}
	}
	s.rows <- row
	if err != nil {
		code := prefillStatus(err)
		if code >= 500 {
			s.log.Warn("prefill failed", zap.String("request_id", id), zap.Error(err))
		}
		writeError(w, code, err.Error())
		return
	}
	raw, err := s.profile.EncodeParams(out)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	resp := oneToken(id, req, " ", tokens)
	resp.KVTransferParams = raw
	resp.Gonixl = &Timing{ComputeMS: ms(computed), StageMS: ms(stage), Blocks: g.NeededBlocks(tokens), Bytes: int64(g.NeededBlocks(tokens)) * g.BlockLen() * int64(g.NumRegions()),
		VerifyMS: ms(verify), VerifiedBytes: verified, Verified: s.cfg.KV != nil,
		CachedTokens: cached, CachedBlocks: cached / g.BlockSize, StagedBlocks: staged}
	writeJSON(w, http.StatusOK, resp)
}

// prefillStatus maps a prefill error to its HTTP status: 409 for a request id already in use, 503 (the
// client retries; writeError adds Retry-After) when the KV blocks ran out or the worker is stopping, 500
// otherwise.
func prefillStatus(err error) int {
	switch {
	case errors.Is(err, connector.ErrDuplicateRequest):
		return http.StatusConflict
	case errors.Is(err, connector.ErrNoBlocks), errors.Is(err, nixl.ErrClosed), errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// apiMux serves what both workers share: GET /version (info: the vLLM version the worker speaks, its block
// size, ...), /health, /metrics (the role's metrics with the Go runtime's and the process's, from a registry
// of the server's own), and POST /v1/completions.
func apiMux(info VersionInfo, metrics prometheus.Collector, completions http.HandlerFunc) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("POST /v1/completions", completions)
	return mux
}

// readCompletion decodes a completion request and its kv_transfer_params (absent = null), answering 400 itself
// when either is malformed.
func readCompletion(w http.ResponseWriter, r *http.Request, p protocol.Profile) (CompletionRequest, protocol.KVTransferParams, bool) {
	var req CompletionRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return req, protocol.KVTransferParams{}, false
	}
	raw := []byte(req.KVTransferParams)
	if len(raw) == 0 {
		raw = []byte("null")
	}
	kv, err := p.DecodeParams(raw)
	if err != nil {
		writeError(w, http.StatusBadRequest, "kv_transfer_params: "+err.Error())
		return req, kv, false
	}
	return req, kv, true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// RetryAfter is the Retry-After (seconds) of a 503: blocks free up as decode peers finish reading.
const RetryAfter = "1"

func writeError(w http.ResponseWriter, code int, msg string) {
	if code == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", RetryAfter)
	}
	writeJSON(w, code, ErrorResponse{Object: "error", Message: msg, Type: http.StatusText(code), Code: code})
}

// HTTPTimeouts bound what one client can hold of a worker's HTTP server.
type HTTPTimeouts struct {
	// ReadHeader bounds reading a request's headers.
	ReadHeader time.Duration
	// Read bounds reading the whole request, body included: a client that sends headers and then stalls the
	// body is cut off.
	Read time.Duration
	// Handler bounds one request's handling (waiting for a batch row, prefill, pull); its context ends then.
	Handler time.Duration
	// Write bounds the response, from the end of the request headers; longer than Handler.
	Write time.Duration
	// Idle bounds a keep-alive connection between requests.
	Idle time.Duration
	// MaxConns caps the open connections (0: DefaultMaxHTTPConns, or less where RLIMIT_NOFILE leaves less
	// room); at the cap a new connection evicts the one idle the longest (connLimiter).
	MaxConns int
	// MaxHeaderBytes bounds a request's headers (0: DefaultMaxHeader).
	MaxHeaderBytes int
}

// DefaultHTTPTimeouts are the workers' timeouts: requests are small JSON bodies (16 MiB at most), a pull takes
// at most the decode worker's PullTimeout (60 s by default).
var DefaultHTTPTimeouts = HTTPTimeouts{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Handler: 3 * time.Minute,
	Write: 4 * time.Minute, Idle: 2 * time.Minute}

// Serve runs h on addr with DefaultHTTPTimeouts until ctx ends, calling ready with the base URL.
func Serve(ctx context.Context, addr string, h http.Handler, ready func(string)) error {
	return ServeTimeouts(ctx, addr, h, ready, DefaultHTTPTimeouts)
}

// ServeTimeouts is Serve with the given timeouts.
func ServeTimeouts(ctx context.Context, addr string, h http.Handler, ready func(string), t HTTPTimeouts) error {
	if err := ctx.Err(); err != nil {
		return nil // asked to stop before serving
	}
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if t.MaxConns <= 0 {
		t.MaxConns = maxHTTPConns()
	}
	if t.MaxHeaderBytes <= 0 {
		t.MaxHeaderBytes = DefaultMaxHeader
	}
	ln := newConnLimiter(raw, t.MaxConns)
	if t.Handler > 0 {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hctx, cancel := context.WithTimeout(r.Context(), t.Handler)
			defer cancel()
			inner.ServeHTTP(w, r.WithContext(hctx))
		})
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write,
		IdleTimeout: t.Idle, MaxHeaderBytes: t.MaxHeaderBytes, ConnState: ln.connState}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready("http://" + ln.Addr().String())
	}
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
