package layout_test

import (
	"errors"
	"fmt"

	"github.com/gonixl/gonixl/layout"
)

// Qwen3-0.6B at TP1 with block size 16 and a 9-block pool (null block + 8), in vLLM 0.16's split-K/V plan.
func ExampleGeometry() {
	g := layout.Geometry{
		NumLayers: 28, NumBlocks: 9, BlockSize: 16, NumKVHeads: 8, HeadDim: 128,
		DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV,
	}
	if err := g.Validate(); err != nil {
		panic(err)
	}
	fmt.Println("regions:", g.NumRegions())
	fmt.Println("block_len:", g.BlockLen())
	fmt.Println("region:", g.RegionLen())
	fmt.Println("arena:", g.TotalBytes())
	// Output:
	// regions: 56
	// block_len: 32768
	// region: 294912
	// arena: 16515072
}

// Convert one layer's K of a 5-token request from an NxDI (batch, heads, seq, head_dim) tensor into the
// blocks the scheduler assigned ([3, 1]), inside the region that holds layer 0's K.
func ExampleGeometry_ToPaged() {
	g := layout.Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 4, NumKVHeads: 1, HeadDim: 1,
		DType: layout.FP8E4M3, Order: layout.HND, Plan: layout.PlanSplitKV}
	src := layout.Source{Batch: 1, Heads: 1, SeqLen: 8, HeadDim: 1}
	k := []byte{10, 11, 12, 13, 14, 99, 99, 99} // positions ≥ 5 hold padding garbage
	r, _ := g.Region(0, layout.K)
	arena := make([]byte, g.TotalBytes())
	region := arena[g.RegionOffset(r) : g.RegionOffset(r)+g.RegionLen()]
	if err := g.ToPaged(region, layout.K, k, src, layout.Seq{Tokens: 5, BlockIDs: []int{3, 1}}); err != nil {
		panic(err)
	}
	fmt.Println(region)
	err := g.ToPaged(region, layout.K, k, src, layout.Seq{Tokens: 5, BlockIDs: []int{3, 4}})
	fmt.Println(errors.Is(err, layout.ErrBlockOutOfRange))
	// Output:
	// [0 0 0 0 14 0 0 0 0 0 0 0 10 11 12 13]
	// true
}

// The descriptor indices of blocks [3, 4, 5] across all four regions of a 2-layer model with 10 blocks.
func ExampleGeometry_DescIndices() {
	g := layout.Geometry{NumLayers: 2, NumBlocks: 10, BlockSize: 16, NumKVHeads: 8, HeadDim: 128,
		DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
	ids, err := g.DescIndices([]int{3, 4, 5}, nil)
	fmt.Println(ids, err)
	descs, _ := g.Descs([]uint64{0x10000000, 0x20000000, 0x30000000, 0x40000000}, 0)
	fmt.Printf("%d descs, (L0 V, block 4) = %#x len %d\n", len(descs), descs[1*10+4].Addr, descs[1*10+4].Len)
	// Output:
	// [3 4 5 13 14 15 23 24 25 33 34 35] <nil>
	// 40 descs, (L0 V, block 4) = 0x20020000 len 32768
}

// A decode engine at TP2 reading from a prefill engine at TP1: rank 1 reads the second half of the heads
// of every prefill block.
func ExampleNewReadPlan() {
	d := layout.Geometry{NumLayers: 2, NumBlocks: 20, BlockSize: 16, NumKVHeads: 4, HeadDim: 128,
		DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
	p := d
	p.NumKVHeads, p.NumBlocks = 8, 10
	plan, err := layout.NewReadPlan(d, 2, 1, p, 1, 8)
	if err != nil {
		panic(err)
	}
	remote, _ := plan.RemoteDescs([]uint64{0x1000000, 0x2000000, 0x3000000, 0x4000000}, 0)
	local, rem, _ := plan.Indices([]int{7}, []int{3}, nil, nil)
	fmt.Println("sources:", plan.SourceRanks(), "head offset:", plan.HeadOffset())
	fmt.Printf("remote desc of block 3: %#x len %d\n", remote[3].Addr, remote[3].Len)
	fmt.Println("local ids:", local, "remote ids:", rem)
	// Output:
	// sources: [0] head offset: 16384
	// remote desc of block 3: 0x101c000 len 16384
	// local ids: [7 27 47 67] remote ids: [3 13 23 33]
}
