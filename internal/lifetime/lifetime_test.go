package lifetime

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCloseOnce(t *testing.T) {
	var mu sync.RWMutex
	var closed bool
	boom := errors.New("boom")
	runs := 0
	teardown := func() error {
		runs++
		require.False(t, mu.TryRLock(), "teardown runs under the write lock")
		return boom
	}
	require.ErrorIs(t, CloseOnce(&mu, &closed, teardown), boom)
	require.True(t, closed)
	require.NoError(t, CloseOnce(&mu, &closed, teardown), "a second Close does nothing")
	require.Equal(t, 1, runs)
	require.True(t, mu.TryLock(), "the lock is released")
	mu.Unlock()
}

func TestCloseOnceConcurrent(t *testing.T) {
	var mu sync.Mutex
	var closed bool
	var runs int // guarded by mu: teardown runs under it
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = CloseOnce(&mu, &closed, func() error { runs++; return nil })
		}()
	}
	wg.Wait()
	require.Equal(t, 1, runs)
}
