package cuda_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// Qwen3-0.6B's KV cache as vLLM's NixlConnector registers it (FLASH_ATTN, split K/V regions): 28 layers,
// 8 KV heads, head_dim 128, bf16, block size 16 → 56 regions of 32 KiB blocks.
var qwen3 = layout.Geometry{NumLayers: 28, NumBlocks: 256, BlockSize: 16, NumKVHeads: 8, HeadDim: 128,
	DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}

// scatteredBlocks picks n distinct non-null block ids in pseudo-random order, as a busy scheduler hands out.
func scatteredBlocks(g layout.Geometry, n int, seed uint64) []int {
	ids := rand.New(rand.NewPCG(seed, seed+1)).Perm(g.NumBlocks - 1)[:n]
	for i := range ids {
		ids[i]++
	}
	return ids
}

// BenchmarkQwen3DRAMToVRAM moves 3 requests × 1000 tokens of Qwen3-0.6B KV cache (189 blocks × 56 regions
// = 10584 descriptors of 32 KiB, 347 MB) from pinned host memory into VRAM, two ways in the same run:
//   - nixl: a decode agent's NIXL READ (UCX) of a DRAM-registered agent's blocks into its VRAM cache;
//   - memcpy: the same 10584 block copies with cuMemcpyHtoDAsync_v2 on one stream (one cgo call), the
//     baseline: what a process holding both buffers does without NIXL.
//
// It reports each throughput and nixl/memcpy, plus the one-copy ceiling (contig) for the same bytes.
func BenchmarkQwen3DRAMToVRAM(b *testing.B) {
	const requests, tokens = 3, 1000
	g := qwen3
	perReq := (tokens + g.BlockSize - 1) / g.BlockSize
	n := requests * perReq
	x := newPrefillDecode(b, g)
	src, dst := scatteredBlocks(g, n, 7), scatteredBlocks(g, n, 8)
	copy(x.host.Bytes(), pattern(len(x.host.Bytes()), 9))
	xf := x.read(b, src, dst, "bench")
	bytesMoved := float64(n) * float64(g.NumRegions()) * float64(g.BlockLen())

	// The baseline's copy list: exactly the descriptor pairs NIXL moves, not merged.
	hb, db := x.host.RegionBases(), x.kv.RegionBases()
	bl := uint64(g.BlockLen())
	var ops []cuda.Copy
	for r := range hb {
		for i := range src {
			ops = append(ops, cuda.Copy{Dst: db[r] + uint64(dst[i])*bl, Src: hb[r] + uint64(src[i])*bl, Len: bl})
		}
	}
	contig := []cuda.Copy{{Dst: db[0], Src: hb[0], Len: uint64(bytesMoved)}}
	s := newStream(b, x.dev)

	// Warm up both paths (UCX connection set-up, driver paths) and check the NIXL data once.
	x.post(b, xf)
	blk := make([]byte, g.BlockLen())
	for _, r := range []int{0, g.NumRegions() - 1} {
		for _, i := range []int{0, n - 1} {
			require.NoError(b, x.kv.Mem().Read(uint64(g.RegionOffset(r))+uint64(dst[i])*bl, blk))
			require.Equal(b, x.host.Block(r, src[i]), blk, "NIXL moved the wrong bytes")
		}
	}
	require.NoError(b, s.Enqueue(cuda.HostToDevice, ops))
	require.NoError(b, s.Synchronize())

	var tNIXL, tCopy, tContig time.Duration
	b.SetBytes(int64(bytesMoved))
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		x.post(b, xf)
		t1 := time.Now()
		if err := s.Enqueue(cuda.HostToDevice, ops); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := s.Enqueue(cuda.HostToDevice, contig); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		tNIXL += t1.Sub(t0)
		tCopy += t2.Sub(t1)
		tContig += t3.Sub(t2)
	}
	b.StopTimer()
	gbps := func(d time.Duration) float64 { return bytesMoved * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(tNIXL), "nixl_GB/s")
	b.ReportMetric(gbps(tCopy), "memcpy_GB/s")
	b.ReportMetric(gbps(tContig), "contig_GB/s")
	b.ReportMetric(tCopy.Seconds()/tNIXL.Seconds(), "nixl/memcpy")
	b.ReportMetric(float64(tNIXL.Microseconds())/float64(b.N), "nixl_us/xfer")
	b.ReportMetric(float64(tCopy.Microseconds())/float64(b.N), "memcpy_us/xfer")
}

// BenchmarkQwen3HostBufferedDecode is the same transfer in vLLM's host-buffered decode mode
// (kv_buffer_device="cpu"): the decode agent's NIXL READ lands in its pinned host cache (DRAM → DRAM), then
// HostBufferedKVCache.CopyToDevice moves the request's blocks into VRAM in one batch. The baseline is again
// the per-block cuMemcpyHtoDAsync_v2 of the same bytes from the prefill side's pinned memory.
func BenchmarkQwen3HostBufferedDecode(b *testing.B) {
	const requests, tokens = 3, 1000
	g := qwen3
	n := requests * ((tokens + g.BlockSize - 1) / g.BlockSize)
	x := newPrefillDecode(b, g)
	src, dst := scatteredBlocks(g, n, 7), scatteredBlocks(g, n, 8)
	copy(x.host.Bytes(), pattern(len(x.host.Bytes()), 10))
	bytesMoved := float64(n) * float64(g.NumRegions()) * float64(g.BlockLen())

	hb, err := cuda.NewHostBufferedKVCache(x.dev, g)
	require.NoError(b, err)
	defer func() { require.NoError(b, hb.Close()) }()
	_, err = hb.Register(x.d)
	require.NoError(b, err)
	hbDescs, err := hb.Descs()
	require.NoError(b, err)
	local, err := x.d.Prep("", nixl.DRAM, hbDescs)
	require.NoError(b, err)
	defer func() { require.NoError(b, local.Close()) }()
	li, err := g.DescIndices(dst, nil)
	require.NoError(b, err)
	ri, err := g.DescIndices(src, nil)
	require.NoError(b, err)
	xf, err := x.d.MakeXfer(nixl.Read, local, li, x.rem, ri)
	require.NoError(b, err)
	defer func() { require.NoError(b, xf.Close()) }()

	hbases, db := x.host.RegionBases(), hb.VRAM().RegionBases()
	bl := uint64(g.BlockLen())
	var ops []cuda.Copy
	for r := range hbases {
		for i := range src {
			ops = append(ops, cuda.Copy{Dst: db[r] + uint64(dst[i])*bl, Src: hbases[r] + uint64(src[i])*bl, Len: bl})
		}
	}
	s := newStream(b, x.dev)
	ctx := testenv.Context(b, time.Minute)
	step := func() (read, h2d time.Duration) {
		t0 := time.Now()
		if _, err := xf.Post(); err != nil {
			b.Fatal(err)
		}
		if err := xf.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := hb.CopyToDevice(ctx, dst); err != nil {
			b.Fatal(err)
		}
		return t1.Sub(t0), time.Since(t1)
	}

	// Warm up and check the data end to end (P's host → D's host buffer → D's VRAM).
	step()
	blk := make([]byte, g.BlockLen())
	for _, r := range []int{0, g.NumRegions() - 1} {
		for _, i := range []int{0, n - 1} {
			require.NoError(b, hb.VRAM().Mem().Read(uint64(g.RegionOffset(r))+uint64(dst[i])*bl, blk))
			require.Equal(b, x.host.Block(r, src[i]), blk, "host-buffered path moved the wrong bytes")
		}
	}

	var tRead, tH2D, tCopy time.Duration
	b.SetBytes(int64(bytesMoved))
	b.ResetTimer()
	for range b.N {
		r, h := step()
		t2 := time.Now()
		if err := s.Enqueue(cuda.HostToDevice, ops); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		tRead += r
		tH2D += h
		tCopy += time.Since(t2)
	}
	b.StopTimer()
	gbps := func(d time.Duration) float64 { return bytesMoved * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(tRead+tH2D), "hostbuf_GB/s")
	b.ReportMetric(gbps(tRead), "nixl_dram_GB/s")
	b.ReportMetric(gbps(tH2D), "h2d_batch_GB/s")
	b.ReportMetric(gbps(tCopy), "memcpy_GB/s")
	b.ReportMetric(tCopy.Seconds()/(tRead+tH2D).Seconds(), "hostbuf/memcpy")
}
