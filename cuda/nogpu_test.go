package cuda_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// These tests need no GPU: loading failures, error values, and the copy-list math.

func TestLoadMissingPathListsWhatWasTried(t *testing.T) {
	le, err := loadError(t, "/nonexistent/gonixl/libcuda.so.1")
	require.Equal(t, []string{"not present"}, le.Why)
	require.Contains(t, err.Error(), "install the NVIDIA driver")
	require.Contains(t, err.Error(), "/nonexistent/gonixl/libcuda.so.1: not present")
}

func TestLoadNonCUDALibraryIsRefused(t *testing.T) {
	// libc is loadable everywhere but is no CUDA driver: the missing entry point is named.
	le, _ := loadError(t, "libc.so.6")
	require.Contains(t, le.Why[0], "does not export cuInit")
}

// loadError loads path alone (NoSearch), which must fail with ErrNotLoaded after trying only path, and
// returns the LoadError and the error.
func loadError(t *testing.T, path string) (*cuda.LoadError, error) {
	t.Helper()
	_, err := cuda.Load(cuda.LoadOptions{Path: path, NoSearch: true})
	require.ErrorIs(t, err, cuda.ErrNotLoaded)
	var le *cuda.LoadError
	require.ErrorAs(t, err, &le)
	require.Equal(t, []string{path}, le.Tried)
	return le, err
}

func TestLoadNoSearchNeedsPath(t *testing.T) {
	_, err := cuda.Load(cuda.LoadOptions{NoSearch: true})
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
}

func TestLoadSearchOrder(t *testing.T) {
	t.Setenv(cuda.EnvLibPath, "/nonexistent/env/libcuda.so.1")
	drv, err := cuda.Load(cuda.LoadOptions{Path: "/nonexistent/opt/libcuda.so.1"})
	var le *cuda.LoadError
	switch {
	case errors.As(err, &le):
		// No driver on this machine: every candidate is listed, in order.
		want := append([]string{"/nonexistent/opt/libcuda.so.1", "/nonexistent/env/libcuda.so.1", cuda.LibraryName}, cuda.StandardPaths...)
		require.Equal(t, want, le.Tried)
		require.Len(t, le.Why, len(want))
		require.NotEmpty(t, le.Why[2], "the loader's reason for the soname is reported")
		t.Logf("no CUDA driver here; the error reads:\n%v", err)
	case err != nil:
		// A driver library loaded but cuInit failed (no GPU, stub library): a driver status, not a load error.
		var ce *cuda.Error
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "cuInit", ce.Op)
		t.Logf("driver present, cuInit failed: %v", err)
	default:
		// A real driver: it was found after the two missing candidates, and binds the _v2 entry points.
		require.NotEmpty(t, drv.Path())
		require.NotEqual(t, "/nonexistent/opt/libcuda.so.1", drv.Path())
		require.Greater(t, drv.Version(), 0)
		require.Contains(t, drv.Symbols(), "cuMemAlloc_v2")
		require.Contains(t, drv.Symbols(), "cuMemcpyHtoDAsync_v2")
		require.Contains(t, drv.Symbols(), "cuDevicePrimaryCtxRelease_v2")
		t.Logf("driver %s, CUDA %s", drv.Path(), drv.VersionString())
	}
}

func TestResultsAreErrorsAndSentinels(t *testing.T) {
	require.ErrorIs(t, cuda.Result(2), cuda.ErrOutOfMemory)
	require.NotErrorIs(t, cuda.Result(2), cuda.ErrInvalidValue)
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", cuda.Result(2).Error())
	require.Equal(t, "CUDA_ERROR_INVALID_VALUE", cuda.ErrInvalidValue.Error())
	require.Equal(t, "CUresult(12345)", cuda.Result(12345).Error())

	// An argument refused before the driver is called: the same *Error, Native false.
	_, err := cuda.Load(cuda.LoadOptions{NoSearch: true})
	wrapped := fmt.Errorf("opening the GPU: %w", err)
	require.ErrorIs(t, wrapped, cuda.ErrInvalidValue)
	var ce *cuda.Error
	require.ErrorAs(t, wrapped, &ce)
	require.Equal(t, cuda.Result(1), ce.Code)
	require.False(t, ce.Native)
	require.Contains(t, err.Error(), "cuda: load: LoadOptions.NoSearch needs LoadOptions.Path: CUDA_ERROR_INVALID_VALUE")
}

// regions is a Regions with made-up addresses, for the copy math.
type regions struct {
	g     layout.Geometry
	mem   nixl.MemType
	bases []uint64
}

func (r regions) Geometry() layout.Geometry { return r.g }
func (r regions) MemType() nixl.MemType     { return r.mem }
func (r regions) RegionBases() []uint64     { return r.bases }

func testGeometry(layers, blocks int) layout.Geometry {
	return layout.Geometry{NumLayers: layers, NumBlocks: blocks, BlockSize: 16, NumKVHeads: 2, HeadDim: 64,
		DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
}

func fakeRegions(g layout.Geometry, mem nixl.MemType, base uint64) regions {
	r := regions{g: g, mem: mem}
	for i := range g.NumRegions() {
		r.bases = append(r.bases, base+uint64(g.RegionOffset(i)))
	}
	return r
}

func TestCoalesce(t *testing.T) {
	ops := []cuda.Copy{
		{Dst: 100, Src: 1000, Len: 10},
		{Dst: 110, Src: 1010, Len: 10}, // continues both sides: merged
		{Dst: 120, Src: 2000, Len: 10}, // source jumps: new copy
		{Dst: 130, Src: 2010, Len: 0},  // empty: dropped
		{Dst: 130, Src: 2010, Len: 5},  // continues: merged
		{Dst: 500, Src: 2015, Len: 5},  // destination jumps
	}
	orig := append([]cuda.Copy(nil), ops...)
	got := cuda.Coalesce(ops)
	require.Equal(t, []cuda.Copy{{Dst: 100, Src: 1000, Len: 20}, {Dst: 120, Src: 2000, Len: 15}, {Dst: 500, Src: 2015, Len: 5}}, got)
	require.Equal(t, orig, ops, "input untouched")
	require.Empty(t, cuda.Coalesce(nil))
}

func TestBlockCopies(t *testing.T) {
	dg, sg := testGeometry(2, 16), testGeometry(2, 8) // same regions and block length, different NumBlocks
	dst := fakeRegions(dg, nixl.VRAM, 1<<32)
	src := fakeRegions(sg, nixl.DRAM, 1<<20)
	bl := uint64(dg.BlockLen())

	ops, err := cuda.BlockCopies(dst, src, []int{4, 5, 9}, []int{1, 2, 7})
	require.NoError(t, err)
	// Per region (4 regions: K0 V0 K1 V1): blocks 4,5 ← 1,2 merge into one copy; 9 ← 7 is separate.
	require.Len(t, ops, 2*dg.NumRegions())
	for r := range dg.NumRegions() {
		require.Equal(t, cuda.Copy{Dst: dst.bases[r] + 4*bl, Src: src.bases[r] + 1*bl, Len: 2 * bl}, ops[2*r])
		require.Equal(t, cuda.Copy{Dst: dst.bases[r] + 9*bl, Src: src.bases[r] + 7*bl, Len: bl}, ops[2*r+1])
	}

	_, err = cuda.BlockCopies(dst, src, []int{1, 2}, []int{1})
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	_, err = cuda.BlockCopies(dst, src, []int{16}, []int{1})
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "destination id past NumBlocks")
	_, err = cuda.BlockCopies(dst, src, []int{1}, []int{8})
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "source id past its NumBlocks")
	_, err = cuda.BlockCopies(dst, src, []int{-1}, []int{1})
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	other := testGeometry(3, 8)
	_, err = cuda.BlockCopies(dst, fakeRegions(other, nixl.DRAM, 1<<20), []int{1}, []int{1})
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "different region count")
	require.True(t, strings.Contains(err.Error(), "geometries differ"), err.Error())
	short := src
	short.bases = short.bases[:1]
	_, err = cuda.BlockCopies(dst, short, []int{1}, []int{1})
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "missing region bases")
}

func TestDirectionAndMemoryTypeNames(t *testing.T) {
	require.Equal(t, "HtoD", cuda.HostToDevice.String())
	require.Equal(t, "DtoH", cuda.DeviceToHost.String())
	require.Equal(t, "DtoD", cuda.DeviceToDevice.String())
	require.Equal(t, "device", cuda.MemoryDevice.String())
	require.Equal(t, "host", cuda.MemoryHost.String())
}
