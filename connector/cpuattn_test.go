package connector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// TestModelCPUAttnOrder: a CPU_ATTN model stages CPU_ATTN's format by default (fp32/fp16), must state it for
// bf16 (the packing depends on the vLLM engine's CPU), and cannot pair CPU_ATTN with another order or the
// CPU format with another backend; rows whose vLLM cannot transfer a CPU_ATTN cache (0.23–0.25) are refused.
func TestModelCPUAttnOrder(t *testing.T) {
	m := Model{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 64, DType: layout.FP32, BlockSize: 32, AttnBackend: protocol.AttnBackendCPU}
	for _, v := range []string{"0.16.0", "0.22.0", "0.26.0", "0.32.0", "0.33.0"} {
		p, err := protocol.ProfileFor(v)
		require.NoError(t, err)
		g, err := m.Geometry(p, 8, 1)
		require.NoError(t, err, v)
		assert.Equal(t, layout.CPUAttn, g.Order, v)
		in, err := m.CompatInputs(p)
		require.NoError(t, err)
		assert.Equal(t, "CPU_ATTN", in.AttnBackendName, v)
		name, err := p.LayoutName(g.Order)
		require.NoError(t, err)
		assert.Equal(t, map[bool]string{true: "LBHNC", false: "HND"}[p.Labels[0].Name == "LBHNC"], name, "%s: CPU_ATTN is published under HND's label", v)
	}
	p, _ := protocol.ProfileFor("0.32.0")
	bad := map[string]struct {
		m    Model
		want error
	}{
		"bf16 unstated":    {func() Model { m := m; m.DType = layout.BF16; return m }(), layout.ErrInvalidGeometry},
		"amx fp32":         {func() Model { m := m; m.Order = layout.CPUAttnAMX; return m }(), layout.ErrInvalidGeometry},
		"cpu_attn HND":     {func() Model { m := m; m.Order = layout.HND; return m }(), layout.ErrInvalidGeometry},
		"flash CPU format": {func() Model { m := m; m.AttnBackend = "FLASH_ATTN"; m.Order = layout.CPUAttn; return m }(), layout.ErrInvalidGeometry},
		"fp8 cache":        {func() Model { m := m; m.CacheDType = layout.FP8E4M3; return m }(), layout.ErrUnsupportedLayout},
	}
	for name, c := range bad {
		_, err := c.m.Geometry(p, 8, 1)
		assert.ErrorIs(t, err, c.want, name)
	}
	bf := m
	bf.DType, bf.Order = layout.BF16, layout.CPUAttn
	_, err := bf.Geometry(p, 8, 1)
	require.NoError(t, err, "bf16 with the vec packing stated")
	bf.Order = layout.CPUAttnAMX
	g, err := bf.Geometry(p, 8, 1)
	require.NoError(t, err, "bf16 with the AMX packing stated")
	assert.Equal(t, layout.CPUAttnAMX, g.Order)
	p23, _ := protocol.ProfileFor("0.23.0")
	_, err = m.Geometry(p23, 8, 1)
	assert.ErrorIs(t, err, layout.ErrUnsupportedLayout, "0.23–0.25 cannot transfer CPU_ATTN")
	_, err = p23.BackendOrder(layout.HND, protocol.AttnBackendCPU, 0)
	assert.ErrorIs(t, err, layout.ErrUnsupportedLayout)
}

// TestCPUAttnRoles: a gonixl prefill stating AttnBackend "CPU_ATTN" stages BHSD KV in CPU_ATTN's format (the
// vec packing in fp32, the AMX packing in bf16),
// publishes "CPU_ATTN" and HND's label with the hash enforced, and a gonixl decode of the same model reads
// it and gets the BHSD values back with FromPaged; a decode whose cache is the standard layout refuses that
// prefill (even with the hash check off) instead of moving bytes that mean something else.
func TestCPUAttnRoles(t *testing.T) {
	lib := testLib(t)
	for _, c := range []struct {
		v     string
		dt    layout.DType
		order layout.BlockOrder
	}{
		{"0.16.0", layout.FP32, 0}, {"0.20.0", layout.FP32, 0}, {"0.33.0", layout.FP32, 0},
		{"0.20.0", layout.BF16, layout.CPUAttnAMX}, {"0.33.0", layout.BF16, layout.CPUAttnAMX},
	} {
		v := c.v
		t.Run(v+"-"+c.dt.String(), func(t *testing.T) {
			m := Model{Name: "tiny-cpu", Layers: 2, KVHeads: 2, HeadDim: 32, DType: c.dt, BlockSize: 32, AttnBackend: protocol.AttnBackendCPU, Order: c.order}
			want := layout.CPUAttn
			if c.order != 0 {
				want = c.order
			}
			e := c.dt.Size()
			pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: v, Model: m, NumBlocks: 8, Library: lib}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = pre.Close() })
			pc := pre.Cache().(*DRAMCache)
			g := pc.Geometry()
			require.Equal(t, want, g.Order)
			const tokens = 40 // a full block and a partial one
			src := layout.Source{Batch: 1, Heads: 2, SeqLen: tokens, HeadDim: 32}
			bhsd := func(l int, kv layout.KV) []byte { // distinct elements (bf16: distinct 16-bit patterns)
				out := make([]byte, 2*tokens*32*e)
				for i := range 2 * tokens * 32 {
					if e == 2 {
						binary.LittleEndian.PutUint16(out[2*i:], uint16(l*10000+int(kv)*5000+i))
						continue
					}
					binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(l*100000+int(kv)*50000+i)))
				}
				return out
			}
			fill := func(_ context.Context, blocks []int) error {
				for l := range g.NumLayers {
					for _, kv := range []layout.KV{layout.K, layout.V} {
						r, _ := g.Region(l, kv)
						if err := g.ToPaged(pc.Region(r), kv, bhsd(l, kv), src, layout.Seq{Tokens: tokens, BlockIDs: blocks}); err != nil {
							return err
						}
					}
				}
				return nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			params, err := pre.Hold(ctx, "req-cpu", tokens, fill)
			require.NoError(t, err)

			dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: v, Model: m, NumBlocks: 8, Library: lib}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = dec.Close() })
			local := []int{6, 3}
			_, err = dec.Pull(ctx, "dec-cpu", params, local)
			require.NoError(t, err)
			dc := dec.Cache().(*DRAMCache)
			dg := dc.Geometry()
			require.Equal(t, want, dg.Order)
			for l := range dg.NumLayers {
				for _, kv := range []layout.KV{layout.K, layout.V} {
					r, _ := dg.Region(l, kv)
					back := make([]byte, 2*tokens*32*e)
					require.NoError(t, dg.FromPaged(back, src, kv, dc.Region(r), layout.Seq{Tokens: tokens, BlockIDs: local}))
					assert.Equal(t, bhsd(l, kv), back, "layer %d %v", l, kv)
				}
			}

			// A standard-layout decode (FLASH_ATTN): refused by the hash; with the hash check off, refused at the
			// handshake where the metadata names the backend (0.20+). Before 0.20 only the hash tells them apart.
			std := m
			std.AttnBackend, std.Order = "FLASH_ATTN", 0
			for i, skip := range []bool{false, true} {
				dec2, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: v, Model: std, NumBlocks: 8, Library: lib, Compat: Compat{SkipCheck: skip}}})
				require.NoError(t, err)
				t.Cleanup(func() { _ = dec2.Close() })
				id := fmt.Sprintf("req-cpu-std-%d", i)
				params2, err := pre.Hold(ctx, id, tokens, fill)
				require.NoError(t, err)
				_, err = dec2.Pull(ctx, "dec-"+id, params2, local)
				if skip && !slices.Contains(pre.Profile().Schema.Fields(), "attn_backend_name") {
					require.NoError(t, err, "no backend name on the wire before 0.20: the opt-out is the user's word")
					continue
				}
				require.Error(t, err, "skip=%v", skip)
				if skip {
					assert.True(t, errors.Is(err, ErrBadParams) || errors.Is(err, layout.ErrIncompatible), "%v", err)
					assert.Contains(t, err.Error(), "CPU_ATTN")
				}
			}
		})
	}
}

// TestPrefillRefusesBackendMismatch: a cache in CPU_ATTN's format published under another backend name, or a
// standard cache published as CPU_ATTN, is refused by NewPrefill.
func TestPrefillRefusesBackendMismatch(t *testing.T) {
	lib := testLib(t)
	p, _ := protocol.ProfileFor("0.33.0")
	g := layout.Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 32, NumKVHeads: 1, HeadDim: 32, DType: layout.FP32, Order: layout.CPUAttn, Plan: layout.PlanPackedKV}
	for _, c := range []struct {
		order   layout.BlockOrder
		backend string
	}{{layout.CPUAttn, "FLASH_ATTN"}, {layout.HND, protocol.AttnBackendCPU}} {
		g.Order = c.order
		in := p.DefaultCompatInputs("")
		in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = "m", "torch.float32", 1, 32, 1
		in.AttnBackendName = c.backend
		_, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Cache: newCache(t, g), Compat: Compat{CompatInputs: in}, Library: lib}})
		assert.ErrorIs(t, err, layout.ErrInvalidGeometry, "%v under %q", c.order, c.backend)
	}
}
