package neuron

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/native/nativetest"
)

func TestStatusTable(t *testing.T) {
	nativetest.CheckTable(t, statuses, []error{ErrFailure, ErrInvalid, ErrInvalidHandle, ErrResource, ErrTimeout,
		ErrHardware, ErrQueue, ErrNotEnoughCores, ErrUninitialized, ErrClosed, ErrExecution}, Status(777))
	assert.Equal(t, "NRT_TIMEOUT", Status(5).String())
	assert.Equal(t, "NRT_STATUS(777)", Status(777).String())
}

func TestStatusError(t *testing.T) {
	require.NoError(t, statusError("nrt_tensor_read", 0, ""))

	err := statusError("nrt_tensor_read", 5, "operation timed out")
	require.ErrorIs(t, err, ErrTimeout)
	var ne *Error
	require.True(t, errors.As(err, &ne))
	assert.Equal(t, Status(5), ne.Code)
	assert.Equal(t, "operation timed out", ne.Desc)
	assert.True(t, ne.Native)
	assert.Equal(t, "neuron: nrt_tensor_read: NRT_TIMEOUT (5): operation timed out — "+statuses.Rows[5].Hint, err.Error())

	// A runtime whose description only repeats the name adds nothing to the message.
	assert.Equal(t, "neuron: nrt_tensor_read: NRT_CLOSED (14) — "+statuses.Rows[14].Hint,
		statusError("nrt_tensor_read", 14, "NRT_CLOSED").Error())
}
