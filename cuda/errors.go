package cuda

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gonixl/gonixl/internal/dl"
)

// Result is a CUDA driver API status code (CUresult). A Result other than Success is itself an error, and
// the sentinels below are Results, so errors.Is(err, cuda.ErrOutOfMemory) matches any error of this
// package that carries CUDA_ERROR_OUT_OF_MEMORY.
type Result int

// Success is CUDA_SUCCESS.
const Success Result = 0

// Sentinel errors, one per driver status that callers act on. Every *Error unwraps to its Result.
var (
	ErrInvalidValue      error = Result(1)   // CUDA_ERROR_INVALID_VALUE
	ErrOutOfMemory       error = Result(2)   // CUDA_ERROR_OUT_OF_MEMORY
	ErrNotInitialized    error = Result(3)   // CUDA_ERROR_NOT_INITIALIZED
	ErrDeinitialized     error = Result(4)   // CUDA_ERROR_DEINITIALIZED
	ErrStubLibrary       error = Result(34)  // CUDA_ERROR_STUB_LIBRARY
	ErrDeviceUnavailable error = Result(46)  // CUDA_ERROR_DEVICE_UNAVAILABLE
	ErrNoDevice          error = Result(100) // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice     error = Result(101) // CUDA_ERROR_INVALID_DEVICE
	ErrInvalidContext    error = Result(201) // CUDA_ERROR_INVALID_CONTEXT
	ErrInvalidHandle     error = Result(400) // CUDA_ERROR_INVALID_HANDLE
	ErrNotFound          error = Result(500) // CUDA_ERROR_NOT_FOUND
	ErrNotReady          error = Result(600) // CUDA_ERROR_NOT_READY
	ErrIllegalAddress    error = Result(700) // CUDA_ERROR_ILLEGAL_ADDRESS
	ErrAlreadyRegistered error = Result(712) // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
	ErrNotRegistered     error = Result(713) // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
	ErrNotPermitted      error = Result(800) // CUDA_ERROR_NOT_PERMITTED
	ErrNotSupported      error = Result(801) // CUDA_ERROR_NOT_SUPPORTED
	ErrSystemNotReady    error = Result(802) // CUDA_ERROR_SYSTEM_NOT_READY
	ErrDriverMismatch    error = Result(803) // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
	ErrUnknown           error = Result(999) // CUDA_ERROR_UNKNOWN
)

// Errors of this package that are not driver statuses.
var (
	// ErrNotLoaded: libcuda.so.1 could not be loaded (no NVIDIA driver, or a build without cgo). The
	// *LoadError that wraps it lists every place tried.
	ErrNotLoaded = errors.New("cuda: driver library not loaded")
	// ErrClosed: the handle (device, allocation, stream, event, cache) was already closed.
	ErrClosed = errors.New("cuda: handle closed")
)

// resultInfo is one row of the status table: the driver's name for the code (used when the driver is not
// loaded, so cuGetErrorName cannot be asked) and what a caller should do about it.
type resultInfo struct {
	name string
	hint string
}

// results is the data table behind Result.Error and Error.Error.
var results = map[Result]resultInfo{
	0:   {"CUDA_SUCCESS", ""},
	1:   {"CUDA_ERROR_INVALID_VALUE", "check the pointer, size and offsets passed"},
	2:   {"CUDA_ERROR_OUT_OF_MEMORY", "free device memory or ask for less (see Device.MemInfo)"},
	3:   {"CUDA_ERROR_NOT_INITIALIZED", "call cuda.Load first"},
	4:   {"CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"},
	34:  {"CUDA_ERROR_STUB_LIBRARY", "a CUDA toolkit stub libcuda was loaded; point LoadOptions.Path or the loader at the real driver's libcuda.so.1"},
	46:  {"CUDA_ERROR_DEVICE_UNAVAILABLE", "the GPU is busy in exclusive mode or unavailable"},
	100: {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable GPU is visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)"},
	101: {"CUDA_ERROR_INVALID_DEVICE", "the device ordinal is out of range (see Driver.DeviceCount)"},
	201: {"CUDA_ERROR_INVALID_CONTEXT", "the context was released; reopen the device"},
	400: {"CUDA_ERROR_INVALID_HANDLE", "the stream or event was destroyed"},
	500: {"CUDA_ERROR_NOT_FOUND", ""},
	600: {"CUDA_ERROR_NOT_READY", "the work is still running; wait for it"},
	700: {"CUDA_ERROR_ILLEGAL_ADDRESS", "a device access faulted; the context is unusable, restart the process"},
	712: {"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "the host range is already pinned"},
	713: {"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "the host range was not registered"},
	800: {"CUDA_ERROR_NOT_PERMITTED", ""},
	801: {"CUDA_ERROR_NOT_SUPPORTED", "the device or driver does not support this"},
	802: {"CUDA_ERROR_SYSTEM_NOT_READY", "the driver's system services (e.g. fabric manager) are not running"},
	803: {"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "the user-mode libcuda does not match the kernel driver; load the driver's own libcuda.so.1"},
	999: {"CUDA_ERROR_UNKNOWN", ""},
}

// Error returns the driver's name of the code, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
func (r Result) Error() string {
	if n := driverErrorName(r); n != "" {
		return n
	}
	if info, ok := results[r]; ok {
		return info.name
	}
	return fmt.Sprintf("CUresult(%d)", int(r))
}

// Error is a failed driver call, or an argument this package refused before calling the driver (then
// Code is the status the driver would have given, usually CUDA_ERROR_INVALID_VALUE, and Native is false).
type Error struct {
	Op     string // the driver entry point or operation, e.g. "cuMemAlloc_v2"
	Code   Result // the status
	Name   string // the driver's name for Code (cuGetErrorName)
	Desc   string // the driver's description of Code (cuGetErrorString)
	Detail string // what was asked: sizes, addresses, indexes
	Native bool   // true when the driver returned Code; false when this package refused the call first
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("cuda: ")
	b.WriteString(e.Op)
	if e.Detail != "" {
		b.WriteString(" (")
		b.WriteString(e.Detail)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Name)
	if e.Desc != "" {
		b.WriteString(": ")
		b.WriteString(e.Desc)
	}
	if info, ok := results[e.Code]; ok && info.hint != "" {
		b.WriteString(" — ")
		b.WriteString(info.hint)
	}
	return b.String()
}

// Unwrap returns the Result, so errors.Is matches the sentinels.
func (e *Error) Unwrap() error { return e.Code }

// check turns a driver status into nil or an *Error naming the entry point.
func check(r Result, op, detail string) error {
	if r == Success {
		return nil
	}
	return newError(r, op, detail, true)
}

func newError(r Result, op, detail string, native bool) *Error {
	e := &Error{Op: op, Code: r, Detail: detail, Native: native}
	e.Name = r.Error()
	e.Desc = driverErrorString(r)
	return e
}

// invalid is an argument refused before the driver is called.
func invalid(op, format string, args ...any) error {
	return newError(Result(1), op, fmt.Sprintf(format, args...), false)
}

// closedErr reports use of a closed handle.
func closedErr(what string) error { return fmt.Errorf("%w: %s", ErrClosed, what) }

// LoadError reports that no CUDA driver library could be loaded: each candidate (Tried) with why it failed
// (Why). It unwraps to ErrNotLoaded. It is the loaders' one shape (nixl.LoadError and neuron.LoadError are
// the same type).
type LoadError = dl.LoadError
