package protocol

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns wraps one of them, so callers can branch with errors.Is.
var (
	// ErrUnknownVersion: no profile covers the vLLM version string. Upgrade gonixl, or pick a profile by name
	// with ProfileByName when you know which wire format the peer speaks (e.g. a dev build).
	ErrUnknownVersion = errors.New("protocol: no profile for this vLLM version")
	// ErrMalformed: bytes that are not valid for the profile's wire format (bad msgpack, wrong type, trailing data).
	ErrMalformed = errors.New("protocol: malformed message")
	// ErrMissingField: a required field of a msgspec-decoded object is absent.
	ErrMissingField = errors.New("protocol: missing required field")
	// ErrInvalid: a Go value that cannot be put on the wire for this profile (e.g. a negative TP rank).
	ErrInvalid = errors.New("protocol: invalid value")
	// ErrHashMismatch: the peer's compatibility hash differs from ours while enforcement is on.
	ErrHashMismatch = errors.New("protocol: compatibility hash mismatch")
	// ErrEngineMismatch: the metadata's engine_id differs from the remote_engine_id the request named.
	ErrEngineMismatch = errors.New("protocol: remote engine id mismatch")
	// ErrUnsupported: the profile has no such feature (e.g. a heartbeat on a profile without leases).
	ErrUnsupported = errors.New("protocol: not supported by this profile")
)

// FieldError says which field of which object failed; it wraps ErrMalformed, ErrMissingField or ErrInvalid.
type FieldError struct {
	Object string // "NixlAgentMetadata", "NixlHandshakePayload", "kv_transfer_params", ...
	Field  string // wire name; "" for the object itself
	Err    error  // a sentinel, possibly wrapped with detail
	Detail string
}

func (e *FieldError) Error() string {
	where := e.Object
	if e.Field != "" {
		where += "." + e.Field
	}
	if e.Detail == "" {
		return fmt.Sprintf("%v: %s", e.Err, where)
	}
	return fmt.Sprintf("%v: %s: %s", e.Err, where, e.Detail)
}

func (e *FieldError) Unwrap() error { return e.Err }

func malformed(object, field, format string, args ...any) error {
	return &FieldError{Object: object, Field: field, Err: ErrMalformed, Detail: fmt.Sprintf(format, args...)}
}

func invalid(object, field, format string, args ...any) error {
	return &FieldError{Object: object, Field: field, Err: ErrInvalid, Detail: fmt.Sprintf(format, args...)}
}
