package neuron

import (
	"errors"

	"github.com/gonixl/gonixl/internal/native"
)

// Status is an NRT_STATUS code returned by libnrt (nrt_status.h; the numbering is stable and only appended to).
type Status int32

// Sentinels for errors.Is. Every *Error carrying a libnrt status matches exactly one of the status sentinels
// below (ErrFailure for codes this package does not know); the others describe failures on the Go side.
var (
	ErrFailure        = errors.New("neuron: libnrt failure")
	ErrInvalid        = errors.New("neuron: invalid argument rejected by libnrt")
	ErrInvalidHandle  = errors.New("neuron: invalid tensor handle")
	ErrResource       = errors.New("neuron: out of device or host resources")
	ErrTimeout        = errors.New("neuron: libnrt operation timed out")
	ErrHardware       = errors.New("neuron: Neuron hardware error")
	ErrQueue          = errors.New("neuron: libnrt queue full or empty")
	ErrNotEnoughCores = errors.New("neuron: not enough NeuronCores")
	ErrUninitialized  = errors.New("neuron: libnrt not initialized")
	ErrClosed         = errors.New("neuron: closed")
	ErrExecution      = errors.New("neuron: execution error")

	// ErrNotLoaded: libnrt.so.1 could not be loaded (see LoadOptions.Path and GONIXL_NRT_LIB); the error is a
	// *LoadError. (nixl.ErrNotLoaded and cuda.ErrNotLoaded are its twins.)
	ErrNotLoaded = errors.New("neuron: libnrt not loaded")
	// ErrSymbol: the library lacks a required libnrt function.
	ErrSymbol = errors.New("neuron: required libnrt symbol missing")
	// ErrBusy: libnrt is process-wide and another Runtime of this process holds it.
	ErrBusy = errors.New("neuron: libnrt already opened by this process")
	// ErrBadArgument: a call was rejected on the Go side before reaching native code.
	ErrBadArgument = errors.New("neuron: bad argument")
	// ErrTooLarge: a requested size is beyond what this package or the machine can hold.
	ErrTooLarge = errors.New("neuron: size too large")
)

// statuses is the data table behind Error: each NRT_STATUS code (nrt_status.h) with its C name, sentinel
// and what to do. Codes 8 and 12 are unused; codes missing from the table match ErrFailure.
var statuses = &native.Table[Status]{
	Prefix:  "neuron",
	Unknown: "NRT_STATUS(%d)",
	Default: ErrFailure,
	Rows: map[Status]native.Row{
		0:    {Name: "NRT_SUCCESS"},
		1:    {Name: "NRT_FAILURE", Sentinel: ErrFailure, Hint: "check the Neuron runtime log (NEURON_RT_LOG_LEVEL=INFO)"},
		2:    {Name: "NRT_INVALID", Sentinel: ErrInvalid, Hint: "an offset, size, core index or placement was refused; check bounds and DMA alignment (LoadOptions.MaxTransfer)"},
		3:    {Name: "NRT_INVALID_HANDLE", Sentinel: ErrInvalidHandle, Hint: "the tensor was freed or never allocated"},
		4:    {Name: "NRT_RESOURCE", Sentinel: ErrResource, Hint: "device memory is exhausted; free tensors or use fewer/smaller ones"},
		5:    {Name: "NRT_TIMEOUT", Sentinel: ErrTimeout, Hint: "the device did not answer in time (NEURON_RT_EXEC_TIMEOUT); retry or reset the workload"},
		6:    {Name: "NRT_HW_ERROR", Sentinel: ErrHardware, Hint: "a hardware error occurred; check neuron-top / dmesg"},
		7:    {Name: "NRT_QUEUE_FULL", Sentinel: ErrQueue, Hint: "too many requests in flight; retry later"},
		9:    {Name: "NRT_LOAD_NOT_ENOUGH_NC", Sentinel: ErrNotEnoughCores, Hint: "fewer NeuronCores are visible than needed (NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES), or another process owns them"},
		10:   {Name: "NRT_UNSUPPORTED_NEFF_VERSION", Sentinel: ErrInvalid, Hint: "the NEFF was compiled for another runtime"},
		11:   {Name: "NRT_FAIL_HOST_MEM_ALLOC", Sentinel: ErrResource, Hint: "host memory allocation failed"},
		13:   {Name: "NRT_UNINITIALIZED", Sentinel: ErrUninitialized, Hint: "call Load (nrt_init) first"},
		14:   {Name: "NRT_CLOSED", Sentinel: ErrClosed, Hint: "the runtime was closed (nrt_close); open a new Runtime"},
		15:   {Name: "NRT_QUEUE_EMPTY", Sentinel: ErrQueue},
		101:  {Name: "NRT_EXEC_UNIT_UNRECOVERABLE", Sentinel: ErrHardware, Hint: "the execution unit is unrecoverable; restart the process"},
		1002: {Name: "NRT_EXEC_BAD_INPUT", Sentinel: ErrExecution},
		1003: {Name: "NRT_EXEC_COMPLETED_WITH_NUM_ERR", Sentinel: ErrExecution},
		1004: {Name: "NRT_EXEC_COMPLETED_WITH_ERR", Sentinel: ErrExecution},
		1005: {Name: "NRT_EXEC_NC_BUSY", Sentinel: ErrExecution, Hint: "the NeuronCore is busy"},
		1006: {Name: "NRT_EXEC_OOB", Sentinel: ErrExecution},
		1100: {Name: "NRT_COLL_PENDING", Sentinel: ErrExecution},
		1200: {Name: "NRT_EXEC_HW_ERR_COLLECTIVES", Sentinel: ErrHardware},
		1201: {Name: "NRT_EXEC_HW_ERR_HBM_UE", Sentinel: ErrHardware, Hint: "uncorrectable HBM error"},
		1202: {Name: "NRT_EXEC_HW_ERR_NC_UE", Sentinel: ErrHardware},
		1203: {Name: "NRT_EXEC_HW_ERR_DMA_ABORT", Sentinel: ErrHardware},
		1204: {Name: "NRT_EXEC_SW_NQ_OVERFLOW", Sentinel: ErrExecution},
		1205: {Name: "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE", Sentinel: ErrHardware},
		1206: {Name: "NRT_NETWORK_PROXY_FAILURE", Sentinel: ErrFailure},
	},
}

// String returns the C name of the status ("NRT_TIMEOUT"), or "NRT_STATUS(n)" for unknown codes.
func (s Status) String() string { return statuses.NameOf(s) }

// Error is a failed libnrt call (Native true): the operation (the C function), the status it returned
// (Code) and, when the runtime offers nrt_get_status_as_str, its own description (Desc); or a call refused
// on the Go side before libnrt (Native false: ErrBadArgument, ErrTooLarge, ErrClosed, ..., with a layout
// error as Cause when layout refused the geometry or block ids). Its Unwrap gives the status's sentinel
// (ErrFailure for codes this package does not know) and the Cause, so errors.Is(err, ErrTimeout) matches. It is
// the one error shape of gonixl's native-library packages (nixl.Error and cuda.Error are the same generic
// type over their own codes).
type Error = native.Error[Status]

// refuse is a call refused on the Go side before libnrt is called, its detail formatted as by fmt.Errorf:
// it matches sentinel and any error given with %w (a layout error, an errno; see native.Table.Refusef).
// sentinel is nil for work stopped by its context, which only the context's error describes.
func refuse(op string, sentinel error, format string, args ...any) error {
	return statuses.Refusef(op, sentinel, format, args...)
}

// statusError turns a libnrt status into nil or an *Error; desc is the runtime's description of it, or "".
func statusError(op string, st Status, desc string) error {
	if st == 0 {
		return nil
	}
	e := statuses.Failed(op, st, "")
	e.Desc = desc
	return e
}
