package connector

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBlockPool(t *testing.T) {
	p := NewBlockPool(8) // ids 1..7; 0 is the null block
	assert.Equal(t, 7, p.Available())
	assert.Zero(t, p.InUse())

	a, err := p.Alloc(3)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3}, a, "lowest ids first")
	b, err := p.Alloc(4)
	require.NoError(t, err)
	assert.Equal(t, 7, p.InUse())
	assert.Zero(t, p.Available())
	for _, id := range append(a, b...) {
		assert.NotZero(t, id, "block 0 is never handed out")
	}

	_, err = p.Alloc(1)
	require.ErrorIs(t, err, ErrNoBlocks)
	assert.Contains(t, err.Error(), "want 1, 0 of 7 free")
	_, err = p.Alloc(-1)
	require.ErrorIs(t, err, ErrNoBlocks)
	none, err := p.Alloc(0)
	require.NoError(t, err)
	assert.Empty(t, none)

	p.Free(a)
	p.Free(a)                // a double free is ignored
	p.Free([]int{0, 99, -1}) // ids never handed out are ignored
	assert.Equal(t, 3, p.Available())
	assert.Equal(t, 4, p.InUse())
	c, err := p.Alloc(3)
	require.NoError(t, err)
	assert.ElementsMatch(t, a, c)
	_, err = p.Alloc(1)
	require.ErrorIs(t, err, ErrNoBlocks, "the double free did not make a block available twice")

	assert.Zero(t, NewBlockPool(1).Available(), "a cache with only the null block has nothing to hand out")

	// Freed blocks come back in ascending order, lowest first, whatever order they were freed in: a request's
	// blocks stay one ascending run (one NIXL descriptor per region) where the pool has one.
	q := NewBlockPool(16)
	x, _ := q.Alloc(4) // 1..4
	y, _ := q.Alloc(3) // 5..7
	q.Free([]int{x[3], x[1], x[0], x[2]})
	z, err := q.Alloc(6)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4, 8, 9}, z)
	q.Free(y)
	q.Free(z[:2])
	w, err := q.Alloc(5)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 5, 6, 7}, w)
	assert.Zero(t, NewBlockPool(0).Available())
}

func TestBlockPoolConcurrent(t *testing.T) {
	p := NewBlockPool(65)
	var wg sync.WaitGroup
	var mu sync.Mutex
	owner := map[int]int{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				ids, err := p.Alloc(1 + i%8)
				if err != nil {
					continue
				}
				mu.Lock()
				for _, id := range ids {
					if o, ok := owner[id]; ok {
						t.Errorf("block %d handed to goroutine %d while goroutine %d holds it", id, g, o)
					}
					owner[id] = g
				}
				mu.Unlock()
				mu.Lock()
				for _, id := range ids {
					delete(owner, id)
				}
				mu.Unlock()
				p.Free(ids)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 64, p.Available())
	assert.Zero(t, p.InUse())
}
