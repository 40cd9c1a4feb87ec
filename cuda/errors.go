package cuda

import (
	"errors"

	"github.com/gonixl/gonixl/internal/dl"
	"github.com/gonixl/gonixl/internal/native"
)

// Result is a CUDA driver API status code (CUresult). A Result other than Success is itself an error, and
// the sentinels below are Results, so errors.Is(err, cuda.ErrOutOfMemory) matches any error of this
// package that carries CUDA_ERROR_OUT_OF_MEMORY.
type Result int

// Success is CUDA_SUCCESS.
const Success Result = 0

// Sentinel errors, one per driver status that callers act on. Every *Error of a driver status unwraps to
// its Result.
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

// results is the data table behind Result.Error and Error: each status's C name (used when the driver is
// not loaded, so cuGetErrorName cannot be asked), sentinel and what a caller should do. The driver's own
// name and description come first when it is loaded. A status missing from the table is its own sentinel.
var results = &native.Table[Result]{
	Prefix:   "cuda",
	Unknown:  "CUresult(%d)",
	Name:     driverErrorName,
	Describe: driverErrorString,
	Rows: map[Result]native.Row{
		0:   {Name: "CUDA_SUCCESS"},
		1:   {Name: "CUDA_ERROR_INVALID_VALUE", Sentinel: ErrInvalidValue, Hint: "check the pointer, size and offsets passed"},
		2:   {Name: "CUDA_ERROR_OUT_OF_MEMORY", Sentinel: ErrOutOfMemory, Hint: "free device memory or ask for less (see Device.MemInfo)"},
		3:   {Name: "CUDA_ERROR_NOT_INITIALIZED", Sentinel: ErrNotInitialized, Hint: "call cuda.Load first"},
		4:   {Name: "CUDA_ERROR_DEINITIALIZED", Sentinel: ErrDeinitialized, Hint: "the driver is shutting down"},
		34:  {Name: "CUDA_ERROR_STUB_LIBRARY", Sentinel: ErrStubLibrary, Hint: "a CUDA toolkit stub libcuda was loaded; point LoadOptions.Path or the loader at the real driver's libcuda.so.1"},
		46:  {Name: "CUDA_ERROR_DEVICE_UNAVAILABLE", Sentinel: ErrDeviceUnavailable, Hint: "the GPU is busy in exclusive mode or unavailable"},
		100: {Name: "CUDA_ERROR_NO_DEVICE", Sentinel: ErrNoDevice, Hint: "no CUDA-capable GPU is visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)"},
		101: {Name: "CUDA_ERROR_INVALID_DEVICE", Sentinel: ErrInvalidDevice, Hint: "the device ordinal is out of range (see Driver.DeviceCount)"},
		201: {Name: "CUDA_ERROR_INVALID_CONTEXT", Sentinel: ErrInvalidContext, Hint: "the context was released; reopen the device"},
		400: {Name: "CUDA_ERROR_INVALID_HANDLE", Sentinel: ErrInvalidHandle, Hint: "the stream or event was destroyed"},
		500: {Name: "CUDA_ERROR_NOT_FOUND", Sentinel: ErrNotFound},
		600: {Name: "CUDA_ERROR_NOT_READY", Sentinel: ErrNotReady, Hint: "the work is still running; wait for it"},
		700: {Name: "CUDA_ERROR_ILLEGAL_ADDRESS", Sentinel: ErrIllegalAddress, Hint: "a device access faulted; the context is unusable, restart the process"},
		712: {Name: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", Sentinel: ErrAlreadyRegistered, Hint: "the host range is already pinned"},
		713: {Name: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", Sentinel: ErrNotRegistered, Hint: "the host range was not registered"},
		800: {Name: "CUDA_ERROR_NOT_PERMITTED", Sentinel: ErrNotPermitted},
		801: {Name: "CUDA_ERROR_NOT_SUPPORTED", Sentinel: ErrNotSupported, Hint: "the device or driver does not support this"},
		802: {Name: "CUDA_ERROR_SYSTEM_NOT_READY", Sentinel: ErrSystemNotReady, Hint: "the driver's system services (e.g. fabric manager) are not running"},
		803: {Name: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", Sentinel: ErrDriverMismatch, Hint: "the user-mode libcuda does not match the kernel driver; load the driver's own libcuda.so.1"},
		999: {Name: "CUDA_ERROR_UNKNOWN", Sentinel: ErrUnknown},
	},
}

// Error returns the driver's name of the code, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
func (r Result) Error() string { return results.NameOf(r) }

// Error is a failed driver call (Native true: Code is the driver's status, Desc its cuGetErrorString), or
// an argument this package refused before calling the driver (Native false: Code is the status the driver
// would have given, usually CUDA_ERROR_INVALID_VALUE, and zero for a closed handle). Its Unwrap gives the
// Result (ErrClosed for a closed handle) and the Cause (a layout refusal, the context that ended a wait), so
// errors.Is matches the sentinels and those. errors.As reaches Op, Code, Name, Desc, Detail, Hint, Native and
// Cause. It is the one error shape of
// gonixl's native-library packages (nixl.Error and neuron.Error are the same generic type over their own
// codes).
type Error = native.Error[Result]

// check turns a driver status into nil or an *Error naming the entry point.
func check(r Result, op, detail string) error {
	if r == Success {
		return nil
	}
	return results.Failed(op, r, detail)
}

// invalid is an argument refused before the driver is called, its detail formatted as by fmt.Errorf: it
// matches ErrInvalidValue and any error given with %w (a layout error; see native.Table.Refusef).
func invalid(op, format string, args ...any) error {
	return results.Refusef(op, ErrInvalidValue, format, args...)
}

// closedErr reports use of a closed handle; what names it.
func closedErr(what string) error { return results.Refused(what, ErrClosed, "used after Close") }

// LoadError reports that no CUDA driver library could be loaded: each candidate (Tried) with why it failed
// (Why). It unwraps to ErrNotLoaded. It is the loaders' one shape (nixl.LoadError and neuron.LoadError are
// the same type).
type LoadError = dl.LoadError
