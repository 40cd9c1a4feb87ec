package neuron

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "gn.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// This file is the only one that calls into C (gn.h, gn.c). Each helper is one cgo call; a transfer passes
// every op of every batch at once.

// libHandle is a dlopen'ed libnrt; symbol is one of its functions; tensorHandle is an nrt_tensor_t*. All three
// are owned by libnrt (C memory), never Go memory.
type (
	libHandle    *C.gn_lib
	symbol       C.gn_fn
	tensorHandle *C.gn_tensor
)

// cDlopen opens path; on failure it returns nil and dlopen's message.
func cDlopen(path string) (libHandle, string) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	h := C.gn_dlopen(cpath, &cerr)
	if h != nil {
		return libHandle(h), ""
	}
	if cerr == nil {
		return nil, "unknown dlopen error"
	}
	defer C.free(unsafe.Pointer(cerr))
	return nil, C.GoString(cerr)
}

// cDlsym is the first of names that h defines, or nil.
func cDlsym(h libHandle, names ...string) symbol {
	for _, n := range names {
		cn := C.CString(n)
		p := C.gn_dlsym(h, cn)
		C.free(unsafe.Pointer(cn))
		if p != nil {
			return symbol(p)
		}
	}
	return nil
}

func cInit(f symbol, framework int32) Status {
	return Status(C.gn_call_init(C.gn_fn(f), C.int32_t(framework)))
}

func cClose(f symbol) { C.gn_call_close(C.gn_fn(f)) }

func cCount(f symbol) (int, Status) {
	var n C.uint32_t
	st := C.gn_call_count(C.gn_fn(f), &n)
	return int(n), Status(st)
}

func cAlloc(f symbol, p Placement, vnc int, size uint64, name string) (tensorHandle, Status) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var t *C.gn_tensor
	st := C.gn_call_alloc(C.gn_fn(f), C.int32_t(p), C.int(vnc), C.size_t(size), cname, &t)
	return tensorHandle(t), Status(st)
}

func cFree(f symbol, t tensorHandle) { C.gn_call_free(C.gn_fn(f), t) }

func cSize(f symbol, t tensorHandle) uint64 { return uint64(C.gn_call_size(C.gn_fn(f), t)) }

func cVA(f symbol, t tensorHandle) uintptr { return uintptr(C.gn_call_va(C.gn_fn(f), t)) }

// cStatusString is libnrt's name for st ("" when it has none).
func cStatusString(f symbol, st Status) string {
	s := C.gn_call_str(C.gn_fn(f), C.int32_t(st))
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

func cCtl(f symbol, key string, value int64, set bool) int64 {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	s := C.int(0)
	if set {
		s = 1
	}
	return int64(C.gn_call_ctl(C.gn_fn(f), ck, C.int64_t(value), s))
}

// cVersion is nrt_get_version's answer; ok is false when it failed.
func cVersion(f symbol) (v Version, ok bool) {
	var cv C.gn_version
	if C.gn_call_version(C.gn_fn(f), &cv) != 0 {
		return Version{}, false
	}
	return Version{Major: uint64(cv.major), Minor: uint64(cv.minor), Patch: uint64(cv.patch), Maintenance: uint64(cv.maintenance),
		Detail: C.GoString(&cv.rt_detail[0])}, true
}

// cTransfer runs every op of every batch (validated by the caller; total pieces after splitting at
// maxTransfer) in one call of gn_xfer, through batchFn when not nil, else one by one. On failure fb/fo are the
// failing batch and op when known (-1 otherwise). oom reports that the C descriptor arrays could not be
// allocated (nothing ran).
func cTransfer(one, batchFn symbol, read bool, batches []Batch, total int, maxTransfer uint64) (st Status, fb, fo int64, oom bool) {
	cops := (*C.gn_op)(C.calloc(C.size_t(total), C.size_t(unsafe.Sizeof(C.gn_op{}))))
	cbat := (*C.gn_batch)(C.calloc(C.size_t(len(batches)), C.size_t(unsafe.Sizeof(C.gn_batch{}))))
	if cops == nil || cbat == nil {
		C.free(unsafe.Pointer(cops))
		C.free(unsafe.Pointer(cbat))
		return 0, -1, -1, true
	}
	defer C.free(unsafe.Pointer(cops))
	defer C.free(unsafe.Pointer(cbat))
	ops := unsafe.Slice(cops, total)
	bats := unsafe.Slice(cbat, len(batches))

	// Buffers may be Go memory: pin them while C holds their addresses (no-op for mmap'd memory).
	var pin runtime.Pinner
	defer pin.Unpin()
	k := 0
	for i, b := range batches {
		first := k
		for _, op := range b.Ops {
			if len(op.Buf) == 0 {
				continue
			}
			base := unsafe.Pointer(unsafe.SliceData(op.Buf))
			pin.Pin(base)
			for done := uint64(0); done < uint64(len(op.Buf)); {
				n := uint64(len(op.Buf)) - done
				if maxTransfer > 0 && n > maxTransfer {
					n = maxTransfer
				}
				ops[k] = C.gn_op{offset: C.uint64_t(op.Offset + done), size: C.uint64_t(n), buffer: unsafe.Add(base, done)}
				k++
				done += n
			}
		}
		bats[i] = C.gn_batch{tensor: b.Tensor.h, num_ops: C.uint32_t(k - first)}
		if k > first {
			bats[i].ops = &ops[first]
		}
	}
	isRead := C.int(0)
	if read {
		isRead = 1
	}
	var cfb, cfo C.int64_t
	r := C.gn_xfer(C.gn_fn(one), C.gn_fn(batchFn), isRead, cbat, C.uint64_t(len(batches)), &cfb, &cfo)
	return Status(r), int64(cfb), int64(cfo), false
}
