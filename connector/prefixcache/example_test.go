package prefixcache_test

import (
	"fmt"

	"github.com/gonixl/gonixl/connector/blockhash"
	"github.com/gonixl/gonixl/connector/prefixcache"
)

// ids is a tiny block pool (connector.BlockPool in a prefill worker).
type ids struct{ free []int }

func (p *ids) Alloc(n int) ([]int, error) {
	if n > len(p.free) {
		return nil, fmt.Errorf("want %d, %d free", n, len(p.free))
	}
	out := append([]int(nil), p.free[:n]...)
	p.free = p.free[n:]
	return out, nil
}
func (p *ids) Free(b []int)   { p.free = append(p.free, b...) }
func (p *ids) Available() int { return len(p.free) }

// A second prompt sharing the first one's prefix reuses its cached blocks and allocates only the rest.
func ExampleCache() {
	rel, _ := blockhash.ReleaseFor("0.33.0")
	h, _ := blockhash.New(blockhash.Config{Release: rel, BlockSize: 4})
	cache, _ := prefixcache.New(&ids{free: []int{1, 2, 3, 4, 5, 6}}, prefixcache.Config{MaxBlocks: 4})

	first, _ := h.Hashes([]int64{1, 2, 3, 4, 5, 6, 7, 8}, "")
	blocks, _, _ := cache.Alloc(len(first)) // nothing cached yet: fill both blocks
	_, _ = cache.Commit(first, blocks)      // once filled
	_, _ = cache.Release(blocks)            // the decode peer has read them

	second, _ := h.Hashes([]int64{1, 2, 3, 4, 9, 9, 9, 9}, "")
	hit := cache.Acquire(second)
	rest, _, _ := cache.Alloc(len(second) - len(hit))
	fmt.Println("reused", hit, "filled", rest)
	// Output: reused [1] filled [3]
}
