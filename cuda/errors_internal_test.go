package cuda

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/native/nativetest"
	"github.com/gonixl/gonixl/layout"
)

func TestResultTable(t *testing.T) {
	nativetest.CheckTable(t, results, []error{ErrInvalidValue, ErrOutOfMemory, ErrNotInitialized, ErrDeinitialized,
		ErrStubLibrary, ErrDeviceUnavailable, ErrNoDevice, ErrInvalidDevice, ErrInvalidContext, ErrInvalidHandle,
		ErrNotFound, ErrNotReady, ErrIllegalAddress, ErrAlreadyRegistered, ErrNotRegistered, ErrNotPermitted,
		ErrNotSupported, ErrSystemNotReady, ErrDriverMismatch, ErrUnknown}, Result(12345))
}

func TestDriverError(t *testing.T) {
	require.NoError(t, check(Success, "cuMemAlloc_v2", ""))
	err := check(Result(2), "cuMemAlloc_v2", "1 PiB")
	require.ErrorIs(t, err, ErrOutOfMemory)
	var ce *Error
	require.True(t, errors.As(err, &ce))
	assert.True(t, ce.Native)
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name)
	for _, part := range []string{"cuda: cuMemAlloc_v2: 1 PiB: CUDA_ERROR_OUT_OF_MEMORY (2)", ce.Desc, "free device memory"} {
		assert.Contains(t, err.Error(), part)
	}

	// A status the table does not know is still its own sentinel.
	err = check(Result(719), "cuStreamSynchronize", "")
	require.ErrorIs(t, err, Result(719))
	require.NotErrorIs(t, err, ErrUnknown)
}

func TestRefusedBeforeTheDriver(t *testing.T) {
	err := results.Refused("open device", ErrInvalidDevice, "ordinal 7, 1 device(s) visible")
	require.ErrorIs(t, err, ErrInvalidDevice)
	assert.False(t, err.Native)
	assert.Contains(t, err.Error(), "cuda: open device: ordinal 7, 1 device(s) visible: CUDA_ERROR_INVALID_DEVICE")

	err2 := closedErr("stream")
	require.ErrorIs(t, err2, ErrClosed)
	var ce *Error
	require.True(t, errors.As(err2, &ce))
	assert.False(t, ce.Native)
	assert.Equal(t, "cuda: stream: used after Close: handle closed", err2.Error())
}

func TestRefusalsAreErrors(t *testing.T) {
	_, load := Load(LoadOptions{NoSearch: true})
	_, vram := NewKVCache(nil, layout.Geometry{})
	_, host := NewHostKVCache(nil, layout.Geometry{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	wait := pollWait(ctx, func() Result { return Result(600) }, "cuStreamQuery")
	// KVCache.Do (the connector's DeviceContext) refuses a closed cache, and a closed device, before fn or
	// the driver: both need no GPU.
	ran := false
	fn := func() error { ran = true; return nil }
	closedCache := (&KVCache{cache: cache{closed: true}, dev: &Device{st: &devState{}}}).Do(fn)
	closedDev := (&KVCache{dev: &Device{st: &devState{ordinal: 3, closed: true}}}).Do(fn)
	require.False(t, ran, "fn ran on a closed cache or device")
	nativetest.CheckRefusals(t, results, []nativetest.Refusal{
		{Name: "load", Err: load, Op: "load", Sentinels: []error{ErrInvalidValue}},
		{Name: "KV cache geometry", Err: vram, Op: "new KV cache", Sentinels: []error{ErrInvalidValue, layout.ErrInvalidGeometry}},
		{Name: "host KV cache geometry", Err: host, Op: "new host KV cache", Sentinels: []error{ErrInvalidValue, layout.ErrInvalidGeometry}},
		{Name: "closed", Err: closedErr("stream"), Op: "stream", Sentinels: []error{ErrClosed}},
		{Name: "Do on a closed KV cache", Err: closedCache, Op: "KV cache", Sentinels: []error{ErrClosed}},
		{Name: "Do on a closed device", Err: closedDev, Op: "device 3", Sentinels: []error{ErrClosed}},
		{Name: "wait ended", Err: wait, Op: "cuStreamQuery", Sentinels: []error{context.Canceled}},
	})
}
