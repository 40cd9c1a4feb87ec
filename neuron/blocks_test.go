package neuron

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/layout"
)

func TestBlockPoolNeverHandsOutNullBlock(t *testing.T) {
	p, err := NewBlockPool(5, PoolOptions{})
	require.NoError(t, err)
	ids, err := p.Reserve(4)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4}, ids, "a fresh pool hands out 1..n like vLLM's")
	_, err = p.Reserve(1)
	require.ErrorIs(t, err, ErrNoBlocks)
	require.NoError(t, p.Release([]int{3, 1}))
	again, err := p.Reserve(2)
	require.NoError(t, err)
	assert.ElementsMatch(t, []int{1, 3}, again)

	_, err = NewBlockPool(1, PoolOptions{})
	require.ErrorIs(t, err, ErrBadArgument)
	_, err = p.Reserve(0)
	require.ErrorIs(t, err, ErrBadArgument)
}

func TestBlockPoolReleaseIsAllOrNothing(t *testing.T) {
	p, err := NewBlockPool(8, PoolOptions{})
	require.NoError(t, err)
	ids, err := p.Reserve(3)
	require.NoError(t, err)
	for _, bad := range [][]int{{ids[0], 0}, {ids[0], 8}, {ids[0], -1}, {ids[0], ids[0]}, {ids[0], 7}} {
		require.Error(t, p.Release(bad), "%v", bad)
		assert.True(t, p.Reserved(ids[0]), "nothing released on error (%v)", bad)
	}
	require.ErrorIs(t, p.Release([]int{7}), ErrNotReserved)
	require.NoError(t, p.Release(ids))
	require.ErrorIs(t, p.Release(ids[:1]), ErrNotReserved, "double release")
	assert.Equal(t, 7, p.Free())
}

func TestBlockPoolLeases(t *testing.T) {
	var now atomic.Int64
	p, err := NewBlockPool(4, PoolOptions{LeaseTimeout: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	require.NoError(t, err)
	a, err := p.Reserve(2)
	require.NoError(t, err)
	now.Add(int64(30 * time.Second))
	b, err := p.Reserve(1)
	require.NoError(t, err)
	now.Add(int64(31 * time.Second))
	assert.ElementsMatch(t, a, p.Reclaim(), "only a's lease ran out")
	assert.True(t, p.Reserved(b[0]))
	require.NoError(t, p.Renew(b))
	now.Add(int64(59 * time.Second))
	assert.Empty(t, p.Reclaim(), "renewed")

	// Blocks being staged are never reclaimed nor released.
	require.NoError(t, p.beginStaging(b))
	now.Add(int64(time.Hour))
	assert.Empty(t, p.Reclaim())
	require.ErrorIs(t, p.Release(b), ErrBadArgument)
	require.Error(t, p.beginStaging(b), "already being staged")
	p.endStaging(b, true)
	assert.Empty(t, p.Reclaim(), "the lease restarted when staging ended")
	require.NoError(t, p.Release(b))
}

func TestBlockPoolConcurrent(t *testing.T) {
	p, err := NewBlockPool(65, PoolOptions{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var owned sync.Map
	for range 8 {
		wg.Go(func() {
			for range 200 {
				ids, err := p.Reserve(3)
				if err != nil {
					continue
				}
				for _, id := range ids {
					if _, dup := owned.LoadOrStore(id, true); dup {
						t.Errorf("block %d handed out twice", id)
					}
				}
				for _, id := range ids {
					owned.Delete(id)
				}
				if err := p.Release(ids); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 64, p.Free())
}

func TestBlockPoolWithoutLeases(t *testing.T) {
	var now atomic.Int64
	p, err := NewBlockPool(3, PoolOptions{LeaseTimeout: -1, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	require.NoError(t, err)
	ids, err := p.Reserve(2)
	require.NoError(t, err)
	now.Add(int64(100 * time.Hour))
	assert.Empty(t, p.Reclaim())
	_, err = p.Reserve(1)
	require.ErrorIs(t, err, ErrNoBlocks)
	require.NoError(t, p.Release(ids))
}

// The pool's exhaustion error is the one sentinel every allocator wraps (layout.ErrNoBlocks, which
// connector.ErrNoBlocks is), so a prefill role's caller recognizes it whichever allocator ran out.
func TestNoBlocksIsShared(t *testing.T) {
	require.ErrorIs(t, ErrNoBlocks, layout.ErrNoBlocks)
}
