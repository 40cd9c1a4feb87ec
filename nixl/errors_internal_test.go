package nixl

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/native/nativetest"
)

func TestStatusTable(t *testing.T) {
	nativetest.CheckTable(t, statuses,
		[]error{ErrInvalidParam, ErrBackend, ErrInvalidState, ErrException, ErrNoTelemetry, ErrNotFound}, Status(-42))
	assert.Equal(t, "NIXL_CAPI_ERROR_NOT_FOUND", StatusNotFound.String())
	assert.Equal(t, "NIXL_CAPI_IN_PROG", StatusInProgress.String())
	assert.Equal(t, "nixl_capi_status_t(-42)", Status(-42).String())
}

func TestCheck(t *testing.T) {
	require.NoError(t, check("post", status(StatusSuccess), ""))
	require.NoError(t, check("post", status(StatusInProgress), ""), "in progress is no error")

	err := check("load remote metadata", status(StatusNotFound), "agent \"peer\"")
	require.ErrorIs(t, err, ErrNotFound)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.Equal(t, StatusNotFound, e.Code)
	assert.Equal(t, "NIXL_CAPI_ERROR_NOT_FOUND", e.Name)
	assert.True(t, e.Native)
	assert.Equal(t, `nixl: load remote metadata: agent "peer": NIXL_CAPI_ERROR_NOT_FOUND (-6) — `+statuses.Rows[StatusNotFound].Hint,
		err.Error())
}

func TestGoSideRefusals(t *testing.T) {
	err := goErr("register memory", ErrInvalidParam, "descriptor 0 has length 0")
	require.ErrorIs(t, err, ErrInvalidParam)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.False(t, e.Native)
	assert.Equal(t, StatusInvalidParam, e.Code, "the status NIXL would have given")
	assert.Contains(t, err.Error(), "nixl: register memory: descriptor 0 has length 0: invalid parameter")

	// Sentinels no C API status stands for: ErrClosed, ErrIndexOutOfRange.
	for _, s := range []error{ErrClosed, ErrIndexOutOfRange} {
		err = goErr("post", s, "agent \"a\"")
		require.ErrorIs(t, err, s)
		require.True(t, errors.As(err, &e))
		assert.Equal(t, StatusSuccess, e.Code)
		assert.Empty(t, e.Name)
		assert.False(t, e.Native)
		assert.Equal(t, `nixl: post: agent "a": `+s.Error()[len("nixl: "):], err.Error())
	}
}

func TestRefusalsAreErrors(t *testing.T) {
	_, ucx := UCXOptions{NumThreads: -1}.Params()
	_, mem := ParseMemType("HBM")
	_, host := AllocHost(0, HostOptions{})
	_, agent := (*Library)(nil).NewAgent("a", AgentConfig{})
	_, agentName := (&Library{}).NewAgent("", AgentConfig{})
	nativetest.CheckRefusals(t, statuses, []nativetest.Refusal{
		{Name: "UCX options", Err: ucx, Op: "UCX options", Sentinels: []error{ErrInvalidParam}},
		{Name: "memory type", Err: mem, Op: "parse memory type", Sentinels: []error{ErrInvalidParam}},
		{Name: "host size", Err: host, Op: "allocate host memory", Sentinels: []error{ErrInvalidParam}},
		{Name: "nil library", Err: agent, Op: "create agent", Sentinels: []error{ErrNotLoaded}},
		{Name: "agent name", Err: agentName, Op: "create agent", Sentinels: []error{ErrInvalidParam}},
		{Name: "wait ended", Err: goErr("wait for transfer", nil, "%v with %s: %w", Read, "peer", context.Canceled),
			Op: "wait for transfer", Sentinels: []error{context.Canceled}},
	})
}
