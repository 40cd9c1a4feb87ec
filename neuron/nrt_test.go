package neuron

import (
	"bytes"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/dl"
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestOpenNotFound(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnrt.so.1")
	_, err := Load(LoadOptions{Path: missing})
	require.ErrorIs(t, err, ErrNotLoaded)
	assert.Contains(t, err.Error(), missing)
	assert.Contains(t, err.Error(), EnvLibPath)
	assert.False(t, Available(LoadOptions{Path: missing}))
	assert.True(t, Available(LoadOptions{Path: fakeLib}))
}

// The search order, pinned (the one of cuda.Load and nixl.Load): Path, $GONIXL_NRT_LIB, the soname through
// the loader, then StandardPaths.
func TestLoadSearchOrder(t *testing.T) {
	t.Setenv(EnvLibPath, "/nonexistent/env/libnrt.so.1")
	require.Equal(t, []dl.Candidate{
		{Path: "/nonexistent/opt/libnrt.so.1", Source: "LoadOptions.Path"},
		{Path: "/nonexistent/env/libnrt.so.1", Source: "$GONIXL_NRT_LIB"},
		{Path: "libnrt.so.1", Source: dl.SourceLoader},
		{Path: "/opt/aws/neuron/lib/libnrt.so.1", Source: dl.SourceStandard},
	}, LoadOptions{Path: "/nonexistent/opt/libnrt.so.1"}.candidates())
	require.Equal(t, []dl.Candidate{{Path: "/nonexistent/opt/libnrt.so.1", Source: "LoadOptions.Path"}},
		LoadOptions{Path: "/nonexistent/opt/libnrt.so.1", NoSearch: true}.candidates())
}

func TestOpenNotLibnrt(t *testing.T) {
	// A real shared library that is not libnrt: the required symbols are missing.
	_, err := Load(LoadOptions{Path: "libm.so.6"})
	require.ErrorIs(t, err, ErrSymbol)
	assert.Contains(t, err.Error(), "nrt_init")
}

func TestOpenFromEnv(t *testing.T) {
	t.Setenv(EnvLibPath, fakeLib)
	r := openFake(t, LoadOptions{Path: ""})
	assert.Equal(t, fakeLib, r.Path())
	assert.True(t, r.HasBatch())
}

func TestOpenIsExclusive(t *testing.T) {
	r := openFake(t, LoadOptions{})
	_, err := Load(LoadOptions{Path: fakeLib})
	require.ErrorIs(t, err, ErrBusy)
	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "Close is idempotent")
	r2 := openFake(t, LoadOptions{})
	require.NoError(t, r2.Close())
}

func TestCoreCount(t *testing.T) {
	t.Setenv("FAKE_NRT_NUM_CORES", "4")
	r := openFake(t, LoadOptions{})
	n, err := r.VisibleCores()
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	n, err = r.TotalCores()
	require.NoError(t, err)
	assert.Equal(t, 4, n)

	_, err = r.Allocate(PlacementDevice, 4, 64, "beyond")
	require.ErrorIs(t, err, ErrInvalid, "core 4 of 4 does not exist")
	assert.Contains(t, err.Error(), "NRT_INVALID")
}

func TestTensorRoundTrip(t *testing.T) {
	r := openFake(t, LoadOptions{})
	tn, err := r.Allocate(PlacementDevice, 1, 1<<20, "kv")
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<20), tn.Size())
	assert.Equal(t, uint64(1<<20), tn.NativeSize())
	assert.Equal(t, 1, tn.Core())
	assert.NotZero(t, tn.DeviceAddress())

	src := pattern(5000, 3)
	require.NoError(t, tn.Write(src, 4096))
	dst := make([]byte, 5000)
	require.NoError(t, tn.Read(dst, 4096))
	assert.Equal(t, src, dst)
	assert.EqualValues(t, 1, ctl(t, r, "writes"))
	assert.EqualValues(t, 1, ctl(t, r, "reads"))
	assert.EqualValues(t, 5000, ctl(t, r, "read_bytes"))

	// Unwritten device memory is not zero in the fake (as on hardware).
	require.NoError(t, tn.Read(dst[:16], 0))
	assert.Equal(t, bytes.Repeat([]byte{0xCD}, 16), dst[:16])

	require.NoError(t, tn.Free())
	require.NoError(t, tn.Free(), "Free is idempotent")
	assert.EqualValues(t, 0, ctl(t, r, "live"))
	assert.Zero(t, tn.NativeSize())
	require.ErrorIs(t, tn.Read(dst, 0), ErrInvalidHandle)
}

func TestTransferValidatedBeforeNativeCall(t *testing.T) {
	r := openFake(t, LoadOptions{})
	tn, err := r.Allocate(PlacementDevice, 0, 4096, "small")
	require.NoError(t, err)
	buf := make([]byte, 100)
	for _, off := range []uint64{4000, 4097, ^uint64(0)} {
		err := tn.Read(buf, off)
		require.ErrorIs(t, err, ErrBadArgument, "offset %d", off)
		assert.Contains(t, err.Error(), "outside tensor")
	}
	assert.EqualValues(t, 0, ctl(t, r, "reads"), "rejected reads never reach libnrt")
	_, err = r.Allocate(PlacementDevice, 0, 0, "empty")
	require.ErrorIs(t, err, ErrBadArgument)
	_, err = r.Allocate(PlacementDevice, -1, 10, "nocore")
	require.ErrorIs(t, err, ErrBadArgument)
}

func TestStatusMapping(t *testing.T) {
	cases := []struct {
		status   int64
		sentinel error
		name     string
	}{
		{5, ErrTimeout, "NRT_TIMEOUT"},
		{13, ErrUninitialized, "NRT_UNINITIALIZED"},
		{14, ErrClosed, "NRT_CLOSED"},
		{4, ErrResource, "NRT_RESOURCE"},
		{1201, ErrHardware, "NRT_EXEC_HW_ERR_HBM_UE"},
		{777, ErrFailure, "NRT_STATUS(777)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := openFake(t, LoadOptions{})
			tn, err := r.Allocate(PlacementDevice, 0, 4096, "t")
			require.NoError(t, err)
			setCtl(t, r, "fail_status", c.status)
			setCtl(t, r, "fail_read", 2)
			buf := make([]byte, 64)
			require.NoError(t, tn.Read(buf, 0), "the first read succeeds")
			err = tn.Read(buf, 64)
			require.ErrorIs(t, err, c.sentinel)
			var ne *Error
			require.ErrorAs(t, err, &ne)
			assert.EqualValues(t, c.status, ne.Code)
			assert.True(t, ne.Native)
			assert.Contains(t, err.Error(), c.name)
			require.NoError(t, tn.Read(buf, 128), "only the k-th read fails")
			require.NoError(t, r.Close())
		})
	}
}

func TestShortDevice(t *testing.T) {
	t.Setenv("FAKE_NRT_DEVICE_BYTES", "1048576")
	r := openFake(t, LoadOptions{})
	a, err := r.Allocate(PlacementDevice, 0, 768<<10, "a")
	require.NoError(t, err)
	_, err = r.Allocate(PlacementDevice, 0, 512<<10, "b")
	require.ErrorIs(t, err, ErrResource)
	assert.Contains(t, err.Error(), "device memory is exhausted")
	_, err = r.Allocate(PlacementDevice, 1, 512<<10, "other core")
	require.NoError(t, err, "each core has its own memory")
	require.NoError(t, a.Free())
	_, err = r.Allocate(PlacementDevice, 0, 512<<10, "b again")
	require.NoError(t, err, "freed memory is reusable")
	_, err = r.Allocate(PlacementHost, 0, 4<<20, "host too big")
	require.ErrorIs(t, err, ErrResource, "deprecated host placement is limited to < 4 MiB")
}

func TestMaxTransferSplitsReads(t *testing.T) {
	t.Setenv("FAKE_NRT_MAX_XFER", "4096")
	t.Setenv("FAKE_NRT_ALIGN", "256")
	{
		r := openFake(t, LoadOptions{})
		tn, err := r.Allocate(PlacementDevice, 0, 64<<10, "t")
		require.NoError(t, err)
		err = tn.Read(make([]byte, 10000), 0)
		require.ErrorIs(t, err, ErrInvalid, "the device refuses transfers above its maximum")
		assert.EqualValues(t, 1, ctl(t, r, "constraint_violations"))
		require.ErrorIs(t, tn.Read(make([]byte, 256), 100), ErrInvalid, "misaligned offset")
		require.NoError(t, r.Close())
	}
	r := openFake(t, LoadOptions{MaxTransfer: 4096})
	tn, err := r.Allocate(PlacementDevice, 0, 64<<10, "t")
	require.NoError(t, err)
	src := pattern(10000, 9)
	require.NoError(t, tn.Write(src, 512))
	dst := make([]byte, 10000)
	calls := ctl(t, r, "batch_calls")
	require.NoError(t, tn.Read(dst, 512))
	assert.Equal(t, src, dst)
	assert.EqualValues(t, 3, ctl(t, r, "reads"), "10000 bytes in pieces of at most 4096")
	assert.EqualValues(t, calls+1, ctl(t, r, "batch_calls"), "all pieces in one native call")
}

func batchRoundTrip(t *testing.T, r *Runtime) {
	a, err := r.Allocate(PlacementDevice, 0, 8192, "a")
	require.NoError(t, err)
	b, err := r.Allocate(PlacementDevice, 1, 8192, "b")
	require.NoError(t, err)
	pa, pb := pattern(8192, 1), pattern(8192, 2)
	require.NoError(t, r.WriteBatch([]Batch{{a, []Op{{0, pa}}}, {b, []Op{{0, pb[:4096]}, {4096, pb[4096:]}}}}))
	dst := make([]byte, 6*100)
	var ops []Batch
	for i, tn := range []*Tensor{a, b} {
		var o []Op
		for j := range 3 {
			k := i*3 + j
			o = append(o, Op{Offset: uint64(1000 * j), Buf: dst[k*100 : (k+1)*100]})
		}
		ops = append(ops, Batch{tn, o})
	}
	require.NoError(t, r.ReadBatch(ops))
	for j := range 3 {
		assert.Equal(t, pa[1000*j:1000*j+100], dst[j*100:(j+1)*100])
		assert.Equal(t, pb[1000*j:1000*j+100], dst[(3+j)*100:(4+j)*100])
	}
	assert.EqualValues(t, 6, ctl(t, r, "reads"))
}

func TestBatchRead(t *testing.T) {
	r := openFake(t, LoadOptions{})
	require.True(t, r.HasBatch())
	batchRoundTrip(t, r)
	assert.EqualValues(t, 2, ctl(t, r, "batch_calls"), "one write batch, one read batch")
}

func TestBatchFallbackOnOldRuntime(t *testing.T) {
	r := openFake(t, LoadOptions{Path: fakeOldLib})
	require.False(t, r.HasBatch())
	batchRoundTrip(t, r)
	assert.EqualValues(t, 0, ctl(t, r, "batch_calls"))

	// Without nrt_get_status_as_str, errors still name the status from the Go table; the failing op is named.
	tn, err := r.Allocate(PlacementDevice, 0, 4096, "t")
	require.NoError(t, err)
	setCtl(t, r, "fail_read", ctl(t, r, "reads")+2)
	err = r.ReadBatch([]Batch{{tn, []Op{{0, make([]byte, 8)}, {8, make([]byte, 8)}}}})
	require.ErrorIs(t, err, ErrTimeout)
	assert.Contains(t, err.Error(), "piece 1")
	assert.Contains(t, err.Error(), "nrt_tensor_read:")
}

func TestClosedRuntime(t *testing.T) {
	r := openFake(t, LoadOptions{})
	tn, err := r.Allocate(PlacementDevice, 0, 4096, "t")
	_, err2 := r.Allocate(PlacementVirtual, 0, 4096, "v")
	require.NoError(t, errors.Join(err, err2))
	assert.EqualValues(t, 2, ctl(t, r, "live"))
	require.NoError(t, r.Close())
	assert.EqualValues(t, 0, ctl(t, r, "live"), "Close frees every tensor")
	assert.EqualValues(t, 0, ctl(t, r, "leaked_at_close"), "before nrt_close")
	require.ErrorIs(t, tn.Read(make([]byte, 8), 0), ErrClosed)
	_, err = r.Allocate(PlacementDevice, 0, 8, "late")
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, tn.Free())
}

func TestConcurrentReads(t *testing.T) {
	r := openFake(t, LoadOptions{})
	const n = 8
	tensors := make([]*Tensor, n)
	for i := range tensors {
		var err error
		tensors[i], err = r.Allocate(PlacementDevice, i%2, 1<<16, "t")
		require.NoError(t, err)
		require.NoError(t, tensors[i].Write(pattern(1<<16, byte(i)), 0))
	}
	var wg sync.WaitGroup
	errs := make(chan error, n*n)
	for g := range n {
		wg.Go(func() {
			buf := make([]byte, 1<<16)
			for i := range n {
				tn := tensors[(g+i)%n]
				if err := tn.Read(buf, 0); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, pattern(1<<16, byte((g+i)%n))) {
					errs <- errors.New("wrong bytes")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.EqualValues(t, n*n, ctl(t, r, "reads"))
}

func TestOldRuntimeRefusesLargeTensors(t *testing.T) {
	t.Setenv("FAKE_NRT_VERSION", "2.29.0")
	r := openFake(t, LoadOptions{})
	assert.Equal(t, "2.29.0", r.Version().String())
	assert.Equal(t, "gonixl fake libnrt", r.Version().Detail)
	_, err := r.Allocate(PlacementDevice, 0, 4<<30, "big")
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "2.30.50")
	assert.EqualValues(t, 0, ctl(t, r, "allocs"), "refused before calling libnrt")
	_, err = r.Allocate(PlacementDevice, 0, 1<<20, "small")
	require.NoError(t, err)
	require.NoError(t, r.Close())

	t.Setenv("FAKE_NRT_VERSION", "2.31.24")
	r = openFake(t, LoadOptions{})
	assert.False(t, r.Version().Less(2, 30, 50))
	assert.True(t, r.Version().Less(2, 31, 25))
}

// A batch without ops after the last op of the call is passed with no ops (it once indexed past the end of the
// op array and panicked).
func TestBatchEmptyLast(t *testing.T) {
	for _, lib := range []string{"", fakeOldLib} {
		r := openFake(t, LoadOptions{Path: lib})
		a, err := r.Allocate(PlacementDevice, 0, 4096, "a")
		require.NoError(t, err)
		require.NoError(t, a.Write(pattern(4096, 3), 0))
		dst := make([]byte, 64)
		require.NoError(t, r.ReadBatch([]Batch{{a, []Op{{0, dst}}}, {a, nil}, {a, []Op{{64, nil}}}}))
		assert.Equal(t, pattern(4096, 3)[:64], dst)
		require.NoError(t, r.Close())
	}
}
