package nixl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/descmerge"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// TestDescMerge records how many descriptors NIXL really posts (telemetry's desc count) for a READ of
// prepared lists: a run of consecutive indices whose descriptors are adjacent in memory on both sides is
// merged into one descriptor unless WithoutDescMerge is given; descriptors that are not adjacent (a strided
// list, e.g. vLLM's K halves) or indices out of order are not merged. CreateXfer lists are posted as given.
func TestDescMerge(t *testing.T) {
	l := nixltest.Lib(t)
	a, b := telemetryAgent(t, l, "merge-a"), telemetryAgent(t, l, "merge-b")
	const blk, n = 4096, 64
	ma, mb := hostMem(t, 2*blk*n), hostMem(t, 2*blk*n)
	connectDRAM(t, a, b, ma, mb)

	list := func(base uint64, stride, length uint64) []nixl.Desc {
		d := make([]nixl.Desc, n)
		for i := range d {
			d[i] = nixl.Desc{Addr: base + uint64(i)*stride, Len: length}
		}
		return d
	}
	posted := func(x *nixl.Xfer) uint64 {
		t.Helper()
		defer x.Close()
		_, err := x.Post()
		require.NoError(t, err)
		require.NoError(t, x.Wait(testenv.Context(t, 30*time.Second)))
		tel, err := x.Telemetry()
		require.NoError(t, err)
		return tel.Descs
	}
	run := func(stride uint64, idx []int, opts ...nixl.Option) uint64 {
		t.Helper()
		lp, err := a.Prep("", nixl.DRAM, list(ma.Addr(), stride, blk))
		require.NoError(t, err)
		defer lp.Close()
		rp, err := a.Prep(b.Name(), nixl.DRAM, list(mb.Addr(), stride, blk))
		require.NoError(t, err)
		defer rp.Close()
		x, err := a.MakeXfer(nixl.Read, lp, idx, rp, idx, opts...)
		require.NoError(t, err)
		return posted(x)
	}
	seq := func(ids ...int) []int { return ids }
	runs := seq(1, 2, 3, 4, 10, 11, 12, 30, 40, 41)
	t.Logf("dense, 4 runs: %d descriptors", run(blk, runs))
	require.EqualValues(t, 4, run(blk, runs), "NIXL merges runs of adjacent descriptors")
	require.EqualValues(t, 2, run(blk, seq(5, 6, 7, 8, 9, 20)))
	require.EqualValues(t, 3, run(blk, seq(3, 2, 1)), "descending indices are not merged")
	require.EqualValues(t, len(runs), run(2*blk, runs), "strided descriptors are not merged")
	if l.HasSkipDescMerge() {
		require.EqualValues(t, len(runs), run(blk, runs, nixl.WithoutDescMerge()))
	}
	x, err := a.CreateXfer(nixl.Read, nixl.DRAM, list(ma.Addr(), blk, blk)[:8], nixl.DRAM, list(mb.Addr(), blk, blk)[:8], b.Name())
	require.NoError(t, err)
	require.EqualValues(t, 8, posted(x), "CreateXfer posts its list as given")
}

// TestLayoutPlansPostedDescs READs vLLM's worked case, 63 consecutive blocks of 28 layers (vLLM 0.33
// posted 28 descriptors for it), through every layout era's read plan as the decode role prepares it
// (layout.ReadPlan.Merged), and checks NIXL's own count of posted descriptors (telemetry) against
// descmerge.Posted: one per region for the contiguous request (28; 56 in era A, which registers K and V
// as separate regions), and for a scattered one the same as without the merge. The bytes land where the
// plan says.
func TestLayoutPlansPostedDescs(t *testing.T) {
	l := nixltest.Lib(t)
	a, b := telemetryAgent(t, l, "plans-a"), telemetryAgent(t, l, "plans-b")
	for _, plan := range []layout.RegionPlan{layout.PlanSplitKV, layout.PlanKVHalves, layout.PlanPackedKV} {
		t.Run(plan.String(), func(t *testing.T) {
			g := layout.Geometry{NumLayers: 28, NumBlocks: 80, BlockSize: 16, NumKVHeads: 1, HeadDim: 8, DType: layout.BF16, Order: layout.HND, Plan: plan}
			rl := uint64(g.RegionLen())
			ma, mb := hostMem(t, int64(rl)*int64(g.NumRegions())), hostMem(t, int64(rl)*int64(g.NumRegions()))
			for i := range mb.Bytes() {
				mb.Bytes()[i] = byte(i*7 + i>>11)
			}
			bases := func(m *nixl.HostMem) []uint64 {
				out := make([]uint64, g.NumRegions())
				for r := range out {
					out[r] = m.Addr() + uint64(r)*rl
				}
				return out
			}
			connectDRAM(t, a, b, ma, mb)
			defer a.InvalidateRemoteMetadata(b.Name())

			p, err := layout.NewReadPlan(g, 1, 0, g, 1, 1)
			require.NoError(t, err)
			p = p.Merged()
			ld, err := p.LocalDescs(bases(ma), 0, 0)
			require.NoError(t, err)
			rd, err := p.RemoteDescs(bases(mb), 0)
			require.NoError(t, err)
			lp, err := a.Prep("", nixl.DRAM, nixl.DescsOf(ld))
			require.NoError(t, err)
			defer lp.Close()
			rp, err := a.Prep(b.Name(), nixl.DRAM, nixl.DescsOf(rd))
			require.NoError(t, err)
			defer rp.Close()

			contiguous := make([]int, 63)
			for i := range contiguous {
				contiguous[i] = 10 + i
			}
			scattered := []int{3, 9, 5, 40, 22, 71, 60, 18}
			for _, ids := range [][]int{contiguous, scattered} {
				li, ri, err := p.Indices(ids, ids, nil, nil)
				require.NoError(t, err)
				want := descmerge.Posted(ld, rd, li, ri)
				x, err := a.MakeXfer(nixl.Read, lp, li, rp, ri)
				require.NoError(t, err)
				postWait(t, testenv.Context(t, 30*time.Second), x)
				tel, err := x.Telemetry()
				require.NoError(t, err)
				require.NoError(t, x.Close())
				t.Logf("%d blocks: %d indices, %d descriptors posted", len(ids), len(li), tel.Descs)
				require.EqualValues(t, want, tel.Descs)
				require.EqualValues(t, len(li)*int(ld[0].Len), tel.Bytes)
				if len(ids) == len(contiguous) {
					require.Equal(t, g.NumRegions(), want)
				}
				for r := range g.NumRegions() {
					for _, id := range ids {
						off := uint64(r)*rl + uint64(id)*uint64(g.BlockLen())
						require.Equal(t, mb.Bytes()[off:off+uint64(g.BlockLen())], ma.Bytes()[off:off+uint64(g.BlockLen())], "region %d block %d", r, id)
					}
				}
			}
		})
	}
}

func TestDescsOf(t *testing.T) {
	ds := []layout.Desc{{Addr: 0x1000, Len: 64, DevID: 0}, {Addr: 0x2000, Len: 128, DevID: 3}}
	require.Equal(t, []nixl.Desc{{Addr: 0x1000, Len: 64, DevID: 0}, {Addr: 0x2000, Len: 128, DevID: 3}}, nixl.DescsOf(ds))
	require.Empty(t, nixl.DescsOf([]layout.Desc(nil)))
}
