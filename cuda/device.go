package cuda

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/gonixl/gonixl/internal/lifetime"
	"github.com/gonixl/gonixl/internal/poll"
)

// CUdevice_attribute values read into DeviceProps.
const (
	attrMultiProcessors   = 16
	attrIntegrated        = 18
	attrCanMapHostMemory  = 19
	attrPCIBus            = 33
	attrPCIDevice         = 34
	attrAsyncEngines      = 40
	attrUnifiedAddressing = 41
	attrPCIDomain         = 50
	attrComputeMajor      = 75
	attrComputeMinor      = 76
)

// DeviceProps describes a device.
type DeviceProps struct {
	Ordinal           int
	Name              string
	UUID              [16]byte
	PCIBusID          string // e.g. "0000:19:00.0", as nvidia-smi prints it
	TotalMem          uint64 // bytes
	ComputeMajor      int
	ComputeMinor      int
	MultiProcessors   int
	AsyncEngines      int // copy engines that overlap copies with compute
	UnifiedAddressing bool
	CanMapHostMemory  bool
	Integrated        bool
}

// UUIDString formats the UUID as nvidia-smi does ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").
func (p DeviceProps) UUIDString() string {
	u := p.UUID
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Device is an open CUDA device: its primary context, retained for as long as the Device is open.
//
// Contexts and threads: the driver keeps the current context per OS thread, and goroutines move between
// threads. This package therefore binds the device's context (cuCtxSetCurrent) at the start of every C call
// that needs it, inside the same cgo call, so no method depends on which thread a goroutine runs on and
// no method locks the OS thread. Code that calls other native libraries which expect a current context
// (NIXL/UCX registering or moving VRAM) runs them through Device.Do, which locks the OS thread and binds the
// context for the duration of a function.
//
// A Device is safe for concurrent use. Close releases the context after closing every allocation, stream
// and event still open on it (children before parents).
type Device struct {
	st    *devState
	props DeviceProps
}

// devState is what the cleanup of a forgotten Device needs; it never points back to the Device.
type devState struct {
	ordinal int
	dev     int
	ctx     ctxHandle

	mu     sync.RWMutex // RLock: an operation is using the context; Lock: closing
	closed bool

	regMu    sync.Mutex
	children map[*resource]struct{}
}

// Open retains the primary context of device ordinal and reads its properties.
func (d *Driver) Open(ordinal int) (*Device, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, results.Refusef("open device", ErrInvalidDevice, "ordinal %d, %d device(s) visible", ordinal, n)
	}
	h, r := cDeviceGet(ordinal)
	if err := check(r, "cuDeviceGet", fmt.Sprintf("ordinal %d", ordinal)); err != nil {
		return nil, err
	}
	props, err := readProps(ordinal, h)
	if err != nil {
		return nil, err
	}
	ctx, r := cPrimaryRetain(h)
	if err := check(r, "cuDevicePrimaryCtxRetain", fmt.Sprintf("ordinal %d", ordinal)); err != nil {
		return nil, err
	}
	st := &devState{ordinal: ordinal, dev: h, ctx: ctx, children: map[*resource]struct{}{}}
	dev := &Device{st: st, props: props}
	runtime.AddCleanup(dev, func(st *devState) { _ = st.close() }, st)
	return dev, nil
}

func readProps(ordinal, h int) (DeviceProps, error) {
	p := DeviceProps{Ordinal: ordinal}
	var r Result
	if p.Name, r = cDeviceName(h); r != Success {
		return p, check(r, "cuDeviceGetName", "")
	}
	if p.TotalMem, r = cDeviceTotalMem(h); r != Success {
		return p, check(r, "cuDeviceTotalMem_v2", "")
	}
	if p.UUID, r = cDeviceUUID(h); r != Success {
		return p, check(r, "cuDeviceGetUuid_v2", "")
	}
	if p.PCIBusID, r = cDevicePCIBusID(h); r != Success {
		return p, check(r, "cuDeviceGetPCIBusId", "")
	}
	attrs := []int32{attrMultiProcessors, attrIntegrated, attrCanMapHostMemory, attrAsyncEngines,
		attrUnifiedAddressing, attrComputeMajor, attrComputeMinor}
	v, r := cDeviceAttrs(h, attrs)
	if r != Success {
		return p, check(r, "cuDeviceGetAttribute", "")
	}
	p.MultiProcessors, p.Integrated, p.CanMapHostMemory = int(v[0]), v[1] != 0, v[2] != 0
	p.AsyncEngines, p.UnifiedAddressing = int(v[3]), v[4] != 0
	p.ComputeMajor, p.ComputeMinor = int(v[5]), int(v[6])
	return p, nil
}

// Props returns the device's properties, read when it was opened.
func (dev *Device) Props() DeviceProps { return dev.props }

// Ordinal is the device's index among the visible devices; NIXL descriptors use it as DevID for VRAM.
func (dev *Device) Ordinal() int { return dev.st.ordinal }

// use takes the device for an operation; the caller must call dev.st.mu.RUnlock when done.
func (st *devState) use() error {
	st.mu.RLock()
	if st.closed {
		st.mu.RUnlock()
		return closedErr(fmt.Sprintf("device %d", st.ordinal))
	}
	return nil
}

// MemInfo returns the free and total device memory in bytes (cuMemGetInfo_v2).
func (dev *Device) MemInfo() (free, total uint64, err error) {
	if err := dev.st.use(); err != nil {
		return 0, 0, err
	}
	defer dev.st.mu.RUnlock()
	f, t, r := cMemInfo(dev.st.ctx)
	return f, t, check(r, "cuMemGetInfo_v2", "")
}

// Synchronize waits for all work on the device's context (cuCtxSynchronize).
func (dev *Device) Synchronize() error {
	if err := dev.st.use(); err != nil {
		return err
	}
	defer dev.st.mu.RUnlock()
	return check(cCtxSync(dev.st.ctx), "cuCtxSynchronize", "")
}

// Do runs fn on a locked OS thread whose current context is this device's primary context. Use it around
// calls into other native libraries that expect a current CUDA context (for example NIXL registering or
// transferring VRAM through UCX). The device stays open until fn returns.
//
// fn runs holding the device's lock for reading (that is how Close waits for it). So fn must not close the
// device (Close would wait for fn, and fn for Close), and must not take the device again: Do (of the Device
// or of a KVCache on it), KVCache.Register, the New*KVCache constructors, or another Device method (Alloc,
// AllocHost, RegisterHost, Copy, CopyBatch, NewStream, NewEvent, MemInfo, Synchronize, PointerInfo). Such a
// nested call works while nothing else happens, but once a Close is waiting, a new reader waits for the
// Close, and the Close for fn: a deadlock. NIXL calls, and the methods of allocations, streams, events and
// caches that already exist (DeviceMem.Read, KVCache.CopyFromHost, Stream.Enqueue, Stream.Wait, …), take
// only their own locks and are fine inside fn.
func (dev *Device) Do(fn func() error) error {
	if err := dev.st.use(); err != nil {
		return err
	}
	defer dev.st.mu.RUnlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check(cBind(dev.st.ctx), "cuCtxSetCurrent", ""); err != nil {
		return err
	}
	return fn()
}

// Close closes every allocation, stream and event still open on the device, then releases the primary
// context. It is idempotent.
func (dev *Device) Close() error { return dev.st.close() }

func (st *devState) close() error { return lifetime.CloseOnce(&st.mu, &st.closed, st.teardown) }

// teardown is close's work, run once with st.mu locked.
func (st *devState) teardown() error {
	st.regMu.Lock()
	kids := make([]*resource, 0, len(st.children))
	for r := range st.children {
		kids = append(kids, r)
	}
	st.regMu.Unlock()
	var first error
	for _, r := range kids {
		if err := r.close(); err != nil && first == nil {
			first = err
		}
	}
	if err := check(cPrimaryRelease(st.dev), "cuDevicePrimaryCtxRelease_v2", ""); err != nil && first == nil {
		first = err
	}
	return first
}

// resource is one native handle owned by a device (allocation, pinned buffer, registration, stream,
// event). Operations hold its read lock; close takes the write lock, so a handle is never freed under a
// running operation.
type resource struct {
	st     *devState
	what   string
	mu     sync.RWMutex
	closed bool
	free   func() error
}

// newResource registers a child of the device, the native handle of owner, which free releases: on owner's
// Close, on the device's Close, or when owner is garbage-collected unclosed. The device must be in use
// (st.use) by the caller.
func newResource[T any](st *devState, owner *T, what string, free func() error) *resource {
	r := &resource{st: st, what: what, free: free}
	st.regMu.Lock()
	st.children[r] = struct{}{}
	st.regMu.Unlock()
	runtime.AddCleanup(owner, func(r *resource) { _ = r.close() }, r)
	return r
}

func (r *resource) use() error {
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		return closedErr(r.what)
	}
	return nil
}

func (r *resource) done() { r.mu.RUnlock() }

func (r *resource) close() error {
	return lifetime.CloseOnce(&r.mu, &r.closed, func() error {
		r.st.regMu.Lock()
		delete(r.st.children, r)
		r.st.regMu.Unlock()
		return r.free()
	})
}

// queryDone reads the result of a cu*Query call (op): done (Success), still running (ErrNotReady), or an
// error.
func queryDone(r Result, op string) (bool, error) {
	switch r {
	case Success:
		return true, nil
	case Result(600): // CUDA_ERROR_NOT_READY
		return false, nil
	default:
		return false, check(r, op, "")
	}
}

// pollWait calls query until it reports done (Success), an error, or ctx ends. query returns
// ErrNotReady while the work runs; the polls are paced by poll.Default.
func pollWait(ctx context.Context, query func() Result, op string) error {
	var err error
	if cerr := poll.Default.Until(ctx, func() bool {
		var done bool
		done, err = queryDone(query(), op)
		return done || err != nil
	}); cerr != nil {
		return results.Refusef(op, nil, "waiting for the work ended: %w", cerr)
	}
	return err
}
