package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// These tests run on a real GPU and skip elsewhere (no driver / no device), also under CI=true.

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

func TestDeviceProps(t *testing.T) {
	dev := gpu(t)
	p := dev.Props()
	t.Logf("device %d: %s, %s, %s, %d MiB, sm_%d%d, %d SMs, %d copy engines", p.Ordinal, p.Name, p.UUIDString(),
		p.PCIBusID, p.TotalMem>>20, p.ComputeMajor, p.ComputeMinor, p.MultiProcessors, p.AsyncEngines)
	require.NotEmpty(t, p.Name)
	require.Greater(t, p.TotalMem, uint64(1<<30))
	require.GreaterOrEqual(t, p.ComputeMajor, 3)
	require.Greater(t, p.MultiProcessors, 0)
	require.True(t, p.UnifiedAddressing, "every 64-bit Linux device has unified addressing")
	free, total, err := dev.MemInfo()
	require.NoError(t, err)
	require.LessOrEqual(t, free, total)
	require.LessOrEqual(t, total, p.TotalMem)

	// Cross-check with nvidia-smi, the driver's own tool, when it is there.
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Log("nvidia-smi not found; skipping the cross-check")
		return
	}
	out, err := exec.Command(smi, "--query-gpu=uuid,name,pci.bus_id,memory.total,compute_cap", "--format=csv,noheader,nounits").Output()
	require.NoError(t, err)
	var row []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ", ")
		if len(f) == 5 && strings.EqualFold(f[0], p.UUIDString()) {
			row = f
		}
	}
	require.NotNil(t, row, "nvidia-smi lists no GPU with UUID %s:\n%s", p.UUIDString(), out)
	require.Equal(t, row[1], p.Name)
	// nvidia-smi prints an 8-digit PCI domain, the driver API a 4-digit one.
	require.True(t, strings.HasSuffix(strings.ToLower(row[2]), strings.ToLower(p.PCIBusID[strings.Index(p.PCIBusID, ":"):])), "%s vs %s", row[2], p.PCIBusID)
	require.Equal(t, row[4], fmt.Sprintf("%d.%d", p.ComputeMajor, p.ComputeMinor))
	smiMiB, err := strconv.Atoi(strings.TrimSpace(row[3]))
	require.NoError(t, err)
	require.InDelta(t, float64(smiMiB), float64(p.TotalMem>>20), 1024, "nvidia-smi %d MiB, driver %d MiB", smiMiB, p.TotalMem>>20)
}

func TestAllocCopyRoundTrip(t *testing.T) {
	dev := gpu(t)
	const size = 64 << 20
	m, err := dev.Alloc(size)
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	src := pattern(size, 1)
	require.NoError(t, m.Write(0, src))
	got := make([]byte, size)
	require.NoError(t, m.Read(0, got))
	require.True(t, bytes.Equal(src, got), "HtoD then DtoH changed the data")

	// Partial writes at an offset.
	require.NoError(t, m.Write(12345, []byte("gonixl")))
	part := make([]byte, 10)
	require.NoError(t, m.Read(12343, part))
	require.Equal(t, append(append([]byte{src[12343], src[12344]}, "gonixl"...), src[12351:12353]...), part)

	// Memset, then device-to-device into a second allocation.
	require.NoError(t, m.Memset(1<<20, 4096, 0xAB))
	m2, err := dev.Alloc(size)
	require.NoError(t, err)
	defer m2.Close()
	require.NoError(t, m2.CopyFrom(0, m, 1<<20, 1<<20))
	chunk := make([]byte, 1<<20)
	require.NoError(t, m2.Read(0, chunk))
	require.Equal(t, bytes.Repeat([]byte{0xAB}, 4096), chunk[:4096])
	require.Equal(t, src[1<<20+4096:2<<20], chunk[4096:])

	// Device-to-device batches: synchronously on the default stream, then enqueued on a stream. want is
	// what m holds now.
	want := bytes.Clone(src)
	copy(want[12345:], "gonixl")
	copy(want[1<<20:], bytes.Repeat([]byte{0xAB}, 4096))
	require.NoError(t, m2.Memset(0, size, 0))
	require.NoError(t, dev.CopyBatch(cuda.DeviceToDevice, []cuda.Copy{
		{Dst: m2.Ptr(), Src: m.Ptr() + 4<<20, Len: 1 << 20},
		{Dst: m2.Ptr() + 8<<20, Src: m.Ptr(), Len: 1 << 20},
	}, nil))
	require.NoError(t, m2.Read(0, chunk))
	require.True(t, bytes.Equal(want[4<<20:5<<20], chunk))
	require.NoError(t, m2.Read(8<<20, chunk))
	require.True(t, bytes.Equal(want[:1<<20], chunk))
	s := newStream(t, dev)
	ev := newEvent(t, dev, false)
	require.NoError(t, s.Enqueue(cuda.DeviceToDevice, []cuda.Copy{{Dst: m2.Ptr(), Src: m.Ptr(), Len: size}}))
	require.NoError(t, ev.Record(s))
	require.NoError(t, ev.Synchronize())
	done, err := ev.Query()
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, m2.Read(0, got))
	require.True(t, bytes.Equal(want, got), "DtoD on a stream")

	// The driver knows the allocation.
	pi, err := dev.PointerInfo(m.Ptr() + 100)
	require.NoError(t, err)
	require.Equal(t, cuda.MemoryDevice, pi.MemoryType)
	require.Equal(t, dev.Ordinal(), pi.Ordinal)
	require.Equal(t, m.Ptr(), pi.RangeStart)
	require.GreaterOrEqual(t, pi.RangeSize, uint64(size))
	require.False(t, pi.IsManaged)
}

func TestPinnedHostStreamsAndEvents(t *testing.T) {
	dev := gpu(t)
	const size = 32 << 20
	h1, err := dev.AllocHost(size)
	require.NoError(t, err)
	defer h1.Close()
	h2, err := dev.AllocHost(size)
	require.NoError(t, err)
	defer h2.Close()
	copy(h1.Bytes(), pattern(size, 2))
	m, err := dev.Alloc(size)
	require.NoError(t, err)
	defer m.Close()

	pi, err := dev.PointerInfo(uint64(h1.Addr()))
	require.NoError(t, err)
	require.Equal(t, cuda.MemoryHost, pi.MemoryType)
	require.Equal(t, uint64(h1.Addr()), pi.HostPtr)

	s := newStream(t, dev)
	start := newEvent(t, dev, true)
	end := newEvent(t, dev, true)

	// Upload in 1 MiB pieces (one cgo call), download reversed piece order, all on one stream.
	const piece = 1 << 20
	var up, down []cuda.Copy
	for off := uint64(0); off < size; off += piece {
		up = append(up, cuda.Copy{Dst: m.Ptr() + off, Src: uint64(h1.Addr()) + off, Len: piece})
		down = append(down, cuda.Copy{Dst: uint64(h2.Addr()) + (size - piece - off), Src: m.Ptr() + (size - piece - off), Len: piece})
	}
	require.NoError(t, start.Record(s))
	require.NoError(t, s.Enqueue(cuda.HostToDevice, up))
	require.NoError(t, s.Enqueue(cuda.DeviceToHost, down))
	require.NoError(t, end.Record(s))
	require.NoError(t, s.Wait(testenv.Context(t, time.Minute)))
	require.NoError(t, end.Wait(testenv.Context(t, time.Minute)))
	done, err := s.Query()
	require.NoError(t, err)
	require.True(t, done)
	require.True(t, bytes.Equal(h1.Bytes(), h2.Bytes()), "stream round trip changed the data")
	el, err := cuda.Elapsed(start, end)
	require.NoError(t, err)
	require.Greater(t, el, time.Duration(0))
	t.Logf("64 MiB through the GPU (32 up, 32 down) in %v: %.1f GB/s", el, 2*size/el.Seconds()/1e9)

	// A second stream waits for the first through an event; synchronous batch on the default stream.
	s2 := newStream(t, dev)
	clear(h2.Bytes())
	require.NoError(t, s.Enqueue(cuda.HostToDevice, []cuda.Copy{{Dst: m.Ptr(), Src: uint64(h1.Addr()), Len: size}}))
	require.NoError(t, end.Record(s))
	require.NoError(t, s2.WaitEvent(end))
	require.NoError(t, s2.Enqueue(cuda.DeviceToHost, []cuda.Copy{{Dst: uint64(h2.Addr()), Src: m.Ptr(), Len: size}}))
	require.NoError(t, s2.Synchronize())
	require.True(t, bytes.Equal(h1.Bytes(), h2.Bytes()))
	clear(h2.Bytes())
	require.NoError(t, dev.CopyBatch(cuda.DeviceToHost, []cuda.Copy{{Dst: uint64(h2.Addr()), Src: m.Ptr(), Len: size}}, nil))
	require.True(t, bytes.Equal(h1.Bytes(), h2.Bytes()))
	require.NoError(t, dev.Synchronize())
}

func TestRegisterHostMemoryFromNIXL(t *testing.T) {
	dev := gpu(t)
	const size = 8 << 20
	hm, err := nixl.AllocHost(size, nixl.HostOptions{})
	require.NoError(t, err)
	defer hm.Close()
	reg, err := dev.RegisterHost(uintptr(hm.Addr()), size)
	require.NoError(t, err)
	_, err = dev.RegisterHost(uintptr(hm.Addr()), size)
	require.ErrorIs(t, err, cuda.ErrAlreadyRegistered)
	pi, err := dev.PointerInfo(hm.Addr())
	require.NoError(t, err)
	require.Equal(t, cuda.MemoryHost, pi.MemoryType)

	copy(hm.Bytes(), pattern(size, 3))
	m, err := dev.Alloc(size)
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, dev.Copy(cuda.HostToDevice, m.Ptr(), hm.Addr(), size))
	got := make([]byte, size)
	require.NoError(t, m.Read(0, got))
	require.True(t, bytes.Equal(hm.Bytes(), got))
	require.NoError(t, reg.Close())
	require.NoError(t, reg.Close(), "Close is idempotent")
	reg, err = dev.RegisterHost(uintptr(hm.Addr()), size)
	require.NoError(t, err, "Close unregistered the range, so it registers again")
	require.NoError(t, reg.Close())
}

func TestErrorPaths(t *testing.T) {
	dev := gpu(t)

	// Out of memory: far more than any GPU has. The driver's status, name and description come back.
	_, err := dev.Alloc(1 << 50)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory)
	var ce *cuda.Error
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.Native)
	require.Equal(t, "cuMemAlloc_v2", ce.Op)
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name)
	require.NotEmpty(t, ce.Desc, "cuGetErrorString gave a description")
	t.Logf("OOM: %v", err)

	// Refused before the driver is called.
	_, err = dev.Alloc(0)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	require.ErrorAs(t, err, &ce)
	require.False(t, ce.Native)
	m, err := dev.Alloc(4096)
	require.NoError(t, err)
	require.ErrorIs(t, m.Write(4090, make([]byte, 7)), cuda.ErrInvalidValue)
	require.ErrorIs(t, m.Read(1<<62, make([]byte, 1)), cuda.ErrInvalidValue)
	require.ErrorIs(t, dev.Copy(cuda.HostToDevice, m.Ptr(), 0, 8), cuda.ErrInvalidValue)
	require.ErrorIs(t, dev.CopyBatch(cuda.Direction(9), nil, nil), cuda.ErrInvalidValue)

	// Bad pointers, refused by the driver.
	const bogus = 0xdead0000
	_, err = dev.PointerInfo(bogus)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	// A copy from a bad device pointer runs in a child process, in case the driver's error is sticky.
	cmd := testenv.PeerCommand(testenv.Context(t, time.Minute), "badptr", nil)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", out)
	t.Logf("child:\n%s", out)
	require.Contains(t, string(out), "copy: is ErrInvalidValue=true")
	require.Contains(t, string(out), "after: ok")

	// Closed handles.
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Write(0, []byte{1}), cuda.ErrClosed)

	// Device ordinals out of range.
	_, err = shared.drv.Open(99)
	require.ErrorIs(t, err, cuda.ErrInvalidDevice)

	// None of this left the context broken.
	m2, err := dev.Alloc(1 << 20)
	require.NoError(t, err)
	defer m2.Close()
	require.NoError(t, m2.Write(0, []byte("still works")))
	require.NoError(t, dev.Synchronize())
}

func TestDeviceCloseClosesChildren(t *testing.T) {
	gpu(t)
	dev, err := shared.drv.Open(0)
	require.NoError(t, err)
	m, err := dev.Alloc(1 << 20)
	require.NoError(t, err)
	h, err := dev.AllocHost(1 << 20)
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	e, err := dev.NewEvent(false)
	require.NoError(t, err)
	require.NoError(t, dev.Close())
	require.NoError(t, dev.Close(), "Close is idempotent")
	require.ErrorIs(t, m.Write(0, []byte{1}), cuda.ErrClosed)
	require.ErrorIs(t, s.Synchronize(), cuda.ErrClosed)
	require.ErrorIs(t, e.Record(nil), cuda.ErrClosed)
	_, err = dev.Alloc(1)
	require.ErrorIs(t, err, cuda.ErrClosed)
	for _, c := range []interface{ Close() error }{m, h, s, e} {
		require.NoError(t, c.Close(), "closing a child after its device is a no-op")
	}
}

func TestKVCacheBlockCopies(t *testing.T) {
	dev := gpu(t)
	g := testGeometry(4, 32)
	kv, err := cuda.NewKVCache(dev, g)
	require.NoError(t, err)
	defer kv.Close()
	host, err := cuda.NewHostKVCache(dev, g)
	require.NoError(t, err)
	defer host.Close()
	back, err := cuda.NewHostKVCache(dev, g)
	require.NoError(t, err)
	defer back.Close()

	require.Equal(t, nixl.VRAM, kv.MemType())
	require.Equal(t, uint64(dev.Ordinal()), kv.DeviceID())
	require.Equal(t, nixl.DRAM, host.MemType())
	require.Equal(t, uint64(0), host.DeviceID())
	bases := kv.RegionBases()
	require.Len(t, bases, g.NumRegions())
	for r, b := range bases {
		require.Equal(t, kv.Mem().Ptr()+uint64(g.RegionOffset(r)), b)
	}
	require.Equal(t, []int64{g.BlockLen(), g.BlockLen(), g.BlockLen(), g.BlockLen(), g.BlockLen(), g.BlockLen(), g.BlockLen(), g.BlockLen()}, kv.BlockLens())
	descs, err := kv.Descs()
	require.NoError(t, err)
	require.Len(t, descs, g.NumDescs())
	require.Equal(t, nixl.Desc{Addr: bases[1] + 3*uint64(g.BlockLen()), Len: uint64(g.BlockLen()), DevID: kv.DeviceID()}, descs[g.NumBlocks+3])

	copy(host.Bytes(), pattern(len(host.Bytes()), 4))
	src, dst := []int{3, 4, 5, 10}, []int{1, 2, 3, 20}
	require.NoError(t, kv.CopyFromHost(host, src, dst, nil))
	// Check every region's blocks on the device, and that a block not written is still zero.
	blk := make([]byte, g.BlockLen())
	for r := range g.NumRegions() {
		for i := range src {
			require.NoError(t, kv.Mem().Read(uint64(g.RegionOffset(r))+uint64(dst[i])*uint64(g.BlockLen()), blk))
			require.True(t, bytes.Equal(host.Block(r, src[i]), blk), "region %d block %d", r, dst[i])
		}
		require.NoError(t, kv.Mem().Read(uint64(g.RegionOffset(r))+5*uint64(g.BlockLen()), blk))
		require.Equal(t, make([]byte, len(blk)), blk, "block 5 of region %d was never written", r)
	}

	// Back to a second host cache, on a stream.
	s := newStream(t, dev)
	require.NoError(t, kv.CopyToHost(back, dst, []int{7, 8, 9, 30}, s))
	require.NoError(t, s.Wait(testenv.Context(t, time.Minute)))
	for r := range g.NumRegions() {
		for i, b := range []int{7, 8, 9, 30} {
			require.True(t, bytes.Equal(host.Block(r, src[i]), back.Block(r, b)), "region %d block %d", r, b)
		}
	}

	require.NoError(t, back.Close())
	require.ErrorIs(t, kv.CopyToHost(back, dst, []int{7, 8, 9, 30}, nil), cuda.ErrClosed, "a closed host cache is refused")
	require.ErrorIs(t, kv.CopyFromHost(kv, src, dst, nil), cuda.ErrInvalidValue, "a VRAM source is refused")
	require.ErrorIs(t, kv.CopyFromHost(host, []int{1}, []int{32}, nil), cuda.ErrInvalidValue)
	// Do (the connector's DeviceContext) runs fn with the device's context bound, and copies work inside it.
	ran := false
	require.NoError(t, kv.Do(func() error { ran = true; return kv.CopyFromHost(host, src, dst, nil) }))
	require.True(t, ran)
	boom := errors.New("boom")
	require.ErrorIs(t, kv.Do(func() error { return boom }), boom, "fn's error comes back")
	require.NoError(t, kv.Close())
	require.NoError(t, kv.Close())
	require.ErrorIs(t, kv.CopyFromHost(host, src, dst, nil), cuda.ErrClosed)
	require.ErrorIs(t, kv.Do(func() error { t.Error("fn ran on a closed cache"); return nil }), cuda.ErrClosed,
		"the device is still open, the cache is not")
}

// badPointerChild copies from an address that is no allocation, then checks that the context still works.
func badPointerChild() int {
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		fmt.Println("load:", err)
		return 2
	}
	dev, err := drv.Open(0)
	if err != nil {
		fmt.Println("open:", err)
		return 2
	}
	defer dev.Close()
	h, err := dev.AllocHost(4096)
	if err != nil {
		fmt.Println("alloc host:", err)
		return 2
	}
	err = dev.Copy(cuda.DeviceToHost, uint64(h.Addr()), 0xdead0000, 4096)
	fmt.Printf("copy: %v\ncopy: is ErrInvalidValue=%v\n", err, errors.Is(err, cuda.ErrInvalidValue))
	m, err := dev.Alloc(4096)
	if err == nil {
		err = m.Write(0, []byte("ok"))
	}
	if err == nil {
		err = dev.Synchronize()
	}
	if err != nil {
		fmt.Println("after:", err)
	} else {
		fmt.Println("after: ok")
	}
	return 0
}

// The cuda package does not import the connector; its caches and Device satisfy the connector's interfaces
// structurally.
var (
	_ connector.Cache                = (*cuda.KVCache)(nil)
	_ connector.Registrar            = (*cuda.KVCache)(nil)
	_ connector.Cache                = (*cuda.HostKVCache)(nil)
	_ connector.Registrar            = (*cuda.HostKVCache)(nil)
	_ connector.Cache                = (*cuda.HostBufferedKVCache)(nil)
	_ connector.HostBufferedPipeline = (*cuda.HostBufferedKVCache)(nil)
	_ connector.DeviceContext        = (*cuda.Device)(nil)
	_ connector.DeviceContext        = (*cuda.KVCache)(nil)
)

// A host-buffered cache is no DeviceContext: NIXL reads only into its DRAM, so the decode role posts without
// taking the device (its VRAM cache's Do is not promoted). Needs no GPU.
func TestHostBufferedKVCacheIsNoDeviceContext(t *testing.T) {
	_, ok := any((*cuda.HostBufferedKVCache)(nil)).(connector.DeviceContext)
	require.False(t, ok)
}

func TestHostBufferedKVCache(t *testing.T) {
	dev := gpu(t)
	g := testGeometry(3, 16)
	c, err := cuda.NewHostBufferedKVCache(dev, g)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	require.Equal(t, nixl.DRAM, c.MemType(), "NIXL fills the host buffer")
	require.Equal(t, uint64(0), c.DeviceID())
	copy(c.Bytes(), pattern(len(c.Bytes()), 11))
	ids := []int{2, 3, 9}
	require.NoError(t, c.CopyToDevice(testenv.Context(t, time.Minute), ids))
	blk := make([]byte, g.BlockLen())
	for r := range g.NumRegions() {
		for _, b := range ids {
			require.NoError(t, c.VRAM().Mem().Read(uint64(g.RegionOffset(r))+uint64(b)*uint64(g.BlockLen()), blk))
			require.Equal(t, c.Block(r, b), blk, "region %d block %d", r, b)
		}
	}
	// Round trip: clear the host blocks, copy back from the device.
	for r := range g.NumRegions() {
		clear(c.Block(r, 9))
	}
	require.NoError(t, c.CopyFromDevice(testenv.Context(t, time.Minute), []int{9}))
	want := pattern(len(c.Bytes()), 11)
	for r := range g.NumRegions() {
		off := g.RegionOffset(r) + 9*g.BlockLen()
		require.Equal(t, want[off:off+g.BlockLen()], c.Block(r, 9))
	}
	require.ErrorIs(t, c.CopyToDevice(testenv.Context(t, time.Minute), []int{16}), cuda.ErrInvalidValue)
}

func TestCloseUnderConcurrentCopies(t *testing.T) {
	gpu(t)
	dev, err := shared.drv.Open(0)
	require.NoError(t, err)
	g := testGeometry(2, 64)
	kv, err := cuda.NewKVCache(dev, g)
	require.NoError(t, err)
	host, err := cuda.NewHostKVCache(dev, g)
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)

	// Copies from several goroutines, with and without a stream, until the device is closed under them.
	errs := make(chan error, 8)
	started := make(chan struct{}, 8)
	for w := range 8 {
		go func() {
			ids := []int{1 + w, 10 + w, 20 + w}
			for i := 0; ; i++ {
				var err error
				if w%2 == 0 {
					err = kv.CopyFromHost(host, ids, ids, nil)
				} else if err = kv.CopyToHost(host, ids, ids, s); err == nil {
					err = s.Wait(context.Background())
				}
				if i == 0 {
					started <- struct{}{}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 8 {
		<-started
	}
	require.NoError(t, dev.Close())
	for range 8 {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, cuda.ErrClosed)
		case <-time.After(30 * time.Second):
			t.Fatal("a copy goroutine did not stop after Device.Close")
		}
	}
	var ce *cuda.Error
	require.ErrorAs(t, kv.Do(func() error { t.Error("fn ran on a closed device"); return nil }), &ce)
	require.ErrorIs(t, ce, cuda.ErrClosed)
	require.NoError(t, kv.Close())
	require.NoError(t, host.Close())
}
