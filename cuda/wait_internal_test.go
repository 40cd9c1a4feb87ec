package cuda

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPollWait(t *testing.T) {
	// Done after a few polls (past the spinning phase, into the backoff).
	n := 0
	err := pollWait(context.Background(), func() Result {
		n++
		if n < 100 {
			return Result(600) // CUDA_ERROR_NOT_READY
		}
		return Success
	}, "cuStreamQuery")
	require.NoError(t, err)
	require.Equal(t, 100, n)

	// Never done: the context bounds the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = pollWait(ctx, func() Result { return Result(600) }, "cuEventQuery")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "cuEventQuery")
	require.Less(t, time.Since(start), 20*time.Second, "bounded by the context (generous: a loaded machine)")

	// A failure ends the wait with the driver's status.
	err = pollWait(context.Background(), func() Result { return Result(700) }, "cuStreamQuery")
	require.ErrorIs(t, err, ErrIllegalAddress)
	var ce *Error
	require.True(t, errors.As(err, &ce))
	require.True(t, ce.Native)
}

func TestQueryDone(t *testing.T) {
	done, err := queryDone(Success, "cuEventQuery")
	require.NoError(t, err)
	require.True(t, done)
	done, err = queryDone(Result(600), "cuEventQuery") // CUDA_ERROR_NOT_READY: still running
	require.NoError(t, err)
	require.False(t, done)
	done, err = queryDone(Result(700), "cuStreamQuery")
	require.ErrorIs(t, err, ErrIllegalAddress)
	require.Contains(t, err.Error(), "cuStreamQuery")
	require.False(t, done)
}
