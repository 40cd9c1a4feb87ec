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

func TestOnce(t *testing.T) {
	var o Once
	boom := errors.New("boom")
	runs := 0
	require.ErrorIs(t, o.Close(func() error { runs++; return boom }), boom, "the first Close returns teardown's error")
	require.NoError(t, o.Close(func() error { runs++; return boom }), "a second Close returns nil")
	require.Equal(t, 1, runs)
}

// A Close that races the first waits until the teardown has returned, and returns nil.
func TestOnceConcurrent(t *testing.T) {
	var o Once
	started, release := make(chan struct{}), make(chan struct{})
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer done.Done()
		_ = o.Close(func() error { close(started); <-release; return errors.New("first") })
	}()
	<-started
	second := make(chan error, 1)
	go func() { second <- o.Close(func() error { return errors.New("ran twice") }) }()
	select {
	case err := <-second:
		t.Fatalf("the second Close returned (%v) before the first's teardown did", err)
	default:
	}
	close(release)
	done.Wait()
	require.NoError(t, <-second)
}
