package neuron

import (
	"errors"
	"fmt"
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

	// ErrNotFound: libnrt.so.1 could not be loaded (see LoadOptions.Path and GONIXL_NRT_LIB); the error is a *LoadError.
	ErrNotFound = errors.New("neuron: libnrt not found")
	// ErrSymbol: the library lacks a required libnrt function.
	ErrSymbol = errors.New("neuron: required libnrt symbol missing")
	// ErrBusy: libnrt is process-wide and another Runtime of this process holds it.
	ErrBusy = errors.New("neuron: libnrt already opened by this process")
	// ErrBadArgument: a call was rejected on the Go side before reaching native code.
	ErrBadArgument = errors.New("neuron: bad argument")
	// ErrTooLarge: a requested size is beyond what this package or the machine can hold.
	ErrTooLarge = errors.New("neuron: size too large")
)

// statusInfo is one row of the NRT_STATUS table: the C name, the sentinel it maps to and a hint on what to do.
type statusInfo struct {
	name     string
	sentinel error
	hint     string
}

// statusTable maps NRT_STATUS codes (nrt_status.h) to names, sentinels and advice. Codes 8 and 12 are unused.
var statusTable = map[Status]statusInfo{
	0:    {"NRT_SUCCESS", nil, ""},
	1:    {"NRT_FAILURE", ErrFailure, "check the Neuron runtime log (NEURON_RT_LOG_LEVEL=INFO)"},
	2:    {"NRT_INVALID", ErrInvalid, "an offset, size, core index or placement was refused; check bounds and DMA alignment (Options.MaxTransfer)"},
	3:    {"NRT_INVALID_HANDLE", ErrInvalidHandle, "the tensor was freed or never allocated"},
	4:    {"NRT_RESOURCE", ErrResource, "device memory is exhausted; free tensors or use fewer/smaller ones"},
	5:    {"NRT_TIMEOUT", ErrTimeout, "the device did not answer in time (NEURON_RT_EXEC_TIMEOUT); retry or reset the workload"},
	6:    {"NRT_HW_ERROR", ErrHardware, "a hardware error occurred; check neuron-top / dmesg"},
	7:    {"NRT_QUEUE_FULL", ErrQueue, "too many requests in flight; retry later"},
	9:    {"NRT_LOAD_NOT_ENOUGH_NC", ErrNotEnoughCores, "fewer NeuronCores are visible than needed (NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES), or another process owns them"},
	10:   {"NRT_UNSUPPORTED_NEFF_VERSION", ErrInvalid, "the NEFF was compiled for another runtime"},
	11:   {"NRT_FAIL_HOST_MEM_ALLOC", ErrResource, "host memory allocation failed"},
	13:   {"NRT_UNINITIALIZED", ErrUninitialized, "call Load (nrt_init) first"},
	14:   {"NRT_CLOSED", ErrClosed, "the runtime was closed (nrt_close); open a new Runtime"},
	15:   {"NRT_QUEUE_EMPTY", ErrQueue, ""},
	101:  {"NRT_EXEC_UNIT_UNRECOVERABLE", ErrHardware, "the execution unit is unrecoverable; restart the process"},
	1002: {"NRT_EXEC_BAD_INPUT", ErrExecution, ""},
	1003: {"NRT_EXEC_COMPLETED_WITH_NUM_ERR", ErrExecution, ""},
	1004: {"NRT_EXEC_COMPLETED_WITH_ERR", ErrExecution, ""},
	1005: {"NRT_EXEC_NC_BUSY", ErrExecution, "the NeuronCore is busy"},
	1006: {"NRT_EXEC_OOB", ErrExecution, ""},
	1100: {"NRT_COLL_PENDING", ErrExecution, ""},
	1200: {"NRT_EXEC_HW_ERR_COLLECTIVES", ErrHardware, ""},
	1201: {"NRT_EXEC_HW_ERR_HBM_UE", ErrHardware, "uncorrectable HBM error"},
	1202: {"NRT_EXEC_HW_ERR_NC_UE", ErrHardware, ""},
	1203: {"NRT_EXEC_HW_ERR_DMA_ABORT", ErrHardware, ""},
	1204: {"NRT_EXEC_SW_NQ_OVERFLOW", ErrExecution, ""},
	1205: {"NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE", ErrHardware, ""},
	1206: {"NRT_NETWORK_PROXY_FAILURE", ErrFailure, ""},
}

// String returns the C name of the status ("NRT_TIMEOUT"), or "NRT_STATUS(n)" for unknown codes.
func (s Status) String() string {
	if info, ok := statusTable[s]; ok {
		return info.name
	}
	return fmt.Sprintf("NRT_STATUS(%d)", int32(s))
}

// Error is a failed libnrt call: the operation (the C function), the status it returned and, when the runtime
// offers nrt_get_status_as_str, its own description.
type Error struct {
	Op     string
	Status Status
	Detail string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("neuron: %s: %s (%d)", e.Op, e.Status, int32(e.Status))
	if e.Detail != "" && e.Detail != e.Status.String() {
		msg += ": " + e.Detail
	}
	if info, ok := statusTable[e.Status]; ok && info.hint != "" {
		msg += "; " + info.hint
	}
	return msg
}

// Is matches the sentinel of the error's status (ErrFailure for codes missing from the table).
func (e *Error) Is(target error) bool {
	info, ok := statusTable[e.Status]
	if !ok {
		return target == ErrFailure
	}
	return info.sentinel != nil && target == info.sentinel
}

func statusError(op string, st Status, detail string) error {
	if st == 0 {
		return nil
	}
	return &Error{Op: op, Status: st, Detail: detail}
}
