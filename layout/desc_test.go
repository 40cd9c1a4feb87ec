package layout

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Worked examples follow vLLM's NixlConnector: 0.16.0 nixl_connector.py (register_local_xfer_handler,
// add_remote_agent, _read_blocks, get_mapped_blocks, _get_block_descs_ids) and 0.33.0 nixl/base_worker.py
// (_build_fa_local, _build_fa_remote, _compute_desc_ids) with nixl/tp_mapping.py (compute_tp_mapping,
// compute_head_offset). Expected values are computed by hand from those functions.

func model2L(nb, bs, heads int, plan RegionPlan) Geometry {
	return Geometry{NumLayers: 2, NumBlocks: nb, BlockSize: bs, NumKVHeads: heads, HeadDim: 128, DType: BF16, Order: HND, Plan: plan}
}

// sameTP is the worked examples' read plan between TP-1 peers of model2L with 8 heads and block size 16:
// local 20 blocks, remote 10.
func sameTP(t *testing.T, plan RegionPlan) (Geometry, *ReadPlan) {
	t.Helper()
	local := model2L(20, 16, 8, plan)
	p, err := NewReadPlan(local, 1, 0, model2L(10, 16, 8, plan), 1, 8)
	require.NoError(t, err)
	return local, p
}

func bases(n int, start, step uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = start + uint64(i)*step
	}
	return out
}

func TestLocalDescsPerPlan(t *testing.T) {
	// Era A (split K/V): [(A,bl),(A+bl),(A+2bl),(B),(B+bl),(B+2bl)] for one layer, nb=3.
	g := Geometry{NumLayers: 1, NumBlocks: 3, BlockSize: 16, NumKVHeads: 1, HeadDim: 8, DType: FP16, Order: HND, Plan: PlanSplitKV}
	bl := uint64(g.BlockLen())
	d, err := g.Descs([]uint64{0x1000, 0x9000}, 2)
	require.NoError(t, err)
	require.Equal(t, []Desc{{0x1000, bl, 2}, {0x1000 + bl, bl, 2}, {0x1000 + 2*bl, bl, 2},
		{0x9000, bl, 2}, {0x9000 + bl, bl, 2}, {0x9000 + 2*bl, bl, 2}}, d)
	// Era B (blocks-first): per region all K halves, then all V halves at +block_len/2.
	g.Plan = PlanKVHalves
	bl = uint64(g.BlockLen())
	d, err = g.Descs([]uint64{0x1000}, 0)
	require.NoError(t, err)
	require.Equal(t, []Desc{{0x1000, bl / 2, 0}, {0x1000 + bl, bl / 2, 0}, {0x1000 + 2*bl, bl / 2, 0},
		{0x1000 + bl/2, bl / 2, 0}, {0x1000 + bl + bl/2, bl / 2, 0}, {0x1000 + 2*bl + bl/2, bl / 2, 0}}, d)
	// Era C (packed): one whole-block descriptor per block.
	g.Plan = PlanPackedKV
	d, err = g.Descs([]uint64{0x1000}, 0)
	require.NoError(t, err)
	require.Equal(t, []Desc{{0x1000, bl, 0}, {0x1000 + bl, bl, 0}, {0x1000 + 2*bl, bl, 0}}, d)
	// AppendDescs reuses capacity.
	buf := make([]Desc, 0, 8)
	d2, err := g.AppendDescs(buf, []uint64{0x1000}, 0)
	require.NoError(t, err)
	require.Equal(t, d, d2)
	require.Equal(t, &buf[:1][0], &d2[0])
}

func TestDescsRejectBadBases(t *testing.T) {
	g := model2L(10, 16, 8, PlanSplitKV)
	rl := uint64(g.RegionLen())
	for name, tc := range map[string]struct {
		b    []uint64
		want error
	}{
		"count":   {bases(3, 1<<30, rl), ErrSizeMismatch},
		"zero":    {[]uint64{0, 1 << 30, 2 << 30, 3 << 30}, ErrInvalidGeometry},
		"overlap": {[]uint64{1 << 30, 1<<30 + rl - 1, 3 << 30, 4 << 30}, ErrInvalidGeometry},
		"wrap":    {[]uint64{1 << 30, 2 << 30, 3 << 30, math.MaxUint64 - rl + 1}, ErrInvalidGeometry},
	} {
		_, err := g.Descs(tc.b, 0)
		require.ErrorIs(t, err, tc.want, name)
	}
	_, err := g.Descs(bases(4, 1<<30, rl), 0) // back to back is fine
	require.NoError(t, err)
	_, err = Geometry{}.Descs(nil, 0)
	require.ErrorIs(t, err, ErrInvalidGeometry)
}

// TestVLLMWorkedExampleEraA: vllm-nixl-connector.md §6.5 — era A, 2 layers, H=8, Dh=128, bf16, bs=16,
// P_nb=10, D_nb=20.
func TestVLLMWorkedExampleEraA(t *testing.T) {
	local, p := sameTP(t, PlanSplitKV)
	l, r, err := p.Indices([]int{7, 8, 9}, []int{3, 4, 5}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, []int{7, 8, 9, 27, 28, 29, 47, 48, 49, 67, 68, 69}, l)
	require.Equal(t, []int{3, 4, 5, 13, 14, 15, 23, 24, 25, 33, 34, 35}, r)
	pb := bases(4, 0x7f0000000000, 0x100000)
	rd, err := p.RemoteDescs(pb, 3)
	require.NoError(t, err)
	require.Len(t, rd, 40)
	require.Equal(t, Desc{Addr: pb[1] + 4*32768, Len: 32768, DevID: 3}, rd[1*10+4], "(L0V, block 4)")
	// Geometry.DescIndices gives the same local ids.
	ids, err := local.DescIndices([]int{7, 8, 9}, make([]int, 0, 12))
	require.NoError(t, err)
	require.Equal(t, l, ids)
	ld, err := p.LocalDescs(bases(4, 0x100000000, 0x1000000), 0, 0)
	require.NoError(t, err)
	full, err := local.Descs(bases(4, 0x100000000, 0x1000000), 0)
	require.NoError(t, err)
	require.Equal(t, full, ld, "homogeneous: local list = registration walk")
	require.Equal(t, 1, p.NotifsExpected())
}

// Era C, same model: block_len 65536, regions [L0, L1], remote ids [3,4,5,13,14,15].
func TestVLLMWorkedExampleEraC(t *testing.T) {
	require.EqualValues(t, 65536, model2L(10, 16, 8, PlanPackedKV).BlockLen())
	_, p := sameTP(t, PlanPackedKV)
	l, r, err := p.Indices([]int{7, 8, 9}, []int{3, 4, 5}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, []int{3, 4, 5, 13, 14, 15}, r)
	require.Equal(t, []int{7, 8, 9, 27, 28, 29}, l)
}

// Era B: 4 descriptor regions (L0K, L0V, L1K, L1V) over 2 registered regions.
func TestVLLMWorkedExampleEraB(t *testing.T) {
	_, p := sameTP(t, PlanKVHalves)
	_, r, err := p.Indices([]int{7, 8, 9}, []int{3, 4, 5}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, []int{3, 4, 5, 13, 14, 15, 23, 24, 25, 33, 34, 35}, r)
	pb := bases(2, 0x7f0000000000, 0x1000000)
	rd, err := p.RemoteDescs(pb, 0)
	require.NoError(t, err)
	require.Equal(t, Desc{Addr: pb[0] + 4*65536 + 32768, Len: 32768}, rd[1*10+4], "L0 V half of block 4")
}

// 0.16 _read_blocks: a partial prefix hit keeps the last remote blocks.
func TestVLLMPrefixHitTrimsRemote(t *testing.T) {
	_, p := sameTP(t, PlanSplitKV)
	l, r, err := p.Indices([]int{8, 9}, []int{3, 4, 5}, make([]int, 0, 8), make([]int, 0, 8))
	require.NoError(t, err)
	require.Equal(t, []int{4, 5, 14, 15, 24, 25, 34, 35}, r)
	require.Equal(t, []int{8, 9, 28, 29, 48, 49, 68, 69}, l)
	l, r, err = p.Indices(nil, []int{3, 4, 5}, nil, nil) // full hit: nothing to read
	require.NoError(t, err)
	require.Empty(t, l)
	require.Empty(t, r)
	_, _, err = p.Indices([]int{8}, []int{10}, nil, nil) // remote id past P's num_blocks
	require.ErrorIs(t, err, ErrBlockOutOfRange)
	_, _, err = p.Indices([]int{20}, []int{3}, nil, nil) // local id past D's num_blocks
	require.ErrorIs(t, err, ErrBlockOutOfRange)
}

// 0.16 get_mapped_blocks + register_local_xfer_handler(remote block size): D bs=32, P bs=16.
func TestVLLMBlockSizeRatio(t *testing.T) {
	local, remote := model2L(20, 32, 8, PlanSplitKV), model2L(10, 16, 8, PlanSplitKV)
	p, err := NewReadPlan(local, 1, 0, remote, 1, 8)
	require.NoError(t, err)
	require.Equal(t, 2, p.BlockSizeRatio())
	l, r, err := p.Indices([]int{3, 4}, []int{1, 2, 3}, nil, nil)
	require.NoError(t, err)
	// mapped [6,7,8,9] clipped to 3, in a local space of 40 sub-blocks per region
	require.Equal(t, []int{6, 7, 8, 46, 47, 48, 86, 87, 88, 126, 127, 128}, l)
	require.Equal(t, []int{1, 2, 3, 11, 12, 13, 21, 22, 23, 31, 32, 33}, r)
	lb := bases(4, 1<<32, 1<<28)
	ld, err := p.LocalDescs(lb, 1, 0)
	require.NoError(t, err)
	require.Len(t, ld, 4*40)
	require.Equal(t, Desc{Addr: lb[1] + 7*32768, Len: 32768, DevID: 1}, ld[1*40+7])
	rd, err := p.RemoteDescs(bases(4, 1<<40, 1<<28), 0)
	require.NoError(t, err)
	require.EqualValues(t, 32768, rd[0].Len, "transfer unit = P's block")
	// P's block larger than D's is refused.
	_, err = NewReadPlan(remote, 1, 0, local, 1, 8)
	require.ErrorIs(t, err, ErrIncompatible)
}

// D_tp=2 reads from P_tp=1: D rank 1 takes the second half of heads of every P block (HND).
func TestVLLMHeteroTPDecodeLarger(t *testing.T) {
	for _, plan := range []RegionPlan{PlanSplitKV, PlanKVHalves, PlanPackedKV} {
		local, remote := model2L(20, 16, 4, plan), model2L(10, 16, 8, plan)
		p, err := NewReadPlan(local, 2, 1, remote, 1, 8)
		require.NoError(t, err)
		require.Equal(t, []int{0}, p.SourceRanks())
		require.Equal(t, 2, p.NotifsExpected())
		dl := uint64(local.DescLen())
		require.Equal(t, dl, p.HeadOffset())
		pb := bases(remote.NumRegions(), 1<<40, 1<<30)
		rd, err := p.RemoteDescs(pb, 5)
		require.NoError(t, err)
		require.Equal(t, Desc{Addr: pb[0] + 2*uint64(remote.BlockLen()) + dl, Len: dl, DevID: 5}, rd[2], "%v", plan)
		if plan == PlanKVHalves { // V: base + b·P_blen + offset + P_blen/2
			require.Equal(t, Desc{Addr: pb[0] + 2*uint64(remote.BlockLen()) + dl + uint64(remote.BlockLen())/2, Len: dl, DevID: 5}, rd[10+2])
		}
		p0, err := NewReadPlan(local, 2, 0, remote, 1, 8)
		require.NoError(t, err)
		require.Zero(t, p0.HeadOffset())
	}
}

// P_tp=2 feeds D_tp=1: each D block is filled in two chunks, one per P rank.
func TestVLLMHeteroTPPrefillLarger(t *testing.T) {
	local, remote := model2L(20, 16, 8, PlanSplitKV), model2L(10, 16, 4, PlanSplitKV)
	p, err := NewReadPlan(local, 1, 0, remote, 2, 8)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, p.SourceRanks())
	require.Equal(t, 1, p.NotifsExpected())
	lb := bases(4, 1<<32, 1<<28)
	ld, err := p.LocalDescs(lb, 0, 1)
	require.NoError(t, err)
	require.Equal(t, Desc{Addr: lb[0] + 3*32768 + 16384, Len: 16384}, ld[3])
	rd, err := p.RemoteDescs(bases(4, 1<<40, 1<<28), 0)
	require.NoError(t, err)
	require.EqualValues(t, 16384, rd[3].Len)
	require.Equal(t, uint64(1<<40+3*16384), rd[3].Addr)
	_, err = p.LocalDescs(lb, 0, 2)
	require.ErrorIs(t, err, ErrOutOfBounds)
	// P_tp > D_tp with different block sizes is refused (vLLM asserts the same).
	_, err = NewReadPlan(model2L(20, 32, 8, PlanSplitKV), 1, 0, remote, 2, 8)
	require.ErrorIs(t, err, ErrIncompatible)
}

// 0.33 compute_tp_mapping: replicated heads.
func TestVLLMReplicatedHeads(t *testing.T) {
	// total 8, P_tp=4 (2 heads/rank), D_tp=16 (1 replicated head/rank).
	local, remote := model2L(20, 16, 1, PlanSplitKV), model2L(10, 16, 2, PlanSplitKV)
	for d, want := range map[int][2]uint64{5: {1, 0}, 6: {1, 1}, 0: {0, 0}, 15: {3, 1}} {
		p, err := NewReadPlan(local, 16, d, remote, 4, 8)
		require.NoError(t, err)
		require.Equal(t, []int{int(want[0])}, p.SourceRanks(), "rank %d", d)
		require.Equal(t, want[1]*uint64(local.DescLen()), p.HeadOffset(), "rank %d", d)
	}
	// total 8, P_tp=32 (replicated), D_tp=2: read each distinct head once.
	local, remote = model2L(20, 16, 4, PlanSplitKV), model2L(10, 16, 1, PlanSplitKV)
	p, err := NewReadPlan(local, 2, 1, remote, 32, 8)
	require.NoError(t, err)
	require.Equal(t, []int{16, 20, 24, 28}, p.SourceRanks())
	lb := bases(4, 1<<32, 1<<28)
	ld, err := p.LocalDescs(lb, 0, 24)
	require.NoError(t, err)
	require.Equal(t, Desc{Addr: lb[0] + 2*4096, Len: 4096}, ld[0])
}

func TestReadPlanRejects(t *testing.T) {
	local, remote := model2L(20, 16, 8, PlanSplitKV), model2L(10, 16, 8, PlanSplitKV)
	other := remote
	other.Order = NHD
	_, err := NewReadPlan(local, 1, 0, other, 1, 8)
	require.ErrorIs(t, err, ErrIncompatible)
	other = remote
	other.Plan = PlanPackedKV
	_, err = NewReadPlan(local, 1, 0, other, 1, 8)
	require.ErrorIs(t, err, ErrIncompatible)
	_, err = NewReadPlan(local, 1, 0, remote, 2, 8) // remote should hold 4 heads at TP2
	require.ErrorIs(t, err, ErrBlockLenMismatch)
	_, err = NewReadPlan(local, 1, 1, remote, 1, 8)
	require.ErrorIs(t, err, ErrOutOfBounds)
	_, err = NewReadPlan(model2L(20, 16, 8, PlanSplitKV), 3, 0, remote, 1, 24)
	require.ErrorIs(t, err, ErrBlockLenMismatch)
	_, err = NewReadPlan(Geometry{}, 1, 0, remote, 1, 8)
	require.ErrorIs(t, err, ErrInvalidGeometry)
	p, err := NewReadPlan(local, 1, 0, remote, 1, 8)
	require.NoError(t, err)
	_, err = p.RemoteDescs(nil, 0)
	require.ErrorIs(t, err, ErrSizeMismatch)
}

func TestReadPlanHeterogeneousTPNeedsHND(t *testing.T) {
	g := Geometry{NumLayers: 2, NumBlocks: 8, BlockSize: 16, NumKVHeads: 4, HeadDim: 64, DType: BF16, Order: NHD, Plan: PlanSplitKV}
	d := g
	d.NumKVHeads = 2
	_, err := NewReadPlan(d, 2, 1, g, 1, 4)
	require.ErrorIs(t, err, ErrIncompatible)
	_, err = NewReadPlan(g, 1, 0, d, 2, 4)
	require.ErrorIs(t, err, ErrIncompatible)
	// Equal heads per rank need no slicing: NHD is fine.
	_, err = NewReadPlan(g, 2, 1, g, 2, 8)
	require.NoError(t, err)
	g.Order, d.Order = HND, HND
	_, err = NewReadPlan(d, 2, 1, g, 1, 4)
	require.NoError(t, err)
}
