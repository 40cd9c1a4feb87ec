package layout

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

type geomVector struct {
	Name        string   `json:"name"`
	Geometry    Geometry `json:"geometry"`
	TokenBytes  int64    `json:"token_bytes"`
	BlockLen    int64    `json:"block_len"`
	RegionLen   int64    `json:"region_len"`
	Regions     int      `json:"regions"`
	DescRegions int      `json:"desc_regions"`
	DescLen     int64    `json:"desc_len"`
	Total       int64    `json:"total"`
}

// geomVectors reads ../testdata/layout/geometries.json. Invalid entries may carry zero-valued enums,
// which JSON leaves unset (absent keys), so they decode fine.
func geomVectors(tb testing.TB) (valid, invalid []geomVector) {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "layout", "geometries.json"))
	require.NoError(tb, err)
	var v struct {
		Valid   []geomVector `json:"valid"`
		Invalid []geomVector `json:"invalid"`
	}
	require.NoError(tb, json.Unmarshal(raw, &v))
	require.NotEmpty(tb, v.Valid)
	require.NotEmpty(tb, v.Invalid)
	return v.Valid, v.Invalid
}

func TestGeometryVectors(t *testing.T) {
	valid, invalid := geomVectors(t)
	for _, v := range valid {
		t.Run(v.Name, func(t *testing.T) {
			g := v.Geometry
			require.NoError(t, g.Validate())
			require.Equal(t, v.TokenBytes, g.TokenBytes())
			require.Equal(t, v.BlockLen, g.BlockLen())
			require.Equal(t, v.RegionLen, g.RegionLen())
			require.Equal(t, v.Regions, g.NumRegions())
			require.Equal(t, v.DescRegions, g.NumDescRegions())
			require.Equal(t, v.DescLen, g.DescLen())
			require.Equal(t, v.Total, g.TotalBytes())
		})
	}
	for _, v := range invalid {
		t.Run(v.Name, func(t *testing.T) {
			require.ErrorIs(t, v.Geometry.Validate(), ErrInvalidGeometry)
		})
	}
}

func qwen3() Geometry {
	return Geometry{NumLayers: 28, NumBlocks: 9, BlockSize: 16, NumKVHeads: 8, HeadDim: 128, DType: BF16, Order: HND, Plan: PlanSplitKV}
}

func TestC14RegionPlan(t *testing.T) {
	g := Geometry{NumLayers: 3, NumBlocks: 5, BlockSize: 2, NumKVHeads: 2, HeadDim: 4, DType: BF16, Order: HND, Plan: PlanSplitKV}
	var order []int
	for l := range 3 {
		for _, kv := range []KV{K, V} {
			r, err := g.Region(l, kv)
			require.NoError(t, err)
			order = append(order, r)
		}
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5}, order, "K0,V0,K1,V1,K2,V2")
	for r := range 6 {
		for b := range 5 {
			id, err := g.DescIndex(r/2, KV(r%2), b)
			require.NoError(t, err)
			require.Equal(t, r*5+b, id)
		}
	}
	// Blocks-first plan: 3 regions of 2·block_len, V at +block_len (of one K/V half).
	gb := g
	gb.Plan = PlanKVHalves
	require.Equal(t, 3, gb.NumRegions())
	require.Equal(t, 2*g.BlockLen(), gb.BlockLen())
	bases := []uint64{0x10000, 0x20000, 0x30000}
	descs, err := gb.Descs(bases, 7)
	require.NoError(t, err)
	require.Len(t, descs, 30)
	// descriptor region 1 = layer 0's V halves
	require.Equal(t, Desc{Addr: 0x10000 + 2*uint64(gb.BlockLen()) + uint64(g.BlockLen()), Len: uint64(g.BlockLen()), DevID: 7}, descs[1*5+2])
	id, err := gb.DescIndex(1, V, 2)
	require.NoError(t, err)
	require.Equal(t, 3*5+2, id)
	// Packed plan: one descriptor per block, K and V share it.
	gc := g
	gc.Plan = PlanPackedKV
	ik, _ := gc.DescIndex(2, K, 4)
	iv, _ := gc.DescIndex(2, V, 4)
	require.Equal(t, 14, ik)
	require.Equal(t, ik, iv)
	_, err = g.Region(3, K)
	require.ErrorIs(t, err, ErrOutOfBounds)
	_, err = g.DescIndex(0, K, 5)
	require.ErrorIs(t, err, ErrBlockOutOfRange)
}

func TestC15Sizes(t *testing.T) {
	g := qwen3()
	require.NoError(t, g.Validate())
	require.EqualValues(t, 32768, g.BlockLen())
	require.EqualValues(t, 294912, g.RegionLen())
	require.Equal(t, 56, g.NumRegions())
	require.EqualValues(t, 16515072, g.TotalBytes())
	require.EqualValues(t, 2048, g.TokenBytes())
	require.Equal(t, "28L split-kv HND bf16 nb=9 bs=16 h=8 d=128", g.String())
}

func TestC16AliasingGuard(t *testing.T) {
	g := Geometry{NumLayers: 2, NumBlocks: 4, BlockSize: 16, NumKVHeads: 8, HeadDim: 128, DType: BF16, Order: HND, Plan: PlanSplitKV}
	// With region-major ids, block 4 of region 0 would be index 4 = region 1 block 0: NIXL would not notice.
	_, err := g.DescIndices([]int{1, 4}, nil)
	require.ErrorIs(t, err, ErrBlockOutOfRange)
	require.Contains(t, err.Error(), "block_ids[1] = 4")
	require.ErrorIs(t, g.CoversScheduler(5), ErrBlockOutOfRange)
	require.NoError(t, g.CoversScheduler(4))
}

func TestC17DType(t *testing.T) {
	for _, tc := range []struct {
		dt   DType
		blen int64
	}{{FP32, 65536}, {FP8E4M3, 16384}, {FP8E5M2, 16384}, {FP16, 32768}, {BF16, 32768}} {
		g := qwen3()
		g.DType = tc.dt
		require.Equal(t, tc.blen, g.BlockLen(), "%v", tc.dt)
		require.NoError(t, g.CheckBlockLens(g.BlockLens()))
		peer := qwen3().BlockLens() // a bf16 peer
		if tc.blen != 32768 {
			require.ErrorIs(t, g.CheckBlockLens(peer), ErrBlockLenMismatch)
		}
	}
	require.ErrorIs(t, qwen3().CheckBlockLens(make([]int64, 55)), ErrBlockLenMismatch)
}

func TestParse(t *testing.T) {
	for s, want := range map[string]DType{
		"bf16": BF16, "bfloat16": BF16, "torch.bfloat16": BF16, "BFloat16": BF16,
		"fp16": FP16, "float16": FP16, "half": FP16, "fp32": FP32, "float32": FP32, "float": FP32,
		"fp8": FP8E4M3, "fp8_e4m3": FP8E4M3, "float8_e4m3fn": FP8E4M3, "fp8_e5m2": FP8E5M2,
	} {
		got, err := ParseDType(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
		txt, err := got.MarshalText()
		require.NoError(t, err)
		var back DType
		require.NoError(t, back.UnmarshalText(txt))
		require.Equal(t, got, back)
	}
	_, err := ParseDType("auto")
	require.ErrorIs(t, err, ErrInvalidGeometry)
	require.Contains(t, err.Error(), "resolved")
	_, err = ParseDType("int4")
	require.ErrorIs(t, err, ErrInvalidGeometry)
	require.Equal(t, 0, DType(0).Size())
	require.Equal(t, "DType(9)", DType(9).String())

	for s, want := range map[string]BlockOrder{"NHD": NHD, "hnd": HND, " HND ": HND} {
		got, err := ParseBlockOrder(s)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err = ParseBlockOrder("NDH")
	require.ErrorIs(t, err, ErrInvalidGeometry)
	for s, want := range map[string]RegionPlan{"split-kv": PlanSplitKV, "A": PlanSplitKV, "kv-halves": PlanKVHalves, "b": PlanKVHalves, "packed-kv": PlanPackedKV, "C": PlanPackedKV} {
		got, err := ParseRegionPlan(s)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err = ParseRegionPlan("D")
	require.ErrorIs(t, err, ErrInvalidGeometry)
	_, err = RegionPlan(0).MarshalText()
	require.ErrorIs(t, err, ErrInvalidGeometry)
	require.Equal(t, "V", V.String())
}

func TestPeerGeometry(t *testing.T) {
	local := qwen3()
	// A TP2 peer (4 heads per rank), 100 blocks, bs 16, NHD.
	p := Peer{NumRegions: 56, NumBlocks: 100, BlockLens: make([]int64, 56), BlockSize: 16, KVCacheLayout: "NHD"}
	for i := range p.BlockLens {
		p.BlockLens[i] = 16384
	}
	g, err := PeerGeometry(local, p)
	require.NoError(t, err)
	require.Equal(t, Geometry{NumLayers: 28, NumBlocks: 100, BlockSize: 16, NumKVHeads: 4, HeadDim: 128, DType: BF16, Order: NHD, Plan: PlanSplitKV}, g)

	bad := func(mut func(*Peer), want error) {
		t.Helper()
		q := p
		q.BlockLens = append([]int64(nil), p.BlockLens...)
		mut(&q)
		_, err := PeerGeometry(local, q)
		require.ErrorIs(t, err, want)
	}
	bad(func(q *Peer) { q.NumRegions = 28 }, ErrBlockLenMismatch)
	bad(func(q *Peer) { q.BlockLens = q.BlockLens[:10] }, ErrBlockLenMismatch)
	bad(func(q *Peer) { q.BlockLens[7] = 32768 }, ErrBlockLenMismatch)
	bad(func(q *Peer) { q.BlockLens[0], q.BlockLens[1] = 100, 100 }, ErrBlockLenMismatch)
	bad(func(q *Peer) {
		for i := range q.BlockLens {
			q.BlockLens[i] = 1000
		}
	}, ErrBlockLenMismatch)
	bad(func(q *Peer) { q.KVCacheLayout = "XYZ" }, ErrInvalidGeometry)
	bad(func(q *Peer) { q.KVCacheLayout = "LBHNC" }, ErrInvalidGeometry) // a 0.29+ name needs Order
	bad(func(q *Peer) { q.Order = 7 }, ErrInvalidGeometry)

	// Order, when set, wins over the label (a 0.29+ name, or a label that is not the bytes' order).
	q := p
	q.KVCacheLayout, q.Order = "LBHNC", HND
	g, err = PeerGeometry(local, q)
	require.NoError(t, err)
	require.Equal(t, HND, g.Order)
	q.KVCacheLayout, q.Order = "HND", NHD
	g, err = PeerGeometry(local, q)
	require.NoError(t, err)
	require.Equal(t, NHD, g.Order)

	// Block size 32: the peer's heads follow from block_lens at that block size.
	q = p
	q.BlockSize = 32
	q.BlockLens = make([]int64, 56)
	for i := range q.BlockLens {
		q.BlockLens[i] = 32768
	}
	g, err = PeerGeometry(local, q)
	require.NoError(t, err)
	require.Equal(t, 32, g.BlockSize)
	require.Equal(t, 4, g.NumKVHeads)
	bad(func(q *Peer) { q.BlockSize = 0 }, ErrInvalidGeometry)
	bad(func(q *Peer) { q.NumBlocks = 0 }, ErrInvalidGeometry)
	_, err = PeerGeometry(Geometry{}, p)
	require.ErrorIs(t, err, ErrInvalidGeometry)
}

func TestInvalidGeometryMethodsDoNotPanic(t *testing.T) {
	for _, g := range []Geometry{{}, {Plan: 200, DType: 200, Order: 200, NumLayers: 3, NumBlocks: 3, BlockSize: 2, NumKVHeads: 1, HeadDim: 1}} {
		require.Zero(t, g.NumRegions())
		require.Zero(t, g.BlockLen())
		require.Zero(t, g.DescLen())
		require.Zero(t, g.TotalBytes())
		require.ErrorIs(t, g.Validate(), ErrInvalidGeometry)
		_, err := g.DescIndices([]int{1}, nil)
		require.ErrorIs(t, err, ErrInvalidGeometry)
		require.NotEmpty(t, g.String())
	}
}
