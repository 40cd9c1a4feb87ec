package nixl

import (
	"errors"

	"github.com/gonixl/gonixl/internal/native"
)

// Status is a status code of NIXL's C API (nixl_capi_status_t). Non-negative values are not errors:
// StatusSuccess and StatusInProgress.
type Status int

// Status codes of NIXL's C API. The C API folds most of NIXL's own error codes into StatusBackend. Their C
// names (NIXL_CAPI_SUCCESS, NIXL_CAPI_ERROR_BACKEND, ...) are in the table below.
const (
	StatusSuccess      Status = 0
	StatusInProgress   Status = 1
	StatusInvalidParam Status = -1
	StatusBackend      Status = -2
	StatusInvalidState Status = -3
	StatusException    Status = -4
	StatusNoTelemetry  Status = -5
	StatusNotFound     Status = -6
)

// Sentinel errors. Every error returned by this package that comes from NIXL is an *Error whose Unwrap gives
// one of the status sentinels, so callers test with errors.Is(err, nixl.ErrNotFound) and so on.
var (
	// ErrInvalidParam: NIXL rejected an argument (bad handle, mismatched lengths, unknown memory, index out of range).
	ErrInvalidParam = errors.New("nixl: invalid parameter")
	// ErrBackend: the plugin or transport failed, or NIXL failed in a way its C API does not detail.
	ErrBackend = errors.New("nixl: backend error")
	// ErrInvalidState: the handle is in a state that does not allow the call (e.g. releasing an active request).
	ErrInvalidState = errors.New("nixl: invalid state")
	// ErrException: NIXL threw a C++ exception, caught by its C API.
	ErrException = errors.New("nixl: exception inside NIXL")
	// ErrNoTelemetry: telemetry was asked for on an agent created without CaptureTelemetry.
	ErrNoTelemetry = errors.New("nixl: telemetry is not enabled")
	// ErrNotFound: unknown remote agent (metadata not loaded), unknown plugin, or no backend serves the request.
	ErrNotFound = errors.New("nixl: not found")

	// ErrNotLoaded: NIXL's libraries could not be loaded; the error's text lists every place tried.
	ErrNotLoaded = errors.New("nixl: library not loaded")
	// ErrClosed: the handle (or its agent) was already closed.
	ErrClosed = errors.New("nixl: handle closed")
	// ErrIndexOutOfRange: a descriptor index is outside the prepared list; checked before NIXL is called.
	ErrIndexOutOfRange = errors.New("nixl: descriptor index out of range")
)

// Error is a failed NIXL call (Native true: Code is the C API's status) or a call refused on the Go side
// before NIXL is reached (Native false). Its Unwrap gives the sentinel and the Cause (the context's error for a
// wait it ended), so errors.Is(err, ErrNotFound) matches; errors.As(err, &e) with e of type *Error reaches Op,
// Code, Name, Detail, Hint, Native and Cause (Desc stays empty: NIXL's C API does not describe its codes). It is
// the one error shape of gonixl's native-library packages (cuda.Error and neuron.Error are the same
// generic type over their own codes).
type Error = native.Error[Status]

// statuses is the data table behind Error: each C API status's C name, sentinel and what to do. Statuses
// missing from it (NIXL releases newer than this package) match ErrBackend.
var statuses = &native.Table[Status]{
	Prefix:  "nixl",
	Unknown: "nixl_capi_status_t(%d)",
	Default: ErrBackend,
	Rows: map[Status]native.Row{
		StatusSuccess:      {Name: "NIXL_CAPI_SUCCESS"},
		StatusInProgress:   {Name: "NIXL_CAPI_IN_PROG"},
		StatusInvalidParam: {Name: "NIXL_CAPI_ERROR_INVALID_PARAM", Sentinel: ErrInvalidParam, Hint: "NIXL refused a handle, length or descriptor; check them against what was registered and prepared"},
		StatusBackend:      {Name: "NIXL_CAPI_ERROR_BACKEND", Sentinel: ErrBackend, Hint: "the plugin or transport failed; NIXL_LOG_LEVEL=DEBUG logs why"},
		StatusInvalidState: {Name: "NIXL_CAPI_ERROR_INVALID_STATE", Sentinel: ErrInvalidState, Hint: "the handle's state does not allow this (e.g. a request still in flight); wait for it or make a new one"},
		StatusException:    {Name: "NIXL_CAPI_ERROR_EXCEPTION", Sentinel: ErrException, Hint: "NIXL threw inside the call; NIXL_LOG_LEVEL=DEBUG logs what"},
		StatusNoTelemetry:  {Name: "NIXL_CAPI_ERROR_NO_TELEMETRY", Sentinel: ErrNoTelemetry, Hint: "telemetry needs an agent created with AgentConfig.CaptureTelemetry"},
		StatusNotFound:     {Name: "NIXL_CAPI_ERROR_NOT_FOUND", Sentinel: ErrNotFound, Hint: "NIXL knows no such agent, memory or backend: load the peer's metadata (LoadRemoteMetadata), register the memory, or create the backend first"},
	},
}

// String returns the C name of the status ("NIXL_CAPI_ERROR_NOT_FOUND"), or "nixl_capi_status_t(n)" for
// codes this package does not know.
func (s Status) String() string { return statuses.NameOf(s) }

// check turns a C API status into nil (success or in progress) or an *Error.
func check(op string, s status, detail string) error {
	if st := Status(s); st < 0 {
		return statuses.Failed(op, st, detail)
	}
	return nil
}

// goErr is a call refused on the Go side before NIXL is called, its detail formatted as by fmt.Errorf; it
// matches sentinel and any error given with %w (see native.Table.Refusef).
func goErr(op string, sentinel error, format string, args ...any) error {
	return statuses.Refusef(op, sentinel, format, args...)
}
