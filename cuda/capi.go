package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "gcu.h"
*/
import "C"

import (
	"unsafe"
)

// This file is the only one that calls into C. Each helper is one cgo call; batch operations pass whole
// arrays so that a copy of many blocks costs a single crossing.

// driverErrorName and driverErrorString are the driver's name and description of r; "" (C's NULL) before
// the driver is loaded or when it does not know r.
func driverErrorName(r Result) string   { return C.GoString(C.gcu_error_name(C.gcu_result(r))) }
func driverErrorString(r Result) string { return C.GoString(C.gcu_error_string(C.gcu_result(r))) }

func cLoad(path string) (string, bool) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	var buf [1024]C.char
	if C.gcu_load(cp, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0]), false
	}
	return "", true
}

func cSymbols() []string {
	var out []string
	for i := 0; ; i++ {
		s := C.gcu_symbol_name(C.int(i))
		if s == nil {
			return out
		}
		out = append(out, C.GoString(s))
	}
}

func cInit() Result { return Result(C.gcu_init()) }

func cDriverVersion() (int, Result) {
	var v C.int
	r := C.gcu_driver_version(&v)
	return int(v), Result(r)
}

func cDeviceCount() (int, Result) {
	var n C.int
	r := C.gcu_device_count(&n)
	return int(n), Result(r)
}

func cDeviceGet(ordinal int) (int, Result) {
	var d C.gcu_device
	r := C.gcu_device_get(C.int(ordinal), &d)
	return int(d), Result(r)
}

func cDeviceName(d int) (string, Result) {
	var buf [256]C.char
	r := C.gcu_device_name(C.gcu_device(d), &buf[0], C.int(len(buf)))
	return C.GoString(&buf[0]), Result(r)
}

func cDevicePCIBusID(d int) (string, Result) {
	var buf [64]C.char
	r := C.gcu_device_pci_bus_id(C.gcu_device(d), &buf[0], C.int(len(buf)))
	return C.GoString(&buf[0]), Result(r)
}

func cDeviceTotalMem(d int) (uint64, Result) {
	var n C.size_t
	r := C.gcu_device_total_mem(C.gcu_device(d), &n)
	return uint64(n), Result(r)
}

func cDeviceAttrs(d int, attrs []int32) ([]int32, Result) {
	vals := make([]int32, len(attrs))
	if len(attrs) == 0 {
		return vals, Success
	}
	r := C.gcu_device_attrs(C.gcu_device(d), (*C.int)(unsafe.Pointer(&attrs[0])), (*C.int)(unsafe.Pointer(&vals[0])), C.int(len(attrs)))
	return vals, Result(r)
}

func cDeviceUUID(d int) ([16]byte, Result) {
	var u [16]C.uchar
	r := C.gcu_device_uuid(C.gcu_device(d), &u[0])
	var out [16]byte
	for i := range u {
		out[i] = byte(u[i])
	}
	return out, Result(r)
}

// ctxHandle is a CUcontext. It is an address owned by the driver, never Go memory.
type ctxHandle uintptr

func (c ctxHandle) c() C.gcu_ctx { return C.gcu_ctx(c) }

// streamHandle is a CUstream (0: the legacy default stream), eventHandle a CUevent: addresses owned by the
// driver, never Go memory.
type (
	streamHandle uintptr
	eventHandle  uintptr
)

func cPrimaryRetain(d int) (ctxHandle, Result) {
	var ctx C.gcu_ctx
	r := C.gcu_primary_retain(C.gcu_device(d), &ctx)
	return ctxHandle(ctx), Result(r)
}

func cPrimaryRelease(d int) Result { return Result(C.gcu_primary_release(C.gcu_device(d))) }

func cBind(ctx ctxHandle) Result { return Result(C.gcu_bind(ctx.c())) }

func cCtxSync(ctx ctxHandle) Result { return Result(C.gcu_ctx_sync(ctx.c())) }

func cMemInfo(ctx ctxHandle) (free, total uint64, r Result) {
	var f, t C.size_t
	r = Result(C.gcu_mem_info(ctx.c(), &f, &t))
	return uint64(f), uint64(t), r
}

func cMemAlloc(ctx ctxHandle, n uint64) (uint64, Result) {
	var p C.gcu_dptr
	r := C.gcu_mem_alloc(ctx.c(), &p, C.size_t(n))
	return uint64(p), Result(r)
}

func cMemFree(ctx ctxHandle, p uint64) Result { return Result(C.gcu_mem_free(ctx.c(), C.gcu_dptr(p))) }

func cHostAlloc(ctx ctxHandle, n uint64, flags uint32) (uintptr, Result) {
	var p C.uintptr_t
	r := C.gcu_host_alloc(ctx.c(), &p, C.size_t(n), C.unsigned(flags))
	return uintptr(p), Result(r)
}

func cHostFree(ctx ctxHandle, p uintptr) Result {
	return Result(C.gcu_host_free(ctx.c(), C.uintptr_t(p)))
}

func cHostRegister(ctx ctxHandle, p uintptr, n uint64, flags uint32) Result {
	return Result(C.gcu_host_register(ctx.c(), C.uintptr_t(p), C.size_t(n), C.unsigned(flags)))
}

func cHostUnregister(ctx ctxHandle, p uintptr) Result {
	return Result(C.gcu_host_unregister(ctx.c(), C.uintptr_t(p)))
}

func cMemset8(ctx ctxHandle, p uint64, v byte, n uint64) Result {
	return Result(C.gcu_memset8(ctx.c(), C.gcu_dptr(p), C.uchar(v), C.size_t(n)))
}

// cCopySync copies n bytes; host addresses are raw addresses (C or mmap'd memory, or a Go slice pinned for
// the duration of this call by the caller passing it through cCopySyncSlice).
func cCopySync(ctx ctxHandle, kind Direction, dst, src, n uint64) Result {
	return Result(C.gcu_copy_sync(ctx.c(), C.int(kind), C.uint64_t(dst), C.uint64_t(src), C.size_t(n)))
}

// cCopyHtoDSlice copies a Go byte slice to the device. The slice is Go memory: it is passed as a pointer so
// that cgo keeps it alive and in place for the (synchronous) call, as the cgo pointer rules allow.
func cCopyHtoDSlice(ctx ctxHandle, dst uint64, src []byte) Result {
	return Result(C.gcu_copy_htod_ptr(ctx.c(), C.gcu_dptr(dst), unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src))))
}

// cCopyDtoHSlice copies device memory into a Go byte slice (synchronously).
func cCopyDtoHSlice(ctx ctxHandle, dst []byte, src uint64) Result {
	return Result(C.gcu_copy_dtoh_ptr(ctx.c(), unsafe.Pointer(unsafe.SliceData(dst)), C.gcu_dptr(src), C.size_t(len(dst))))
}

// cCopyBatch issues every copy in one cgo call; ops is Go memory without pointers, read only during the call.
func cCopyBatch(ctx ctxHandle, dev int, kind Direction, ops []Copy, stream streamHandle, sync bool) (int, Result) {
	if len(ops) == 0 {
		if sync {
			return 0, Result(C.gcu_stream_sync(ctx.c(), C.gcu_stream(stream)))
		}
		return 0, Success
	}
	var failed C.size_t
	s := 0
	if sync {
		s = 1
	}
	r := C.gcu_copy_batch(ctx.c(), C.int(kind), (*C.gcu_copy)(unsafe.Pointer(&ops[0])), C.size_t(len(ops)),
		C.gcu_stream(stream), C.int(s), &failed, C.int(dev))
	return int(failed), Result(r)
}

func cStreamCreate(ctx ctxHandle, flags uint32) (streamHandle, Result) {
	var s C.gcu_stream
	r := C.gcu_stream_create(ctx.c(), &s, C.unsigned(flags))
	return streamHandle(s), Result(r)
}

func cStreamDestroy(ctx ctxHandle, s streamHandle) Result {
	return Result(C.gcu_stream_destroy(ctx.c(), C.gcu_stream(s)))
}
func cStreamSync(ctx ctxHandle, s streamHandle) Result {
	return Result(C.gcu_stream_sync(ctx.c(), C.gcu_stream(s)))
}
func cStreamQuery(ctx ctxHandle, s streamHandle) Result {
	return Result(C.gcu_stream_query(ctx.c(), C.gcu_stream(s)))
}
func cStreamWaitEvent(ctx ctxHandle, s streamHandle, e eventHandle) Result {
	return Result(C.gcu_stream_wait_event(ctx.c(), C.gcu_stream(s), C.gcu_event(e)))
}

func cEventCreate(ctx ctxHandle, flags uint32) (eventHandle, Result) {
	var e C.gcu_event
	r := C.gcu_event_create(ctx.c(), &e, C.unsigned(flags))
	return eventHandle(e), Result(r)
}
func cEventDestroy(ctx ctxHandle, e eventHandle) Result {
	return Result(C.gcu_event_destroy(ctx.c(), C.gcu_event(e)))
}
func cEventRecord(ctx ctxHandle, e eventHandle, s streamHandle) Result {
	return Result(C.gcu_event_record(ctx.c(), C.gcu_event(e), C.gcu_stream(s)))
}
func cEventSync(ctx ctxHandle, e eventHandle) Result {
	return Result(C.gcu_event_sync(ctx.c(), C.gcu_event(e)))
}
func cEventQuery(ctx ctxHandle, e eventHandle) Result {
	return Result(C.gcu_event_query(ctx.c(), C.gcu_event(e)))
}
func cEventElapsed(ctx ctxHandle, start, end eventHandle) (float32, Result) {
	var ms C.float
	r := C.gcu_event_elapsed(ctx.c(), &ms, C.gcu_event(start), C.gcu_event(end))
	return float32(ms), Result(r)
}

func cPointerInfo(ctx ctxHandle, p uint64) (PointerInfo, Result) {
	var pi C.gcu_ptr_info
	r := Result(C.gcu_pointer_info(ctx.c(), C.uint64_t(p), &pi))
	return PointerInfo{
		MemoryType: MemoryType(pi.mem_type),
		Ordinal:    int(pi.ordinal),
		IsManaged:  pi.is_managed != 0,
		Mapped:     pi.mapped != 0,
		RangeStart: uint64(pi.range_start),
		RangeSize:  uint64(pi.range_size),
		DevicePtr:  uint64(pi.dev_ptr),
		HostPtr:    uint64(pi.host_ptr),
	}, r
}

// cBatchABI is the cuMemcpyBatchAsync ABI the batch copies use (13 or 12), or 0 when they loop per copy.
func cBatchABI() int { return int(C.gcu_batch_abi()) }
