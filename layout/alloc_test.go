package layout

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoAllocation: the hot paths allocate nothing in steady state (long id lists use a pooled bitset).
func TestNoAllocation(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("coverage and race instrumentation allocate (sync.Pool drops items under -race)")
	}
	bs := newBenchSetup(benchModel{"tiny", 2}, NHD)
	g := bs.g
	region, src := bs.regions[0], bs.srcs[0]
	idx := make([]int, 0, g.NumDescRegions()*len(bs.q.BlockIDs))
	blk := make([]byte, int64(g.NumBlocks)*g.KVBlockLen())
	other := make([]byte, g.RegionLen())
	for name, f := range map[string]func(){
		"ToPaged":    func() { _ = g.ToPaged(region, K, src, bs.s, bs.q) },
		"ToPagedHND": func() { _ = g.Swapped().ToPaged(region, V, src, bs.s, bs.q) },
		"FromPaged":  func() { _ = g.FromPaged(src, bs.s, K, region, bs.q) },
		"BlocksToPaged": func() {
			_ = g.BlocksToPaged(region, K, blk, BlockSource{NumBlocks: g.NumBlocks, Order: HND}, bs.q.BlockIDs)
		},
		"Reorder":     func() { _ = g.Reorder(other, region, bs.q.BlockIDs) },
		"DescIndices": func() { idx, _ = g.DescIndices(bs.q.BlockIDs, idx) },
	} {
		f()
		require.Zero(t, testing.AllocsPerRun(20, f), name)
	}
	require.Greater(t, len(bs.q.BlockIDs), 32, "exercise the pooled duplicate check")
}
