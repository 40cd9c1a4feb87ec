package poll

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestUntilDone(t *testing.T) {
	// Past the spinning phase and into the backoff.
	n := 0
	err := Default.Until(context.Background(), func() bool { n++; return n == 100 })
	require.NoError(t, err)
	require.Equal(t, 100, n)
}

func TestUntilDoneBeforeContext(t *testing.T) {
	// Finished work is reported as finished even when the context has already ended.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n := 0
	require.NoError(t, Default.Until(ctx, func() bool { n++; return true }))
	require.Equal(t, 1, n)
	n = 0
	require.ErrorIs(t, Default.Until(ctx, func() bool { n++; return false }), context.Canceled)
	require.Equal(t, 1, n)
}

func TestUntilContextEnds(t *testing.T) {
	for _, b := range []Backoff{Default, {}, {Spins: 0, Min: time.Hour, Max: time.Hour}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		n := 0
		err := b.Until(ctx, func() bool { n++; return false })
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "%+v", b)
		require.Positive(t, n)
	}
}

func TestUntilDelayCapped(t *testing.T) {
	// With no spins and a tiny cap, many polls fit in a short while: the delay does not keep doubling.
	// Doubling without the cap would sleep for years; the context turns that into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := Backoff{Min: time.Microsecond, Max: 10 * time.Microsecond}
	n := 0
	require.NoError(t, b.Until(ctx, func() bool { n++; return n == 50 }))
	require.Equal(t, 50, n)
}
