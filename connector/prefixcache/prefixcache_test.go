package prefixcache

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/blockhash"
)

// pool is a minimal Pool over ids 1..n-1 that fails the test on a double free or a foreign id.
type pool struct {
	t    *testing.T
	free []int
	used map[int]bool
}

func newPool(t *testing.T, n int) *pool {
	p := &pool{t: t, used: map[int]bool{}}
	for id := 1; id < n; id++ {
		p.free = append(p.free, id)
	}
	return p
}

func (p *pool) Alloc(n int) ([]int, error) {
	if n > len(p.free) {
		return nil, fmt.Errorf("want %d, %d free", n, len(p.free))
	}
	ids := slices.Clone(p.free[:n])
	p.free = p.free[n:]
	for _, id := range ids {
		p.used[id] = true
	}
	return ids, nil
}

func (p *pool) Free(ids []int) {
	for _, id := range ids {
		require.True(p.t, p.used[id], "free of block %d, not allocated", id)
		delete(p.used, id)
		p.free = append(p.free, id)
	}
}

func (p *pool) Available() int { return len(p.free) }

func hashes(t *testing.T, toks []int64) []blockhash.Hash {
	r, err := blockhash.ReleaseByName("0.31")
	require.NoError(t, err)
	h, err := blockhash.New(blockhash.Config{Release: r, BlockSize: 2})
	require.NoError(t, err)
	out, err := h.Hashes(toks, "")
	require.NoError(t, err)
	return out
}

// A finished request's blocks serve the next request sharing its prefix; only unheld blocks are evicted, least
// recently released first, under allocation pressure and past MaxBlocks.
func TestReuseAndEviction(t *testing.T) {
	p := newPool(t, 7) // 6 usable blocks
	c, err := New(p, Config{MaxBlocks: 4})
	require.NoError(t, err)

	a := hashes(t, []int64{1, 2, 3, 4, 5, 6}) // 3 blocks
	assert.Empty(t, c.Acquire(a))
	blocksA, ev, err := c.Alloc(3)
	require.NoError(t, err)
	assert.Empty(t, ev)
	stored, err := c.Commit(a, blocksA)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, stored)

	// B shares A's first two blocks while A still holds them: shared, read-only.
	b := hashes(t, []int64{1, 2, 3, 4, 9, 9})
	hit := c.Acquire(b)
	assert.Equal(t, blocksA[:2], hit)
	rest, _, err := c.Alloc(1)
	require.NoError(t, err)
	_, err = c.Commit(b[2:], rest)
	require.NoError(t, err)
	assert.Equal(t, Stats{Cached: 4}, c.Stats())

	// A finishes: its blocks stay cached; B still holds two of them.
	ev, err = c.Release(blocksA)
	require.NoError(t, err)
	assert.Empty(t, ev)
	assert.Equal(t, Stats{Cached: 4, Unheld: 1}, c.Stats())

	// Pressure: 2 free + 1 unheld; a request for 4 fails without evicting anything, one for 3 evicts A's last.
	_, _, err = c.Alloc(4)
	require.ErrorIs(t, err, ErrNoBlocks)
	assert.Equal(t, 4, c.Stats().Cached)
	blocksC, ev, err := c.Alloc(3)
	require.NoError(t, err)
	assert.Equal(t, []blockhash.Hash{a[2]}, ev)
	assert.NotContains(t, blocksC, blocksA[0])
	assert.NotContains(t, blocksC, blocksA[1])

	// C finishes uncommitted: its blocks go straight back. B finishes: all its blocks unheld, bounded by 4.
	_, err = c.Release(blocksC)
	require.NoError(t, err)
	ev, err = c.Release(append(hit, rest...))
	require.NoError(t, err)
	assert.Empty(t, ev)
	assert.Equal(t, Stats{Cached: 3, Unheld: 3}, c.Stats())
	assert.Equal(t, 3, p.Available())

	// A again: two blocks hit, the third was evicted.
	assert.Equal(t, blocksA[:2], c.Acquire(a))
	ev, err = c.Release(blocksA[:2])
	require.NoError(t, err)
	assert.Empty(t, ev)

	// Misuse is refused.
	_, err = c.Release(blocksA[:1])
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.Commit(a[:1], []int{blocksA[0]})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.Commit(a, blocksA[:1])
	require.ErrorIs(t, err, ErrInvalid)
	_, _, err = c.Alloc(-1)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(p, Config{MaxBlocks: -1})
	require.ErrorIs(t, err, ErrInvalid)
}

// MaxBlocks bounds the unheld blocks: releasing past it evicts the least recently released.
func TestMaxBlocks(t *testing.T) {
	p := newPool(t, 9)
	c, err := New(p, Config{MaxBlocks: 2})
	require.NoError(t, err)
	hs := hashes(t, []int64{1, 2, 3, 4, 5, 6})
	blocks, _, err := c.Alloc(3)
	require.NoError(t, err)
	_, err = c.Commit(hs, blocks)
	require.NoError(t, err)
	ev, err := c.Release([]int{blocks[2], blocks[1], blocks[0]})
	require.NoError(t, err)
	assert.Equal(t, []blockhash.Hash{hs[2]}, ev)
	assert.Equal(t, Stats{Cached: 2, Unheld: 2}, c.Stats())
	assert.Equal(t, 6, p.Available())

	off, err := New(newPool(t, 4), Config{})
	require.NoError(t, err)
	blocks, _, err = off.Alloc(1)
	require.NoError(t, err)
	_, err = off.Commit(hs[:1], blocks)
	require.NoError(t, err)
	ev, err = off.Release(blocks)
	require.NoError(t, err)
	assert.Equal(t, hs[:1], ev)
	assert.Equal(t, Stats{}, off.Stats())
}

// A hash another request cached first keeps its block: Commit reports only what it cached, and Reset waits
// until no cached block is held.
func TestCommitRaceAndReset(t *testing.T) {
	p := newPool(t, 9)
	c, err := New(p, Config{MaxBlocks: 8})
	require.NoError(t, err)
	hs := hashes(t, []int64{1, 2, 3, 4})
	first, _, err := c.Alloc(2)
	require.NoError(t, err)
	second, _, err := c.Alloc(2)
	require.NoError(t, err)
	stored, err := c.Commit(hs, first)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, stored)
	stored, err = c.Commit(hs, second)
	require.NoError(t, err)
	assert.Empty(t, stored)
	assert.Equal(t, Stats{Cached: 2, Uncached: 2}, c.Stats())

	_, ok := c.Reset()
	assert.False(t, ok, "Reset while a cached block is held")
	_, err = c.Release(append(first, second...))
	require.NoError(t, err)
	dropped, ok := c.Reset()
	require.True(t, ok)
	assert.ElementsMatch(t, hs, dropped)
	assert.Equal(t, Stats{}, c.Stats())
	assert.Equal(t, 8, p.Available())
}
