package neuron

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/internal/lifetime"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// LockPolicy says whether the staging arena must be pinned in RAM (mlock).
type LockPolicy int

const (
	// LockRequired pins the arena and fails if mlock is refused (raise RLIMIT_MEMLOCK).
	LockRequired LockPolicy = iota
	// LockBestEffort pins the arena when mlock succeeds and logs a warning otherwise.
	LockBestEffort
	// LockOff never pins the arena.
	LockOff
)

// StagerConfig configures NewStager.
type StagerConfig struct {
	// Geometry is the cache layout the decode peer expects (region plan, NHD/HND order, block size, dtype,
	// KV heads of this rank). NumBlocks may be left 0 to take SchedulerBlocks.
	Geometry layout.Geometry
	// SchedulerBlocks is the prefill scheduler's block pool size (vLLM's num_blocks, null block included).
	// The arena must hold every id it can hand out, so Geometry.NumBlocks must be ≥ it.
	SchedulerBlocks int
	// Source is where the KV is read from (NewDeviceSource or NewHostSource).
	Source Source
	// FirstHead is the first source head this rank's geometry holds (0 when the source holds exactly this
	// rank's heads).
	FirstHead int
	// Workers is the number of (layer, K|V) units processed at once by one Stage: device reads of one unit
	// overlap the layout work of another. 0: min(GOMAXPROCS, 8); 1: serial.
	Workers int
	// MaxArenaBytes refuses larger arenas (0: three quarters of the machine's RAM).
	MaxArenaBytes int64
	// Lock is the mlock policy (default LockRequired). Huge pages are used when available.
	Lock LockPolicy
	// Logger receives diagnostics; nil logs nothing.
	Logger *zap.Logger
}

// Request is one prefill request to stage.
type Request struct {
	// ID names the request in errors (vLLM's request id).
	ID string
	// Row is the NxDI batch row (seq_id) holding the request.
	Row int
	// Tokens is the number of valid positions (the prompt length at the end of prefill).
	Tokens int
	// BlockIDs are the block ids the caller allocated (the connector's prefill role: its BlockPool), in
	// request order. BlockIDs[j] receives positions [j·BlockSize, (j+1)·BlockSize).
	BlockIDs []int
	// FromBlock is the first block to stage: BlockIDs[:FromBlock] already hold positions
	// [0, FromBlock·BlockSize) — a prefix cached from an earlier request (the connector's HoldTokens), shared
	// read-only with other requests — and are neither written nor converted. 0 stages every block. The source
	// is still read from position 0 (Source.Fetch takes no start position); only the conversion and the
	// writes into the arena are skipped.
	FromBlock int
}

// Stager is a cache plus a fill function: one pinned host arena (a connector.Cache of DRAM) and Stage/Fill,
// which copy a prefill request's KV from a Source into it at the block ids the caller allocated, in the
// layout the decode peer expects. The arena holds every region of the geometry back to back, in the plan's
// region order; its base addresses never change, so they can be published once in the handshake
// (RegionBases, Geometry, MemType, DeviceID). Allocation, holding the blocks for the decode peer and NIXL
// registration belong to the connector's prefill role, which registers the arena like any DRAM cache.
//
// Concurrency: all methods are safe for concurrent use. Stage calls for different requests (disjoint block
// ids, guaranteed by the caller's pool) run in parallel; Close waits for running Stage calls.
type Stager struct {
	g         layout.Geometry
	src       Source
	firstHead int
	workers   int
	log       *zap.Logger

	mem   *nixl.HostMem
	arena []byte
	bases []uint64

	mu     sync.RWMutex // Stage holds it shared, Close exclusively
	closed bool

	bufs sync.Pool // *[]byte fetch buffers

	// counters
	staged, failed atomic.Int64
}

// physicalRAM returns the machine's RAM in bytes (0 if unknown).
func physicalRAM() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// NewStager checks the configuration and allocates the arena (page-aligned mmap, huge pages when available,
// mlock per Lock).
func NewStager(cfg StagerConfig) (*Stager, error) {
	g := cfg.Geometry
	if g.NumBlocks == 0 {
		g.NumBlocks = cfg.SchedulerBlocks
	}
	if err := g.Validate(); err != nil {
		return nil, refuse("new stager", ErrBadArgument, "staging geometry: %w", err)
	}
	if cfg.SchedulerBlocks > 0 {
		if err := g.CoversScheduler(cfg.SchedulerBlocks); err != nil {
			return nil, refuse("new stager", ErrBadArgument, "%w", err)
		}
	}
	if g.NumBlocks < 2 {
		return nil, refuse("new stager", ErrBadArgument, "%d blocks leave none besides the null block", g.NumBlocks)
	}
	if cfg.Source == nil {
		return nil, refuse("new stager", ErrBadArgument, "StagerConfig.Source is nil")
	}
	spec := cfg.Source.Spec()
	switch {
	case spec.NumLayers != g.NumLayers:
		return nil, refuse("new stager", ErrBadArgument, "source has %d layers, geometry %d", spec.NumLayers, g.NumLayers)
	case spec.DType != g.DType:
		return nil, refuse("new stager", ErrBadArgument, "source dtype %v differs from the geometry's %v (the decode peer reads %v)", spec.DType, g.DType, g.DType)
	case spec.Shape.HeadDim != g.HeadDim:
		return nil, refuse("new stager", ErrBadArgument, "source head_dim %d, geometry %d", spec.Shape.HeadDim, g.HeadDim)
	case cfg.FirstHead < 0 || cfg.FirstHead+g.NumKVHeads > spec.Shape.Heads:
		return nil, refuse("new stager", ErrBadArgument, "heads [%d, %d) of this rank, source has %d", cfg.FirstHead, cfg.FirstHead+g.NumKVHeads, spec.Shape.Heads)
	}
	total := g.TotalBytes()
	limit := cfg.MaxArenaBytes
	if limit <= 0 {
		limit = physicalRAM() / 4 * 3
		if limit <= 0 {
			limit = 64 << 30
		}
	}
	if total > limit {
		return nil, refuse("new stager", ErrTooLarge, "the staging arena for %v would be %d bytes (%.1f GiB: %d regions × %d blocks × %d bytes), above the limit of %.1f GiB; "+
			"bound the scheduler's block pool (e.g. --num-gpu-blocks-override) or raise StagerConfig.MaxArenaBytes",
			g, total, float64(total)/(1<<30), g.NumRegions(), g.NumBlocks, g.BlockLen(), float64(limit)/(1<<30))
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	mem, err := allocArena(total, limit, cfg.Lock, log)
	if err != nil {
		return nil, err
	}
	workers := cfg.Workers
	if workers <= 0 {
		workers = min(runtime.GOMAXPROCS(0), 8)
	}
	s := &Stager{
		g: g, src: cfg.Source, firstHead: cfg.FirstHead, workers: workers, log: log,
		mem: mem, arena: mem.Bytes(),
	}
	s.bases = make([]uint64, g.NumRegions())
	for r := range s.bases {
		s.bases[r] = mem.Addr() + uint64(g.RegionOffset(r))
	}
	log.Debug("staging arena ready", zap.Stringer("geometry", g), zap.Int64("bytes", total),
		zap.Bool("locked", mem.Locked()), zap.Bool("huge_pages", mem.HugePages()), zap.Bool("transparent_huge_pages", mem.TransparentHugePages()), zap.Int("workers", workers))
	return s, nil
}

func allocArena(total, limit int64, lock LockPolicy, log *zap.Logger) (*nixl.HostMem, error) {
	opts := nixl.HostOptions{Lock: lock != LockOff, HugePages: true, MaxBytes: limit}
	mem, err := nixl.AllocHost(total, opts)
	if err != nil && lock == LockBestEffort {
		log.Warn("staging arena not pinned: mlock refused", zap.Error(err))
		opts.Lock = false
		mem, err = nixl.AllocHost(total, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("neuron: allocate the %d-byte staging arena: %w", total, err)
	}
	return mem, nil
}

// Geometry is the arena's cache geometry (what the handshake advertises).
func (s *Stager) Geometry() layout.Geometry { return s.g }

// MemType is the arena's NIXL memory type: DRAM.
func (s *Stager) MemType() nixl.MemType { return nixl.DRAM }

// DeviceID is the arena's device id in descriptors: 0 (host memory; vLLM's device "cpu").
func (s *Stager) DeviceID() uint64 { return 0 }

// RegionBases are the regions' base addresses in the layout plan's region order (kv_caches_base_addr).
func (s *Stager) RegionBases() []uint64 { return append([]uint64(nil), s.bases...) }

// BlockLens are the per-region block lengths (block_lens).
func (s *Stager) BlockLens() []int64 { return s.g.BlockLens() }

// Descs returns the full local descriptor list (layout.Geometry.Descs over RegionBases).
func (s *Stager) Descs() ([]nixl.Desc, error) {
	ld, err := s.g.Descs(s.bases, 0)
	if err != nil {
		return nil, err
	}
	return nixl.DescsOf(ld), nil
}

// Region returns region r of the arena (read it only while no Stage writes the blocks you look at).
func (s *Stager) Region(r int) []byte {
	off := s.g.RegionOffset(r)
	return s.arena[off : off+s.g.RegionLen() : off+s.g.RegionLen()]
}

// Stats returns how many Stage calls succeeded and failed.
func (s *Stager) Stats() (staged, failed int64) { return s.staged.Load(), s.failed.Load() }

// Stage copies request req's KV — every layer, K and V — from the source into the arena at req.BlockIDs, in
// the geometry's layout, with the unused tail of the last block (and any extra block) zeroed. Work is
// pipelined over the Stager's workers. Stage returns only when every block of the request is complete, or
// with an error after every worker stopped (the blocks' contents are then undefined; the caller frees them).
// The caller owns the blocks for the whole call: two concurrent Stage calls must not share a block.
func (s *Stager) Stage(ctx context.Context, req Request) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return refuse("stage", ErrClosed, "the Stager was closed")
	}
	err := s.checkRequest(req)
	if err == nil {
		err = s.run(ctx, req)
	}
	if err != nil {
		s.failed.Add(1)
		return err
	}
	s.staged.Add(1)
	return nil
}

// Fill returns the fill function of a prefill request whose KV sits in batch row row with tokens valid
// positions: it stages them at the block ids it is given (Stage). It has connector.FillFunc's signature, so
// a prefill role takes it as is: role.Hold(ctx, id, tokens, stager.Fill(row, tokens)).
func (s *Stager) Fill(row, tokens int) func(ctx context.Context, blockIDs []int) error {
	return func(ctx context.Context, blockIDs []int) error {
		return s.Stage(ctx, Request{ID: fmt.Sprintf("row %d", row), Row: row, Tokens: tokens, BlockIDs: blockIDs})
	}
}

// FillFrom is Fill for a request whose leading blocks hold a cached prefix: the function it returns stages
// blockIDs[from:] only (Request.FromBlock), leaving blockIDs[:from] untouched. It has
// connector.PrefixFillFunc's signature: role.HoldTokens(ctx, id, tokens, salt, stager.FillFrom(row, len(tokens))).
func (s *Stager) FillFrom(row, tokens int) func(ctx context.Context, blockIDs []int, from int) error {
	return func(ctx context.Context, blockIDs []int, from int) error {
		return s.Stage(ctx, Request{ID: fmt.Sprintf("row %d", row), Row: row, Tokens: tokens, BlockIDs: blockIDs, FromBlock: from})
	}
}

func (s *Stager) checkRequest(req Request) error {
	spec := s.src.Spec()
	switch {
	case req.ID == "":
		return refuse("stage", ErrBadArgument, "request without ID")
	case req.Tokens <= 0:
		return refuse("stage", ErrBadArgument, "request %q has %d tokens; nothing to stage", req.ID, req.Tokens)
	case req.Tokens > spec.Shape.SeqLen:
		return refuse("stage", ErrBadArgument, "request %q has %d tokens, the source holds %d positions", req.ID, req.Tokens, spec.Shape.SeqLen)
	case req.Row < 0 || req.Row >= spec.Shape.Batch:
		return refuse("stage", ErrBadArgument, "request %q is in batch row %d, the source has %d rows", req.ID, req.Row, spec.Shape.Batch)
	}
	if err := s.g.CheckBlockIDs(req.BlockIDs, req.Tokens); err != nil {
		return refuse("stage", ErrBadArgument, "request %q: %w", req.ID, err)
	}
	if need := s.g.NeededBlocks(req.Tokens); req.FromBlock < 0 || req.FromBlock > need {
		return refuse("stage", ErrBadArgument, "request %q: staging from block %d of the %d its %d tokens fill", req.ID, req.FromBlock, need, req.Tokens)
	}
	return nil
}

func (s *Stager) getBuf(n int64) *[]byte {
	p, _ := s.bufs.Get().(*[]byte)
	if p == nil {
		p = new([]byte)
	}
	if int64(cap(*p)) < n {
		*p = make([]byte, n)
	}
	*p = (*p)[:n]
	return p
}

// run stages the 2·NumLayers (layer, kv) units over the worker pool.
//
// With FromBlock > 0 it stages positions [start, Tokens), start = FromBlock·BlockSize, into
// BlockIDs[FromBlock:]: each fetched tensor is read through a view that begins at position start (for a
// BHSD tensor start rows of head_dim elements further, for a transposed K start elements further), so
// position p of the view is position start+p of the tensor in every head. The conversion reads positions
// below Tokens−start of the view only, all inside the fetched bytes; the buffer is start positions longer so
// that the view has the full shape's length.
func (s *Stager) run(ctx context.Context, req Request) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := req.FromBlock * s.g.BlockSize
	if start >= req.Tokens {
		return nil // every block holds a cached prefix: nothing to stage
	}
	q := layout.Seq{Row: 0, Tokens: req.Tokens - start, BlockIDs: req.BlockIDs[req.FromBlock:]}
	units := 2 * s.g.NumLayers
	workers := min(s.workers, units)
	e := s.g.ElemSize()
	rowShift := int64(start) * int64(s.g.HeadDim) * int64(e) // the view's offset in a BHSD tensor (≥ a transposed K's)
	need := s.src.Spec().FetchLen(s.g.NumKVHeads, req.Tokens) + rowShift
	var (
		next     atomic.Int64
		errMu    sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	for range workers {
		wg.Go(func() {
			bp := s.getBuf(need)
			defer s.bufs.Put(bp)
			buf := *bp
			for {
				if ctx.Err() != nil {
					fail(refuse("stage", nil, "request %q stopped: %w", req.ID, context.Cause(ctx)))
					return
				}
				u := int(next.Add(1) - 1)
				if u >= units {
					return
				}
				layer, kv := u/2, layout.KV(u%2)
				sh, err := s.src.Fetch(layer, kv, req.Row, s.firstHead, s.g.NumKVHeads, req.Tokens, buf)
				if err != nil {
					fail(fmt.Errorf("stage request %q: read layer %d %v: %w", req.ID, layer, kv, err))
					return
				}
				n, err := sh.Bytes(e)
				if err != nil {
					fail(fmt.Errorf("stage request %q: layer %d %v: %w", req.ID, layer, kv, err))
					return
				}
				shift := rowShift
				if sh.Transposed {
					shift = int64(start) * int64(e)
				}
				r, err := s.g.Region(layer, kv)
				if err == nil {
					err = s.g.ToPaged(s.Region(r), kv, buf[shift:shift+n], sh, q)
				}
				if err != nil {
					fail(fmt.Errorf("stage request %q: convert layer %d %v: %w", req.ID, layer, kv, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return nil
}

// Close unmaps the arena, after running Stage calls returned; deregister it first (close the role that
// registered it). It is idempotent.
func (s *Stager) Close() error {
	return lifetime.CloseOnce(&s.mu, &s.closed, func() error {
		err := s.mem.Close()
		s.arena = nil
		return err
	})
}
