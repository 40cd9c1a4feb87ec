package layout

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/descmerge"
)

// idPatterns are the block-id allocations a decode worker sees: a fresh request's blocks (mostly one
// run), scattered blocks of a long-running pool, a mix of runs and singles, and reversed order.
func idPatterns(r *rand.Rand, n, numBlocks int) map[string][]int {
	perm := r.Perm(numBlocks - 1)
	scattered := make([]int, n)
	for i := range scattered {
		scattered[i] = perm[i] + 1
	}
	contiguous := make([]int, n)
	start := 1 + r.IntN(numBlocks-n)
	for i := range contiguous {
		contiguous[i] = start + i
	}
	var mixed []int
	used := map[int]bool{}
	for len(mixed) < n {
		b := 1 + r.IntN(numBlocks-1)
		for k := 0; k < 1+r.IntN(5) && len(mixed) < n && b < numBlocks && !used[b]; k++ {
			used[b] = true
			mixed = append(mixed, b)
			b++
		}
	}
	desc := slices.Clone(contiguous)
	slices.Reverse(desc)
	return map[string][]int{"scattered": scattered, "contiguous": contiguous, "mixed": mixed, "descending": desc}
}

// runsOf counts maximal runs of consecutive ids (each +1 of the previous) on both sides at once.
func runsOf(a, b []int) int {
	n := 0
	for i := range a {
		if i == 0 || a[i] != a[i-1]+1 || b[i] != b[i-1]+1 {
			n++
		}
	}
	return n
}

// byteMap expands paired descriptors into local byte → remote byte at a granularity of unit bytes.
func byteMap(t *testing.T, local, remote []Desc, li, ri []int, unit uint64) map[uint64]uint64 {
	m := map[uint64]uint64{}
	for i := range li {
		l, r := local[li[i]], remote[ri[i]]
		require.Equal(t, l.Len, r.Len)
		require.Zero(t, l.Len%unit)
		for o := uint64(0); o < l.Len; o += unit {
			_, dup := m[l.Addr+o]
			require.False(t, dup, "local byte %#x written twice", l.Addr+o)
			m[l.Addr+o] = r.Addr + o
		}
	}
	return m
}

// TestMergedPlanMovesTheSameBytes checks, for every layout era, both block orders, several TP pairings and
// every id pattern, that the merged plan pairs exactly the bytes vLLM's lists pair, and that the descriptors
// NIXL posts are one per descriptor region and run of consecutive ids where the lists are dense (and never
// more than vLLM's count).
func TestMergedPlanMovesTheSameBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 34))
	type tp struct{ dTP, dRank, pTP, heads, ratio int }
	for _, plan := range []RegionPlan{PlanSplitKV, PlanKVHalves, PlanPackedKV} {
		for _, order := range []BlockOrder{NHD, HND} {
			for _, c := range []tp{{1, 0, 1, 2, 1}, {1, 0, 1, 2, 2}, {2, 1, 1, 4, 1}, {1, 0, 2, 4, 1}} {
				if order == NHD && c.dTP != c.pTP {
					continue // heterogeneous TP needs HND
				}
				name := fmt.Sprintf("%v/%v/D%d.%d-P%d/ratio%d", plan, order, c.dTP, c.dRank, c.pTP, c.ratio)
				t.Run(name, func(t *testing.T) {
					local := Geometry{NumLayers: 3, NumBlocks: 40, BlockSize: 4 * c.ratio, NumKVHeads: c.heads / c.dTP, HeadDim: 8, DType: BF16, Order: order, Plan: plan}
					remote := local
					remote.NumKVHeads, remote.BlockSize, remote.NumBlocks = c.heads/c.pTP, 4, 40*c.ratio
					p, err := NewReadPlan(local, c.dTP, c.dRank, remote, c.pTP, c.heads)
					require.NoError(t, err)
					m := p.Merged()
					require.Equal(t, plan == PlanKVHalves && c.ratio == 1 && c.dTP == c.pTP, m.WholeBlocks())
					lb := []uint64{1 << 30, 2 << 30, 3 << 30, 4 << 30, 5 << 30, 6 << 30}[:local.NumRegions()]
					rb := []uint64{11 << 30, 12 << 30, 13 << 30, 14 << 30, 15 << 30, 16 << 30}[:remote.NumRegions()]
					for pat, ids := range idPatterns(r, 12, local.NumBlocks) {
						remoteIDs := ids
						if c.ratio > 1 { // D block b holds P blocks b·ratio..b·ratio+ratio-1
							remoteIDs = nil
							for _, b := range ids {
								for k := range c.ratio {
									remoteIDs = append(remoteIDs, b*c.ratio+k)
								}
							}
						}
						for _, src := range p.SourceRanks() {
							var maps [2]map[uint64]uint64
							var counts [2]int
							for k, q := range []*ReadPlan{p, m} {
								ld, err := q.LocalDescs(lb, 0, src)
								require.NoError(t, err)
								rd, err := q.RemoteDescs(rb, 0)
								require.NoError(t, err)
								li, ri, err := q.Indices(ids, remoteIDs, nil, nil)
								require.NoError(t, err)
								maps[k] = byteMap(t, ld, rd, li, ri, 16)
								counts[k] = descmerge.Posted(ld, rd, li, ri)
								if q.WholeBlocks() || (plan != PlanKVHalves && q.HeadOffset() == 0 && len(q.SourceRanks()) == 1) {
									// dense lists: one descriptor per descriptor region and run
									require.Equal(t, q.descRegions()*runsOf(li[:len(li)/q.descRegions()], ri[:len(ri)/q.descRegions()]), counts[k], pat)
								}
							}
							require.Equal(t, maps[0], maps[1], "%s: merged plan pairs other bytes", pat)
							require.LessOrEqual(t, counts[1], counts[0], pat)
							if m.WholeBlocks() && pat == "contiguous" {
								require.Equal(t, local.NumRegions(), counts[1])
								require.Equal(t, 2*local.NumRegions()*len(ids), counts[0])
							}
						}
					}
				})
			}
		}
	}
}
