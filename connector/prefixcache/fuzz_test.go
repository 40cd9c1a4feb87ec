package prefixcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/blockhash"
)

// FuzzOps runs a random sequence of requests (acquire a prefix, alloc the rest, commit, release in any order)
// and checks the invariants: the pool never sees a double or foreign free (newPool fails the test), a held
// block is never evicted nor handed out twice, the unheld blocks stay within MaxBlocks, and every block is
// free, cached or held.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(3))
	f.Add([]byte{9, 9, 9, 1, 1, 1, 200, 100, 50}, uint8(0))
	f.Fuzz(func(t *testing.T, ops []byte, maxBlocks uint8) {
		const total = 12
		p := newPool(t, total+1)
		c, err := New(p, Config{MaxBlocks: int(maxBlocks % 8)})
		require.NoError(t, err)
		var hs []blockhash.Hash // a family of prefixes: request i uses a prefix of one of two chains
		for _, first := range []int64{1, 2} {
			toks := make([]int64, 16)
			for i := range toks {
				toks[i] = first*100 + int64(i)
			}
			hs = append(hs, hashes(t, toks)...)
		}
		var running [][]int
		holders := map[int]int{}
		for _, op := range ops {
			if op%3 == 0 && len(running) > 0 { // finish a request
				i := int(op/3) % len(running)
				for _, b := range running[i] {
					holders[b]--
				}
				_, err := c.Release(running[i])
				require.NoError(t, err)
				running = append(running[:i], running[i+1:]...)
				continue
			}
			chain := hs[:8]
			if op&1 == 1 {
				chain = hs[8:]
			}
			want := chain[:1+int(op>>4)%8]
			hit := c.Acquire(want)
			rest, evicted, err := c.Alloc(len(want) - len(hit))
			if err != nil {
				require.ErrorIs(t, err, ErrNoBlocks)
				_, err = c.Release(hit)
				require.NoError(t, err)
				continue
			}
			for _, b := range rest {
				require.Zero(t, holders[b], "block %d handed out while held", b)
			}
			_ = evicted
			_, err = c.Commit(want[len(hit):], rest)
			require.NoError(t, err)
			blocks := append(hit, rest...)
			for _, b := range blocks {
				holders[b]++
			}
			running = append(running, blocks)
			s := c.Stats()
			require.LessOrEqual(t, s.Unheld, int(maxBlocks%8))
			require.Equal(t, total, p.Available()+len(p.used))
			require.Equal(t, len(p.used), s.Cached+s.Uncached)
		}
	})
}
