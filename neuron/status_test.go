package neuron

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/native/nativetest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
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

// Every call this package refuses before libnrt is an *Error too (Native false), matching the same
// sentinels as before, and a cause from layout (a geometry or block id refused) as well.
func TestRefusalsAreErrors(t *testing.T) {
	var refusals []nativetest.Refusal
	add := func(name, op string, err error, sentinels ...error) {
		refusals = append(refusals, nativetest.Refusal{Name: name, Err: err, Op: op, Sentinels: sentinels})
	}
	_, err := Load(LoadOptions{NoSearch: true})
	add("load without path", "load", err, ErrBadArgument)
	_, err = Load(LoadOptions{Path: "libm.so.6"})
	add("not libnrt", "load", err, ErrSymbol)

	r := openFake(t, LoadOptions{})
	_, err = Load(LoadOptions{Path: fakeLib})
	add("busy", "load", err, ErrBusy)
	_, err = r.Allocate(PlacementHost, 0, 0, "empty")
	add("size 0", "allocate", err, ErrBadArgument)
	tensor, err := r.Allocate(PlacementHost, 0, 64, "t")
	require.NoError(t, err)
	add("outside the tensor", "tensor read", tensor.Read(make([]byte, 8), 60), ErrBadArgument)
	require.NoError(t, tensor.Free())
	add("freed", "tensor write", tensor.Write(make([]byte, 8), 0), ErrInvalidHandle)

	spec := smallSpec(false)
	bad := spec
	bad.NumLayers = 0
	_, err = NewHostSource(bad, nil, nil)
	add("source spec", "new host source", err, ErrBadArgument)
	_, err = NewHostSource(spec, nil, nil)
	add("host buffers", "new host source", err, ErrBadArgument)
	_, err = NewDeviceSourceFromState(spec, map[string]*Tensor{})
	add("state", "new device source from state", err, ErrBadArgument)
	src := newTestCache(spec).host(t)
	_, err = src.Fetch(9, layout.K, 0, 0, 1, 1, nil)
	add("fetch layer", "fetch", err, ErrBadArgument)

	g := smallGeometry(layout.HND, layout.PlanSplitKV)
	_, err = NewStager(StagerConfig{Geometry: layout.Geometry{NumBlocks: 4}, Source: src})
	add("stager geometry", "new stager", err, ErrBadArgument, layout.ErrInvalidGeometry)
	_, err = NewStager(StagerConfig{Geometry: g, SchedulerBlocks: 33, Source: src, FirstHead: 1})
	add("scheduler pool", "new stager", err, ErrBadArgument, layout.ErrBlockOutOfRange)
	_, err = NewStager(StagerConfig{Geometry: g, Source: src, FirstHead: 1, MaxArenaBytes: g.TotalBytes() - 1})
	add("arena", "new stager", err, ErrTooLarge)
	s := newStager(t, StagerConfig{Geometry: g, Source: src, FirstHead: 1})
	add("request", "stage", s.Stage(testenv.Context(t, 30*time.Second), Request{ID: "a", Tokens: 0}), ErrBadArgument)
	add("block ids", "stage", s.Stage(testenv.Context(t, 30*time.Second), Request{ID: "a", Tokens: 4, BlockIDs: []int{0}}), ErrBadArgument, layout.ErrNullBlock)
	cancelled, cancel := context.WithCancel(testenv.Context(t, 30*time.Second))
	cancel()
	add("stopped", "stage", s.Stage(cancelled, Request{ID: "a", Tokens: 4, BlockIDs: []int{1}}), context.Canceled)
	require.NoError(t, s.Close())
	add("closed stager", "stage", s.Stage(testenv.Context(t, 30*time.Second), Request{ID: "a", Tokens: 4, BlockIDs: []int{1}}), ErrClosed)
	require.NoError(t, r.Close())
	_, err = r.Allocate(PlacementHost, 0, 64, "late")
	add("closed runtime", "allocate", err, ErrClosed)

	nativetest.CheckRefusals(t, statuses, refusals)
}
