package nixl

import (
	"errors"
)

// Status is a status code of NIXL's C API (nixl_capi_status_t). Non-negative values are not errors:
// StatusSuccess and StatusInProgress.
type Status int

// Status codes of NIXL's C API. The C API folds most of NIXL's own error codes into StatusBackend.
const (
	StatusSuccess      Status = 0  // SUCCESS
	StatusInProgress   Status = 1  // IN_PROG
	StatusInvalidParam Status = -1 // ERR_INVALID_PARAM
	StatusBackend      Status = -2 // ERR_BACKEND
	StatusInvalidState Status = -3 // ERR_INVALID_STATE
	StatusException    Status = -4 // ERR_EXCEPTION
	StatusNoTelemetry  Status = -5 // ERR_NO_TELEMETRY
	StatusNotFound     Status = -6 // ERR_NOT_FOUND
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

// Error is an error reported by NIXL (or found by this package before calling NIXL).
type Error struct {
	Op     string // the operation, e.g. "register memory"
	Status Status // the C API status, or StatusSuccess for errors found on the Go side
	Detail string // extra context: agent names, counts, what to do
	err    error  // the sentinel
}

func (e *Error) Error() string {
	msg := "nixl: " + e.Op
	if e.Status != StatusSuccess {
		msg += ": " + e.Status.String()
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Unwrap returns the sentinel matching the status.
func (e *Error) Unwrap() error { return e.err }

func sentinelFor(s Status) error {
	switch s {
	case StatusInvalidParam:
		return ErrInvalidParam
	case StatusInvalidState:
		return ErrInvalidState
	case StatusException:
		return ErrException
	case StatusNoTelemetry:
		return ErrNoTelemetry
	case StatusNotFound:
		return ErrNotFound
	}
	return ErrBackend
}

// check turns a C API status into nil (success or in progress) or an *Error.
func check(op string, s status, detail string) error {
	st := Status(s)
	if st >= 0 {
		return nil
	}
	return &Error{Op: op, Status: st, Detail: detail, err: sentinelFor(st)}
}

func goErr(op string, sentinel error, detail string) error {
	return &Error{Op: op, Detail: detail, err: sentinel}
}
