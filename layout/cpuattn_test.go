package layout

import (
	"bytes"
	"errors"
	"testing"
)

// TestCPUAttnBlockBytes pins the CPU_ATTN format on a tiny case by value: 1 head of head_dim 2, block size
// 3, the enc value code (p·10 + d). K is transposed per head ([d][t]), V row-major ([t][d]); in PlanPackedKV
// the head's K comes first, then its V.
func TestCPUAttnBlockBytes(t *testing.T) {
	s := Source{Batch: 1, Heads: 1, SeqLen: 3, HeadDim: 2}
	q := Seq{Tokens: 2, BlockIDs: []int{1}} // the third position is zeroed
	for _, c := range []struct {
		plan RegionPlan
		kv   KV
		want []uint16
	}{
		{PlanSplitKV, K, []uint16{0, 10, 0, 1, 11, 0}},                    // d0: t0 t1 t2, d1: t0 t1 t2
		{PlanSplitKV, V, []uint16{0, 1, 10, 11, 0, 0}},                    // t0: d0 d1, t1, t2
		{PlanPackedKV, K, []uint16{0, 10, 0, 1, 11, 0, 7, 7, 7, 7, 7, 7}}, // V half untouched
		{PlanPackedKV, V, []uint16{7, 7, 7, 7, 7, 7, 0, 1, 10, 11, 0, 0}},
	} {
		g := Geometry{NumLayers: 1, NumBlocks: 2, BlockSize: 3, NumKVHeads: 1, HeadDim: 2, DType: BF16, Order: CPUAttn, Plan: c.plan}
		mustNoErr(t, g.Validate())
		region := make([]byte, g.RegionLen())
		for i := range len(region) / 2 {
			region[2*i] = 7
		}
		mustNoErr(t, g.ToPaged(region, c.kv, encSource(0, s), s, q))
		if got := blockU16(g, region, 1); !equalU16(got, c.want) {
			t.Errorf("%v %v: block = %v, want %v", c.plan, c.kv, got, c.want)
		}
	}
}

func equalU16(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCPUAttnRefusals: what is not modelled is refused with ErrUnsupportedLayout, and what vLLM never writes
// with ErrInvalidGeometry, before any byte moves.
func TestCPUAttnRefusals(t *testing.T) {
	base := Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 32, NumKVHeads: 2, HeadDim: 64, DType: BF16, Order: CPUAttn, Plan: PlanPackedKV}
	mustNoErr(t, base.Validate())
	amx := base
	amx.Order = CPUAttnAMX
	mustNoErr(t, amx.Validate())
	for name, c := range map[string]struct {
		g    Geometry
		want error
	}{
		"kv-halves":     {func() Geometry { g := base; g.Plan = PlanKVHalves; return g }(), ErrUnsupportedLayout},
		"fp8_e4m3":      {func() Geometry { g := base; g.DType = FP8E4M3; return g }(), ErrUnsupportedLayout},
		"fp8_e5m2":      {func() Geometry { g := base; g.DType = FP8E5M2; return g }(), ErrUnsupportedLayout},
		"amx-kv-halves": {func() Geometry { g := amx; g.Plan = PlanKVHalves; return g }(), ErrUnsupportedLayout},
		"amx-fp8":       {func() Geometry { g := amx; g.DType = FP8E4M3; return g }(), ErrUnsupportedLayout},
		"amx-fp32":      {func() Geometry { g := amx; g.DType = FP32; return g }(), ErrInvalidGeometry},
		"amx-fp16":      {func() Geometry { g := amx; g.DType = FP16; return g }(), ErrInvalidGeometry},
		"amx-bs48":      {func() Geometry { g := amx; g.BlockSize = 48; return g }(), ErrInvalidGeometry},
		"amx-d48":       {func() Geometry { g := amx; g.HeadDim = 48; return g }(), ErrInvalidGeometry},
	} {
		g := c.g
		err := g.Validate()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Validate = %v, want %v", name, err, c.want)
		}
		reg := filled(64, 0xAA)
		if err := g.ToPaged(reg, K, make([]byte, 8), Source{1, 1, 4, 1, false}, Seq{}); !errors.Is(err, c.want) {
			t.Errorf("%s: ToPaged = %v, want %v", name, err, c.want)
		}
		if !bytes.Equal(reg, filled(64, 0xAA)) {
			t.Errorf("%s: ToPaged wrote on error", name)
		}
	}
	buf := make([]byte, base.RegionLen())
	for _, g := range []Geometry{base, amx} {
		if err := g.Reorder(buf, make([]byte, g.RegionLen()), nil); !errors.Is(err, ErrUnsupportedLayout) {
			t.Errorf("Reorder(%v) = %v, want ErrUnsupportedLayout", g.Order, err)
		}
	}
	if base.Swapped().Order != CPUAttn {
		t.Errorf("Swapped changed a CPU_ATTN order")
	}
	if err := base.BlocksToPaged(buf, K, make([]byte, 4*base.KVBlockLen()), BlockSource{NumBlocks: 4, Order: CPUAttn}, []int{1}); !errors.Is(err, ErrInvalidGeometry) {
		t.Errorf("BlocksToPaged from a CPU_ATTN source = %v, want ErrInvalidGeometry (NxDI has no such layout)", err)
	}
}

func TestCPUAttnNames(t *testing.T) {
	for in, want := range map[string]BlockOrder{"CPU_ATTN": CPUAttn, "cpu_attn": CPUAttn, "CPU_ATTN_AMX": CPUAttnAMX, "HND": HND} {
		got, err := ParseBlockOrder(in)
		if err != nil || got != want {
			t.Errorf("ParseBlockOrder(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if b, err := CPUAttn.MarshalText(); err != nil || string(b) != "CPU_ATTN" {
		t.Errorf("MarshalText = %q, %v", b, err)
	}
	if b, err := CPUAttnAMX.MarshalText(); err != nil || string(b) != "CPU_ATTN_AMX" {
		t.Errorf("MarshalText(CPU_ATTN_AMX) = %q, %v", b, err)
	}
	for isa, want := range map[string]BlockOrder{"vec": CPUAttn, "vec16": CPUAttn, "neon": CPUAttn, "amx": CPUAttnAMX} {
		if got, err := CPUAttnOrder(isa); err != nil || got != want {
			t.Errorf("CPUAttnOrder(%q) = %v, %v; want %v", isa, got, err, want)
		}
	}
	for _, isa := range []string{"amx_fp8", "vxe", "vsx", "rvv", ""} {
		if _, err := CPUAttnOrder(isa); !errors.Is(err, ErrUnsupportedLayout) {
			t.Errorf("CPUAttnOrder(%q) = %v, want ErrUnsupportedLayout", isa, err)
		}
	}
	// CPUAttnFor decides as vLLM's _get_attn_isa does: vec16 for head_dim 16 mod 32 first, amx for bf16 with
	// blocks of 32·k on AMX, vec otherwise.
	for _, c := range []struct {
		dt     DType
		bs, hd int
		amx    bool
		want   BlockOrder
	}{
		{BF16, 32, 64, true, CPUAttnAMX}, {BF16, 64, 128, true, CPUAttnAMX}, {BF16, 32, 64, false, CPUAttn},
		{FP32, 32, 64, true, CPUAttn}, {FP16, 32, 64, true, CPUAttn}, {BF16, 48, 64, true, CPUAttn},
		{BF16, 32, 80, true, CPUAttn}, {BF16, 32, 48, true, CPUAttn},
	} {
		if got := CPUAttnFor(c.dt, c.bs, c.hd, c.amx); got != c.want {
			t.Errorf("CPUAttnFor(%v, bs %d, hd %d, amx %v) = %v, want %v", c.dt, c.bs, c.hd, c.amx, got, c.want)
		}
	}
	if CPUAttn.LabelOrder() != HND || CPUAttnAMX.LabelOrder() != HND || NHD.LabelOrder() != NHD {
		t.Errorf("LabelOrder: CPU_ATTN formats are published under HND's label")
	}
}

// TestCPUAttnReadPlan: heads are outermost in a CPU_ATTN block, so heterogeneous TP slices it like HND;
// differing block sizes are refused (K's transposed lines are not contiguous runs of a smaller block).
func TestCPUAttnReadPlan(t *testing.T) {
	d := Geometry{NumLayers: 2, NumBlocks: 8, BlockSize: 32, NumKVHeads: 2, HeadDim: 64, DType: FP32, Order: CPUAttn, Plan: PlanPackedKV}
	p := d
	p.NumKVHeads = 4
	plan, err := NewReadPlan(d, 2, 1, p, 1, 4)
	mustNoErr(t, err)
	_ = plan
	p16 := p
	p16.BlockSize = 16
	if _, err := NewReadPlan(d, 2, 1, p16, 1, 4); !errors.Is(err, ErrIncompatible) {
		t.Errorf("block size ratio with CPU_ATTN = %v, want ErrIncompatible", err)
	}
	h := p
	h.Order = HND
	if _, err := NewReadPlan(d, 2, 1, h, 1, 4); !errors.Is(err, ErrIncompatible) {
		t.Errorf("CPU_ATTN local vs HND remote = %v, want ErrIncompatible", err)
	}
}

// FuzzCPUAttnRoundTrip: for any small CPU_ATTN geometry and request, ToPaged then FromPaged restores the
// request's positions, writes nothing on error, and never panics.
func FuzzCPUAttnRoundTrip(f *testing.F) {
	f.Add(uint8(4), uint8(3), uint8(2), uint8(2), uint8(5), int16(4), []byte{1, 2}, uint8(0))
	f.Add(uint8(6), uint8(32), uint8(1), uint8(4), uint8(40), int16(33), []byte{5, 2}, uint8(7))
	f.Add(uint8(3), uint8(1), uint8(1), uint8(1), uint8(1), int16(-1), []byte{0}, uint8(2))
	f.Fuzz(func(t *testing.T, nb, bs, h, d, seq uint8, tokens int16, rawIDs []byte, variant uint8) {
		g := Geometry{NumLayers: 1, NumBlocks: int(nb % 12), BlockSize: int(bs % 40), NumKVHeads: int(h % 4), HeadDim: int(d % 6),
			DType: []DType{BF16, FP16, FP32, FP8E4M3}[variant%4], Order: CPUAttn, Plan: RegionPlan(1 + (variant/4)%3)}
		s := Source{Batch: 1, Heads: g.NumKVHeads, SeqLen: int(seq % 50), HeadDim: g.HeadDim, Transposed: variant&16 != 0}
		ids := make([]int, len(rawIDs)%6)
		for i := range ids {
			ids[i] = int(int8(rawIDs[i]))
		}
		q := Seq{Tokens: int(tokens), BlockIDs: ids}
		kv := KV(variant >> 5 % 2)
		regLen := 64
		if g.Validate() == nil {
			regLen = int(g.RegionLen())
		}
		srcLen := max(0, s.Batch*s.Heads*s.SeqLen*s.HeadDim*g.DType.Size())
		src := make([]byte, srcLen)
		for i := range src {
			src[i] = byte(i*7 + 1)
		}
		reg := filled(regLen, 0xAA)
		if err := g.ToPaged(reg, kv, src, s, q); err != nil {
			if !bytes.Equal(reg, filled(regLen, 0xAA)) {
				t.Fatalf("region modified on error %v", err)
			}
			return
		}
		back := make([]byte, srcLen)
		mustNoErr(t, g.FromPaged(back, s, kv, reg, q))
		e := g.ElemSize()
		for hh := range s.Heads {
			for p := range q.Tokens {
				for dd := range s.HeadDim {
					o := elemIndex(s, 0, hh, p, dd) * e
					if !bytes.Equal(back[o:o+e], src[o:o+e]) {
						t.Fatalf("%v: round trip differs at h%d p%d d%d", g, hh, p, dd)
					}
				}
			}
		}
	})
}
