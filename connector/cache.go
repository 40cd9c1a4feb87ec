package connector

import (
	"context"
	"fmt"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// Cache is a paged KV cache the roles register with NIXL and publish in the handshake: plain DRAM (DRAMCache),
// a Neuron-staged DRAM arena (neuron.Stager) or GPU memory (cuda). Device packages satisfy it structurally; the
// connector never imports them.
type Cache interface {
	// Geometry is the cache's layout (regions, blocks, heads, dtype, block order).
	Geometry() layout.Geometry
	// MemType is the NIXL memory type of the regions (DRAM or VRAM).
	MemType() nixl.MemType
	// DeviceID is the NIXL device id of the regions (0 for host memory, the CUDA ordinal for VRAM).
	DeviceID() uint64
	// RegionBases is the base address of every region, in the geometry's region order; they never change
	// while the cache is registered.
	RegionBases() []uint64
}

// HostBuffered is a decode cache that NIXL fills in host memory and that must be copied to the device after a
// READ (vLLM's kv_buffer_device="cpu" path). The decode role calls CopyToDevice once a request's READs are done.
type HostBuffered interface {
	CopyToDevice(ctx context.Context, blockIDs []int) error
}

// HostBufferedPipeline is a HostBuffered cache whose host → device copies can be started without waiting for
// them. The decode role then READs a request in slices and starts each slice's copy (one batch) as soon as its
// READ is done, while the later slices' READs run; the notification goes to the prefill side once every READ
// is done. (The cuda package's HostBufferedKVCache issues each start as one cuMemcpyBatchAsync call.)
type HostBufferedPipeline interface {
	HostBuffered
	// StartCopyToDevice starts copying blocks blockIDs (every region) to the device and returns once issued.
	StartCopyToDevice(blockIDs []int) error
	// WaitCopies waits, bounded by ctx, for every copy started so far.
	WaitCopies(ctx context.Context) error
}

// planFor maps a profile's layout era to the layout package's region plan (Model.Geometry's Plan).
func planFor(p protocol.Profile) (layout.RegionPlan, error) {
	switch p.Layout {
	case protocol.LayoutA:
		return layout.PlanSplitKV, nil
	case protocol.LayoutB:
		return layout.PlanKVHalves, nil
	case protocol.LayoutC:
		return layout.PlanPackedKV, nil
	}
	return 0, fmt.Errorf("connector: profile %s has layout era %v, which has no region plan", p.Name, p.Layout)
}

// DRAMCache is a paged KV cache in one page-aligned host arena (AllocHost), regions back to back. It serves as
// the prefill cache of a CPU worker, the staging arena of a host-buffered decode worker, and in tests.
// It is safe for concurrent use; the bytes are the caller's to synchronise per block.
type DRAMCache struct {
	g   layout.Geometry
	mem *nixl.HostMem
}

// NewDRAMCache allocates a cache for g (mlocked when lock is set, huge pages when available).
func NewDRAMCache(g layout.Geometry, lock bool) (*DRAMCache, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	m, err := nixl.AllocHost(g.TotalBytes(), nixl.HostOptions{Lock: lock, HugePages: true})
	if err != nil {
		return nil, err
	}
	return &DRAMCache{g: g, mem: m}, nil
}

// Geometry implements Cache.
func (c *DRAMCache) Geometry() layout.Geometry { return c.g }

// MemType implements Cache.
func (c *DRAMCache) MemType() nixl.MemType { return nixl.DRAM }

// DeviceID implements Cache.
func (c *DRAMCache) DeviceID() uint64 { return 0 }

// RegionBases implements Cache.
func (c *DRAMCache) RegionBases() []uint64 {
	base := c.mem.Addr()
	out := make([]uint64, c.g.NumRegions())
	for r := range out {
		out[r] = base + uint64(c.g.RegionOffset(r))
	}
	return out
}

// Region returns region r's bytes.
func (c *DRAMCache) Region(r int) []byte {
	off := c.g.RegionOffset(r)
	return c.mem.Bytes()[off : off+c.g.RegionLen()]
}

// Bytes returns the whole arena.
func (c *DRAMCache) Bytes() []byte { return c.mem.Bytes() }

// Close frees the arena; deregister it first (the roles do when they close).
func (c *DRAMCache) Close() error { return c.mem.Close() }
