package cuda

import (
	"fmt"
	"unsafe"
)

// Direction is the kind of a copy.
type Direction int

// Copy directions (the values are the C shim's).
const (
	HostToDevice   Direction = 0 // HtoD
	DeviceToHost   Direction = 1 // DtoH
	DeviceToDevice Direction = 2 // DtoD
)

func (d Direction) valid() bool { return d >= HostToDevice && d <= DeviceToDevice }

// op names the driver entry point used for d.
func (d Direction) op(async bool) string {
	s := [...]string{"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD"}[d]
	if async {
		s += "Async"
	}
	return s + "_v2"
}

// DeviceMem is device memory from cuMemAlloc_v2. Its address is stable until Close. Safe for concurrent
// use; Close waits for running operations on it.
type DeviceMem struct {
	r    *resource
	dev  *Device
	ptr  uint64
	size uint64
}

// Alloc allocates size bytes of device memory (cuMemAlloc_v2). The memory is not cleared.
func (dev *Device) Alloc(size uint64) (*DeviceMem, error) {
	if size == 0 {
		return nil, invalid("cuMemAlloc_v2", "size 0")
	}
	st := dev.st
	if err := st.use(); err != nil {
		return nil, err
	}
	defer st.mu.RUnlock()
	p, r := cMemAlloc(st.ctx, size)
	if err := check(r, "cuMemAlloc_v2", fmt.Sprintf("%d bytes on device %d", size, st.ordinal)); err != nil {
		return nil, err
	}
	ctx := st.ctx
	m := &DeviceMem{dev: dev, ptr: p, size: size}
	m.r = newResource(st, m, fmt.Sprintf("device memory %#x (%d bytes)", p, size), func() error {
		return check(cMemFree(ctx, p), "cuMemFree_v2", fmt.Sprintf("%#x", p))
	})
	return m, nil
}

// Ptr is the device address (CUdeviceptr).
func (m *DeviceMem) Ptr() uint64 { return m.ptr }

// Len is the size in bytes.
func (m *DeviceMem) Len() uint64 { return m.size }

// Device is the device the memory lives on.
func (m *DeviceMem) Device() *Device { return m.dev }

// Close frees the memory (cuMemFree_v2). It is idempotent.
func (m *DeviceMem) Close() error { return m.r.close() }

func (m *DeviceMem) span(op string, off, n uint64) error {
	if off > m.size || n > m.size-off {
		return invalid(op, "range [%d, %d) outside the %d-byte allocation", off, off+n, m.size)
	}
	return nil
}

// Write copies src to the device at offset off (synchronous cuMemcpyHtoD_v2; src may be any Go slice).
func (m *DeviceMem) Write(off uint64, src []byte) error {
	if err := m.span("cuMemcpyHtoD_v2", off, uint64(len(src))); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	if err := m.r.use(); err != nil {
		return err
	}
	defer m.r.done()
	return check(cCopyHtoDSlice(m.r.st.ctx, m.ptr+off, src), "cuMemcpyHtoD_v2", fmt.Sprintf("%d bytes to %#x", len(src), m.ptr+off))
}

// Read copies len(dst) bytes from offset off into dst (synchronous cuMemcpyDtoH_v2).
func (m *DeviceMem) Read(off uint64, dst []byte) error {
	if err := m.span("cuMemcpyDtoH_v2", off, uint64(len(dst))); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	if err := m.r.use(); err != nil {
		return err
	}
	defer m.r.done()
	return check(cCopyDtoHSlice(m.r.st.ctx, dst, m.ptr+off), "cuMemcpyDtoH_v2", fmt.Sprintf("%d bytes from %#x", len(dst), m.ptr+off))
}

// Memset sets n bytes at offset off to v (cuMemsetD8_v2; synchronous with respect to the host for
// device memory).
func (m *DeviceMem) Memset(off, n uint64, v byte) error {
	if err := m.span("cuMemsetD8_v2", off, n); err != nil {
		return err
	}
	if err := m.r.use(); err != nil {
		return err
	}
	defer m.r.done()
	return check(cMemset8(m.r.st.ctx, m.ptr+off, v, n), "cuMemsetD8_v2", fmt.Sprintf("%d bytes at %#x", n, m.ptr+off))
}

// CopyFrom copies n bytes from src at srcOff to m at off (synchronous cuMemcpyDtoD_v2). Both allocations
// must belong to the same device.
func (m *DeviceMem) CopyFrom(off uint64, src *DeviceMem, srcOff, n uint64) error {
	if err := m.span("cuMemcpyDtoD_v2", off, n); err != nil {
		return err
	}
	if err := src.span("cuMemcpyDtoD_v2", srcOff, n); err != nil {
		return err
	}
	if src.r.st != m.r.st {
		return invalid("cuMemcpyDtoD_v2", "source is on device %d, destination on device %d", src.r.st.ordinal, m.r.st.ordinal)
	}
	if err := m.r.use(); err != nil {
		return err
	}
	defer m.r.done()
	if src != m {
		if err := src.r.use(); err != nil {
			return err
		}
		defer src.r.done()
	}
	return check(cCopySync(m.r.st.ctx, DeviceToDevice, m.ptr+off, src.ptr+srcOff, n), "cuMemcpyDtoD_v2",
		fmt.Sprintf("%d bytes %#x -> %#x", n, src.ptr+srcOff, m.ptr+off))
}

// cuMemHostAlloc / cuMemHostRegister flags.
const (
	hostPortable = 0x01 // pinned for every context, not only the allocating one
)

// HostMem is page-locked ("pinned") host memory from cuMemHostAlloc, pinned for all contexts. It is
// C memory, never Go heap, so NIXL may register it (as DRAM) and asynchronous copies may use it.
type HostMem struct {
	r    *resource
	dev  *Device
	addr uintptr
	size uint64
}

// AllocHost allocates size bytes of pinned host memory (cuMemHostAlloc, CU_MEMHOSTALLOC_PORTABLE).
func (dev *Device) AllocHost(size uint64) (*HostMem, error) {
	if size == 0 {
		return nil, invalid("cuMemHostAlloc", "size 0")
	}
	st := dev.st
	if err := st.use(); err != nil {
		return nil, err
	}
	defer st.mu.RUnlock()
	p, r := cHostAlloc(st.ctx, size, hostPortable)
	if err := check(r, "cuMemHostAlloc", fmt.Sprintf("%d bytes", size)); err != nil {
		return nil, err
	}
	ctx := st.ctx
	h := &HostMem{dev: dev, addr: p, size: size}
	h.r = newResource(st, h, fmt.Sprintf("pinned host memory %#x (%d bytes)", p, size), func() error {
		return check(cHostFree(ctx, p), "cuMemFreeHost", fmt.Sprintf("%#x", p))
	})
	return h, nil
}

// Addr is the host address.
func (h *HostMem) Addr() uintptr { return h.addr }

// Len is the size in bytes.
func (h *HostMem) Len() uint64 { return h.size }

// Bytes views the memory as a byte slice. The slice is invalid after Close.
func (h *HostMem) Bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), h.addr)), h.size)
}

// Close frees the memory (cuMemFreeHost). It is idempotent.
func (h *HostMem) Close() error { return h.r.close() }

// HostRegistration is host memory that this package did not allocate (for example nixl.AllocHost's
// mmap'd buffers), page-locked with cuMemHostRegister_v2 so that copies from it run at full speed.
type HostRegistration struct {
	r    *resource
	addr uintptr
	size uint64
}

// RegisterHost page-locks [addr, addr+size) for every context (cuMemHostRegister_v2, PORTABLE). The range
// must be memory the caller keeps mapped (never Go heap) until the registration is closed.
func (dev *Device) RegisterHost(addr uintptr, size uint64) (*HostRegistration, error) {
	if addr == 0 || size == 0 {
		return nil, invalid("cuMemHostRegister_v2", "address %#x, size %d", addr, size)
	}
	st := dev.st
	if err := st.use(); err != nil {
		return nil, err
	}
	defer st.mu.RUnlock()
	if err := check(cHostRegister(st.ctx, addr, size, hostPortable), "cuMemHostRegister_v2",
		fmt.Sprintf("%d bytes at %#x", size, addr)); err != nil {
		return nil, err
	}
	ctx := st.ctx
	hr := &HostRegistration{addr: addr, size: size}
	hr.r = newResource(st, hr, fmt.Sprintf("host registration %#x (%d bytes)", addr, size), func() error {
		return check(cHostUnregister(ctx, addr), "cuMemHostUnregister", fmt.Sprintf("%#x", addr))
	})
	return hr, nil
}

// Addr is the registered address.
func (hr *HostRegistration) Addr() uintptr { return hr.addr }

// Len is the registered size.
func (hr *HostRegistration) Len() uint64 { return hr.size }

// Close unregisters the range (cuMemHostUnregister). It is idempotent.
func (hr *HostRegistration) Close() error { return hr.r.close() }

// Copy is one copy of a batch: Len bytes from Src to Dst. Host addresses must be C or mmap'd memory
// (pinned for full speed), device addresses device pointers. The layout matches the C shim's gcu_copy.
type Copy struct {
	Dst, Src, Len uint64
}

// Coalesce merges neighbours in ops whose source and destination both continue the previous copy, so
// runs of consecutive blocks become single copies. Order is kept; the input is not modified.
func Coalesce(ops []Copy) []Copy {
	out := make([]Copy, 0, len(ops))
	for _, op := range ops {
		if op.Len == 0 {
			continue
		}
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.Dst+last.Len == op.Dst && last.Src+last.Len == op.Src {
				last.Len += op.Len
				continue
			}
		}
		out = append(out, op)
	}
	return out
}

// Copy copies n bytes between raw addresses, synchronously. Host addresses must not be Go memory that
// the caller does not keep alive; prefer DeviceMem.Write/Read for Go slices.
func (dev *Device) Copy(dir Direction, dst, src, n uint64) error {
	if !dir.valid() {
		return invalid("copy", "unknown direction %d", int(dir))
	}
	if n == 0 {
		return nil
	}
	if dst == 0 || src == 0 {
		return invalid(dir.op(false), "null address (dst %#x, src %#x)", dst, src)
	}
	st := dev.st
	if err := st.use(); err != nil {
		return err
	}
	defer st.mu.RUnlock()
	return check(cCopySync(st.ctx, dir, dst, src, n), dir.op(false), fmt.Sprintf("%d bytes %#x -> %#x", n, src, dst))
}

// CopyBatch runs every copy of ops in one cgo call: each is issued with the asynchronous copy of dir on
// a stream (s, or the legacy default stream when s is nil) and the call returns when all have completed.
// For overlap with other work, use Stream.Enqueue instead.
func (dev *Device) CopyBatch(dir Direction, ops []Copy, s *Stream) error {
	if s != nil {
		if err := s.Enqueue(dir, ops); err != nil {
			return err
		}
		return s.Synchronize()
	}
	if err := checkOps(dir, ops); err != nil {
		return err
	}
	st := dev.st
	if err := st.use(); err != nil {
		return err
	}
	defer st.mu.RUnlock()
	i, r := cCopyBatch(st.ctx, st.ordinal, dir, ops, 0, true)
	return batchErr(dir, ops, i, r)
}

func checkOps(dir Direction, ops []Copy) error {
	if !dir.valid() {
		return invalid("copy batch", "unknown direction %d", int(dir))
	}
	for i, op := range ops {
		if op.Len != 0 && (op.Dst == 0 || op.Src == 0) {
			return invalid(dir.op(true), "copy %d of %d has a null address (dst %#x, src %#x)", i, len(ops), op.Dst, op.Src)
		}
	}
	return nil
}

func batchErr(dir Direction, ops []Copy, i int, r Result) error {
	if r == Success {
		return nil
	}
	if i >= len(ops) {
		return check(r, "cuStreamSynchronize", fmt.Sprintf("after %d copies", len(ops)))
	}
	op := ops[i]
	return check(r, dir.op(true), fmt.Sprintf("copy %d of %d: %d bytes %#x -> %#x", i, len(ops), op.Len, op.Src, op.Dst))
}

// MemoryType is CUmemorytype, as reported for a pointer.
type MemoryType int

// Memory types.
const (
	MemoryHost    MemoryType = 1 // host
	MemoryDevice  MemoryType = 2 // device
	MemoryArray   MemoryType = 3 // array
	MemoryUnified MemoryType = 4 // unified
)

// PointerInfo is what the driver knows about an address (cuPointerGetAttribute).
type PointerInfo struct {
	MemoryType MemoryType
	Ordinal    int // device ordinal, -1 when the driver does not report one
	IsManaged  bool
	Mapped     bool
	RangeStart uint64 // start of the allocation that holds the address
	RangeSize  uint64 // its size
	DevicePtr  uint64 // the address as the device sees it
	HostPtr    uint64 // the address as the host sees it (0 for device memory)
}

// PointerInfo asks the driver about addr. Memory the driver does not know (pageable host memory, a bad
// pointer) gives an error matching ErrInvalidValue.
func (dev *Device) PointerInfo(addr uint64) (PointerInfo, error) {
	st := dev.st
	if err := st.use(); err != nil {
		return PointerInfo{}, err
	}
	defer st.mu.RUnlock()
	pi, r := cPointerInfo(st.ctx, addr)
	return pi, check(r, "cuPointerGetAttribute", fmt.Sprintf("%#x", addr))
}
