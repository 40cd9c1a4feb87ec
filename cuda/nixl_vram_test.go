package cuda_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// prefillDecode is a DRAM-side agent (like a prefill rank staging its KV cache in host memory) and a
// VRAM-side agent (a decode rank's GPU cache), in one process, each with its cache registered.
type prefillDecode struct {
	dev        *cuda.Device
	g          layout.Geometry
	p, d       *nixl.Agent
	host       *cuda.HostKVCache
	kv         *cuda.KVCache
	pName      string
	local, rem *nixl.Prepped
}

func newPrefillDecode(tb testing.TB, g layout.Geometry) *prefillDecode {
	tb.Helper()
	dev := gpu(tb)
	x := &prefillDecode{dev: dev, g: g, p: nixltest.Agent(tb, "cuda-dram"), d: nixltest.Agent(tb, "cuda-vram")}
	var err error
	x.host, err = cuda.NewHostKVCache(dev, g)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, x.host.Close()) })
	x.kv, err = cuda.NewKVCache(dev, g)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, x.kv.Close()) })
	_, err = x.host.Register(x.p)
	require.NoError(tb, err)
	_, err = x.kv.Register(x.d)
	require.NoError(tb, err)

	// Handshake: D loads P's metadata, then prepares both descriptor lists once (as vLLM does).
	md, err := x.p.LocalMetadata()
	require.NoError(tb, err)
	x.pName, err = x.d.LoadRemoteMetadata(md)
	require.NoError(tb, err)
	localDescs, err := x.kv.Descs()
	require.NoError(tb, err)
	remDescs, err := x.host.Descs()
	require.NoError(tb, err)
	// The decode side's NIXL calls run in the VRAM cache's Do (as the connector's decode role runs them,
	// the cache being its DeviceContext).
	require.NoError(tb, x.kv.Do(func() error {
		x.local, err = x.d.Prep("", nixl.VRAM, localDescs)
		return err
	}))
	tb.Cleanup(func() { require.NoError(tb, x.local.Close()) })
	x.rem, err = x.d.Prep(x.pName, nixl.DRAM, remDescs)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, x.rem.Close()) })
	return x
}

// read makes D's READ of P's blocks src into its blocks dst.
func (x *prefillDecode) read(tb testing.TB, src, dst []int, notif string) *nixl.Xfer {
	tb.Helper()
	li, err := x.g.DescIndices(dst, nil)
	require.NoError(tb, err)
	ri, err := x.g.DescIndices(src, nil)
	require.NoError(tb, err)
	var xf *nixl.Xfer
	require.NoError(tb, x.kv.Do(func() error {
		xf, err = x.d.MakeXfer(nixl.Read, x.local, li, x.rem, ri, nixl.WithNotification([]byte(notif)))
		return err
	}))
	tb.Cleanup(func() { require.NoError(tb, xf.Close()) })
	return xf
}

func (x *prefillDecode) post(tb testing.TB, xf *nixl.Xfer) {
	tb.Helper()
	require.NoError(tb, x.kv.Do(func() error {
		_, err := xf.Post()
		return err
	}))
	require.NoError(tb, xf.Wait(testenv.Context(tb, time.Minute)))
}

func TestNIXLTransferIntoVRAM(t *testing.T) {
	g := layout.Geometry{NumLayers: 4, NumBlocks: 64, BlockSize: 16, NumKVHeads: 8, HeadDim: 128,
		DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
	x := newPrefillDecode(t, g)
	copy(x.host.Bytes(), pattern(len(x.host.Bytes()), 5))

	// READ (decode pulls): P's blocks 5,6,7,20,41 into D's VRAM blocks 1,2,3,9,60, with a notification to P.
	src, dst := []int{5, 6, 7, 20, 41}, []int{1, 2, 3, 9, 60}
	xf := x.read(t, src, dst, "req-vram-1")
	x.post(t, xf)
	n, err := x.p.WaitNotification(testenv.Context(t, time.Minute), func(n nixl.Notification) bool { return string(n.Msg) == "req-vram-1" }, nil)
	require.NoError(t, err)
	require.Equal(t, x.d.Name(), n.Agent)

	// Verify on the GPU: read the VRAM blocks back and compare with P's host bytes; untouched blocks stay zero.
	blk := make([]byte, g.BlockLen())
	check := func(src, dst []int) {
		for r := range g.NumRegions() {
			for i := range src {
				require.NoError(t, x.kv.Mem().Read(uint64(g.RegionOffset(r))+uint64(dst[i])*uint64(g.BlockLen()), blk))
				require.True(t, bytes.Equal(x.host.Block(r, src[i]), blk), "region %d: VRAM block %d != host block %d", r, dst[i], src[i])
			}
		}
	}
	check(src, dst)
	for r := range g.NumRegions() {
		require.NoError(t, x.kv.Mem().Read(uint64(g.RegionOffset(r))+4*uint64(g.BlockLen()), blk))
		require.Equal(t, make([]byte, len(blk)), blk, "VRAM block 4 of region %d was never a target", r)
	}

	// Repost after P changed its bytes: the same request moves the new data.
	copy(x.host.Bytes(), pattern(len(x.host.Bytes()), 6))
	x.post(t, xf)
	check(src, dst)

	// WRITE (prefill pushes): P loads D's metadata and writes its blocks 30,31 into D's VRAM blocks 40,41.
	md, err := x.d.LocalMetadata()
	require.NoError(t, err)
	dName, err := x.p.LoadRemoteMetadata(md)
	require.NoError(t, err)
	hostDescs, err := x.host.Descs()
	require.NoError(t, err)
	vramDescs, err := x.kv.Descs()
	require.NoError(t, err)
	var ls, rs []nixl.Desc
	for r := range g.NumRegions() {
		for i, b := range []int{30, 31} {
			ls = append(ls, hostDescs[r*g.NumBlocks+b])
			rs = append(rs, vramDescs[r*g.NumBlocks+40+i])
		}
	}
	w, err := x.p.CreateXfer(nixl.Write, nixl.DRAM, ls, nixl.VRAM, rs, dName, nixl.WithNotification([]byte("pushed")))
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	_, err = w.Post()
	require.NoError(t, err)
	require.NoError(t, w.Wait(testenv.Context(t, time.Minute)))
	_, err = x.d.WaitNotification(testenv.Context(t, time.Minute), func(n nixl.Notification) bool { return string(n.Msg) == "pushed" }, nil)
	require.NoError(t, err)
	check([]int{30, 31}, []int{40, 41})
}
