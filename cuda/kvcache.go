package cuda

import (
	"context"
	"errors"
	"sync"

	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// Regions is the part of a KV cache that block copies need: its geometry and where each registered
// region starts. KVCache and HostKVCache implement it, and so can any other cache (a connector's host
// buffer, a staging arena) whose regions are plain host or device memory.
type Regions interface {
	Geometry() layout.Geometry
	MemType() nixl.MemType
	RegionBases() []uint64
}

// cache is what KVCache and HostKVCache share: a geometry, one allocation holding every region back to
// back (region r at base + r·RegionLen), and the NIXL registrations made of it.
type cache struct {
	g     layout.Geometry
	mem   nixl.MemType
	devID uint64
	base  uint64
	bases []uint64

	mu     sync.Mutex
	closed bool
	regs   []*nixl.Registration
}

func newCache(g layout.Geometry, mem nixl.MemType, devID, base uint64) cache {
	bases := make([]uint64, g.NumRegions())
	for r := range bases {
		bases[r] = base + uint64(g.RegionOffset(r))
	}
	return cache{g: g, mem: mem, devID: devID, base: base, bases: bases}
}

// Geometry is the cache's geometry.
func (c *cache) Geometry() layout.Geometry { return c.g }

// MemType is the NIXL memory type the cache registers as.
func (c *cache) MemType() nixl.MemType { return c.mem }

// DeviceID is the NIXL device id of the cache's descriptors (the CUDA ordinal for VRAM, 0 for DRAM,
// as vLLM advertises device_id).
func (c *cache) DeviceID() uint64 { return c.devID }

// RegionBases returns one base address per registered region, in region order (vLLM's
// kv_caches_base_addr). The slice is a copy.
func (c *cache) RegionBases() []uint64 { return append([]uint64(nil), c.bases...) }

// BlockLens returns the block length of every region (vLLM's block_lens).
func (c *cache) BlockLens() []int64 {
	out := make([]int64, len(c.bases))
	for i := range out {
		out[i] = c.g.BlockLen()
	}
	return out
}

// RegionDescs returns one registration descriptor per region: (base, RegionLen, DeviceID), as vLLM
// registers its caches.
func (c *cache) RegionDescs() []nixl.Desc {
	out := make([]nixl.Desc, len(c.bases))
	for i, b := range c.bases {
		out[i] = nixl.Desc{Addr: b, Len: uint64(c.g.RegionLen()), DevID: c.devID}
	}
	return out
}

// Descs returns the full local transfer descriptor list (layout.Geometry.Descs over RegionBases).
func (c *cache) Descs() ([]nixl.Desc, error) {
	ds, err := c.g.Descs(c.bases, c.devID)
	if err != nil {
		return nil, err
	}
	return nixl.DescsOf(ds), nil
}

// keep takes what RegisterMem returned and, on success, adds the registration to those close deregisters
// (deregistering it at once when the cache is already closed).
func (c *cache) keep(reg *nixl.Registration, err error) (*nixl.Registration, error) {
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return reg, errors.Join(closedErr("KV cache"), reg.Close())
	}
	c.regs = append(c.regs, reg)
	return reg, nil
}

// use refuses with ErrClosed once the cache is closed.
func (c *cache) use() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return closedErr("KV cache")
	}
	return nil
}

// closeRegs marks the cache closed and deregisters what it registered (children before the memory).
func (c *cache) closeRegs() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, nil
	}
	c.closed = true
	var errs []error
	for i := len(c.regs) - 1; i >= 0; i-- {
		errs = append(errs, c.regs[i].Close())
	}
	c.regs = nil
	return true, errors.Join(errs...)
}

// close deregisters (closeRegs), then frees the cache's memory with free; calls after the first do nothing.
func (c *cache) close(free func() error) error {
	first, err := c.closeRegs()
	if !first {
		return nil
	}
	return errors.Join(err, free())
}

// KVCache is a paged KV cache in device memory (VRAM), laid out by a layout.Geometry: every region in one
// cuMemAlloc_v2 allocation, back to back. It provides what a connector needs for the handshake
// (RegionBases, BlockLens, MemType, DeviceID), registers itself with NIXL agents, and copies blocks to and
// from a host cache for vLLM's host-buffered decode mode (kv_buffer_device="cpu").
//
// A KVCache is safe for concurrent use; concurrent copies into the same blocks are the caller's to order.
// Close deregisters it from every agent it registered with, then frees the memory.
type KVCache struct {
	cache
	dev *Device
	m   *DeviceMem
}

// NewKVCache allocates a zeroed VRAM cache of g.TotalBytes() bytes on dev.
func NewKVCache(dev *Device, g layout.Geometry) (*KVCache, error) {
	if err := g.Validate(); err != nil {
		return nil, invalid("new KV cache", "geometry: %w", err)
	}
	m, err := dev.Alloc(uint64(g.TotalBytes()))
	if err != nil {
		return nil, err
	}
	if err := m.Memset(0, m.Len(), 0); err != nil {
		return nil, errors.Join(err, m.Close())
	}
	return &KVCache{cache: newCache(g, nixl.VRAM, uint64(dev.Ordinal()), m.Ptr()), dev: dev, m: m}, nil
}

// Device is the device holding the cache.
func (c *KVCache) Device() *Device { return c.dev }

// Mem is the allocation holding every region.
func (c *KVCache) Mem() *DeviceMem { return c.m }

// Register registers every region with agent a as VRAM (one descriptor per region, DevID = the CUDA
// ordinal). It runs with the device's context current on the calling thread, as UCX expects for VRAM. The
// registration is closed by Close, or earlier by the caller.
func (c *KVCache) Register(a *nixl.Agent, opts ...nixl.Option) (*nixl.Registration, error) {
	var reg *nixl.Registration
	err := c.dev.Do(func() error {
		var err error
		reg, err = a.RegisterMem(nixl.VRAM, c.RegionDescs(), opts...)
		return err
	})
	return c.keep(reg, err)
}

// Do runs fn with the cache's device context current on a locked OS thread (Device.Do), which makes a
// KVCache the connector's DeviceContext: a decode role given it as its cache prepares and posts its NIXL
// transfers through Do, as UCX needs for VRAM (the role runs only NIXL calls inside: Prep, MakeXfer, Post).
// It refuses with ErrClosed (a *Error) once the cache or its device is closed; closing the cache while fn
// runs is the caller's to avoid. fn must not close the device nor take it again: not Do, Register or a
// Device method (Device.Do says why and what is fine).
func (c *KVCache) Do(fn func() error) error {
	if err := c.use(); err != nil {
		return err
	}
	return c.dev.Do(fn)
}

// Close deregisters the cache from every agent it was registered with, then frees the device memory.
// It is idempotent.
func (c *KVCache) Close() error { return c.close(c.m.Close) }

// HostKVCache is a paged KV cache in pinned host memory (cuMemHostAlloc), laid out like KVCache: the host
// buffer of vLLM's host-buffered mode, registered with NIXL as DRAM. Safe for concurrent use like KVCache.
type HostKVCache struct {
	cache
	h *HostMem
}

// NewHostKVCache allocates a zeroed pinned host cache of g.TotalBytes() bytes through dev's context
// (pinned for every context).
func NewHostKVCache(dev *Device, g layout.Geometry) (*HostKVCache, error) {
	if err := g.Validate(); err != nil {
		return nil, invalid("new host KV cache", "geometry: %w", err)
	}
	h, err := dev.AllocHost(uint64(g.TotalBytes()))
	if err != nil {
		return nil, err
	}
	clear(h.Bytes())
	return &HostKVCache{cache: newCache(g, nixl.DRAM, 0, uint64(h.Addr())), h: h}, nil
}

func (c *HostKVCache) hostResource() *resource { return c.h.r }

// Bytes views the whole cache (every region back to back). Invalid after Close.
func (c *HostKVCache) Bytes() []byte { return c.h.Bytes() }

// Block views block b of region r. Invalid after Close.
func (c *HostKVCache) Block(r, b int) []byte {
	off := c.g.RegionOffset(r) + int64(b)*c.g.BlockLen()
	return c.h.Bytes()[off : off+c.g.BlockLen()]
}

// Register registers every region with agent a as DRAM (one descriptor per region).
func (c *HostKVCache) Register(a *nixl.Agent, opts ...nixl.Option) (*nixl.Registration, error) {
	return c.keep(a.RegisterMem(nixl.DRAM, c.RegionDescs(), opts...))
}

// Close deregisters the cache from every agent it was registered with, then frees the pinned memory.
// It is idempotent.
func (c *HostKVCache) Close() error { return c.close(c.h.Close) }

// BlockCopies builds the copy list that moves blocks srcIDs[i] of src to dstIDs[i] of dst in every region,
// region-major, with runs of consecutive blocks merged (Coalesce). The geometries must have the same
// regions and block length (their NumBlocks may differ); ids are checked against each side's NumBlocks.
// It touches no memory.
func BlockCopies(dst, src Regions, dstIDs, srcIDs []int) ([]Copy, error) {
	const op = "block copies"
	if len(dstIDs) != len(srcIDs) {
		return nil, invalid(op, "%d destination block ids for %d source block ids", len(dstIDs), len(srcIDs))
	}
	dg, sg := dst.Geometry(), src.Geometry()
	if dg.NumRegions() != sg.NumRegions() || dg.BlockLen() != sg.BlockLen() {
		return nil, invalid(op, "geometries differ: destination %v (%d regions × %d-byte blocks), source %v (%d regions × %d-byte blocks)",
			dg, dg.NumRegions(), dg.BlockLen(), sg, sg.NumRegions(), sg.BlockLen())
	}
	db, sb := dst.RegionBases(), src.RegionBases()
	if len(db) != dg.NumRegions() || len(sb) != sg.NumRegions() {
		return nil, invalid(op, "region bases: destination has %d, source %d, geometry %d", len(db), len(sb), dg.NumRegions())
	}
	for i := range dstIDs {
		if dstIDs[i] < 0 || dstIDs[i] >= dg.NumBlocks {
			return nil, invalid(op, "destination block id %d (index %d) outside 0..%d", dstIDs[i], i, dg.NumBlocks-1)
		}
		if srcIDs[i] < 0 || srcIDs[i] >= sg.NumBlocks {
			return nil, invalid(op, "source block id %d (index %d) outside 0..%d", srcIDs[i], i, sg.NumBlocks-1)
		}
	}
	bl := uint64(dg.BlockLen())
	ops := make([]Copy, 0, len(db)*len(dstIDs))
	for r := range db {
		for i := range dstIDs {
			ops = append(ops, Copy{Dst: db[r] + uint64(dstIDs[i])*bl, Src: sb[r] + uint64(srcIDs[i])*bl, Len: bl})
		}
	}
	return Coalesce(ops), nil
}

// CopyFromHost copies blocks srcIDs[i] of host cache src into blocks dstIDs[i] of the device cache, in
// every region, as one batch (one cgo call; consecutive blocks merged). With s nil it returns when the
// copies are done; with a stream it only enqueues them (wait with s.Wait or an Event). src must be host
// memory (MemType DRAM) that stays valid until the copies complete.
func (c *KVCache) CopyFromHost(src Regions, srcIDs, dstIDs []int, s *Stream) error {
	if src.MemType() != nixl.DRAM {
		return invalid("copy blocks from host", "source is %v, want DRAM", src.MemType())
	}
	ops, err := BlockCopies(c, src, dstIDs, srcIDs)
	if err != nil {
		return err
	}
	return c.run(HostToDevice, ops, s, src)
}

// CopyToHost copies blocks srcIDs[i] of the device cache into blocks dstIDs[i] of host cache dst, in every
// region, as one batch; s as for CopyFromHost.
func (c *KVCache) CopyToHost(dst Regions, srcIDs, dstIDs []int, s *Stream) error {
	if dst.MemType() != nixl.DRAM {
		return invalid("copy blocks to host", "destination is %v, want DRAM", dst.MemType())
	}
	ops, err := BlockCopies(dst, c, dstIDs, srcIDs)
	if err != nil {
		return err
	}
	return c.run(DeviceToHost, ops, s, dst)
}

// run issues ops while holding the cache's allocation (never the device lock as well, so a concurrent
// Device.Close cannot deadlock with it: Close takes the device, then each allocation).
func (c *KVCache) run(dir Direction, ops []Copy, s *Stream, host Regions) error {
	if err := checkOps(dir, ops); err != nil {
		return err
	}
	if err := c.m.r.use(); err != nil {
		return err
	}
	defer c.m.r.done()
	// A host cache of this package is held too, so it cannot be freed under the copies (always after the
	// device allocation: one lock order).
	if h, ok := host.(interface{ hostResource() *resource }); ok {
		r := h.hostResource()
		if err := r.use(); err != nil {
			return err
		}
		defer r.done()
	}
	if s != nil {
		return s.Enqueue(dir, ops)
	}
	i, r := cCopyBatch(c.m.r.st.ctx, c.m.r.st.ordinal, dir, ops, 0, true)
	return batchErr(dir, ops, i, r)
}

// HostBufferedKVCache is a decode rank's cache in vLLM's host-buffered mode (kv_buffer_device="cpu"): NIXL
// reads into a pinned host cache (this is what registers and what the handshake publishes: MemType DRAM,
// DeviceID 0, the host RegionBases), and CopyToDevice moves a request's blocks into the VRAM cache once its
// READs are done. It satisfies the connector's Cache, HostBuffered and HostBufferedPipeline interfaces. Safe
// for concurrent use; the copies of concurrent calls share one stream, so each call also waits for the others'
// copies.
//
// It has no Do (it is no connector DeviceContext), on purpose: NIXL only ever reads into its host cache,
// registered as DRAM, so no transfer needs a CUDA context current, and its own copies to the VRAM cache
// bind the context inside their cgo calls. The VRAM cache's Do (VRAM().Do) is there for a caller that
// moves NIXL transfers into the VRAM cache itself.
type HostBufferedKVCache struct {
	*HostKVCache
	vram *KVCache
	s    *Stream
}

// NewHostBufferedKVCache allocates the pinned host cache and the VRAM cache for g on dev.
func NewHostBufferedKVCache(dev *Device, g layout.Geometry) (*HostBufferedKVCache, error) {
	h, err := NewHostKVCache(dev, g)
	if err != nil {
		return nil, err
	}
	v, err := NewKVCache(dev, g)
	if err != nil {
		return nil, errors.Join(err, h.Close())
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, errors.Join(err, v.Close(), h.Close())
	}
	return &HostBufferedKVCache{HostKVCache: h, vram: v, s: s}, nil
}

// VRAM is the device cache the blocks end up in.
func (c *HostBufferedKVCache) VRAM() *KVCache { return c.vram }

// CopyToDevice copies blocks blockIDs (same ids on both sides, every region) from the host cache to the
// VRAM cache in one batch, and waits for them (bounded by ctx).
func (c *HostBufferedKVCache) CopyToDevice(ctx context.Context, blockIDs []int) error {
	if err := c.vram.CopyFromHost(c.HostKVCache, blockIDs, blockIDs, c.s); err != nil {
		return err
	}
	return c.s.Wait(ctx)
}

// StartCopyToDevice starts copying blocks blockIDs (same ids on both sides, every region) from the host cache
// to the VRAM cache, one batch on the cache's stream, and returns once it is issued (the connector's
// HostBufferedPipeline: the decode role overlaps it with the READ of the next slice of a request).
func (c *HostBufferedKVCache) StartCopyToDevice(blockIDs []int) error {
	return c.vram.CopyFromHost(c.HostKVCache, blockIDs, blockIDs, c.s)
}

// WaitCopies waits (bounded by ctx) for every copy started on the cache's stream.
func (c *HostBufferedKVCache) WaitCopies(ctx context.Context) error { return c.s.Wait(ctx) }

// CopyFromDevice copies blocks blockIDs from the VRAM cache to the host cache (for a prefill rank that
// stages its GPU cache in host memory) and waits for them.
func (c *HostBufferedKVCache) CopyFromDevice(ctx context.Context, blockIDs []int) error {
	if err := c.vram.CopyToHost(c.HostKVCache, blockIDs, blockIDs, c.s); err != nil {
		return err
	}
	return c.s.Wait(ctx)
}

// Close deregisters and frees the host cache, then frees the VRAM cache. It is idempotent.
func (c *HostBufferedKVCache) Close() error {
	return errors.Join(c.HostKVCache.Close(), c.s.Close(), c.vram.Close())
}
