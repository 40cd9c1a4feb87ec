// Package native holds the one error shape of gonixl's native-library packages (nixl, cuda, neuron): a
// failed call into the library, or an argument refused on the Go side before the call, as an Error whose
// Unwrap gives the package's sentinel, so callers test with errors.Is(err, pkg.ErrX). Each package
// describes its library's status codes in a Table (C name, sentinel, hint) and aliases the error type:
// type Error = native.Error[Status]. This package has no cgo; a library's own name and description of a
// code come through the Table's optional functions.
package native

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Code is a native library's status type: a C enum or int (nixl_capi_status_t, CUresult, NRT_STATUS).
type Code interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64
}

// Row describes one status code of a library.
type Row struct {
	Name     string // the C name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Sentinel error  // what errors.Is matches for this code; nil for success codes
	Hint     string // what the caller should do about it, or ""
}

// Table is a library's status codes, the data behind every Error of one package.
type Table[C Code] struct {
	Prefix  string    // the package name that starts every message, e.g. "cuda"
	Rows    map[C]Row // the codes this package knows
	Unknown string    // how to name a code missing from Rows, a format with one %d, e.g. "CUresult(%d)" ("status %d" if empty)
	// Default is the sentinel of a code missing from Rows. When nil, a code whose type implements error is
	// its own sentinel; otherwise such a code matches no sentinel.
	Default error
	// Name, optional, asks the loaded library for its name of a code (cuGetErrorName); "" when it cannot
	// tell. Rows' names are used otherwise.
	Name func(C) string
	// Describe, optional, asks the loaded library for its description of a code (cuGetErrorString); ""
	// when it cannot tell.
	Describe func(C) string
}

// NameOf returns the name of a code: the library's own (Table.Name), else the row's, else Unknown's format.
func (t *Table[C]) NameOf(c C) string {
	if t.Name != nil {
		if n := t.Name(c); n != "" {
			return n
		}
	}
	if r, ok := t.Rows[c]; ok {
		return r.Name
	}
	if t.Unknown == "" {
		return fmt.Sprintf("status %d", int64(c))
	}
	return fmt.Sprintf(t.Unknown, int64(c))
}

// Sentinel returns what errors.Is matches for a code: its row's sentinel, else Default, else the code
// itself when it is an error.
func (t *Table[C]) Sentinel(c C) error {
	if r, ok := t.Rows[c]; ok {
		return r.Sentinel
	}
	if t.Default != nil {
		return t.Default
	}
	if err, ok := any(c).(error); ok {
		return err
	}
	return nil
}

// Codes returns the codes of the table in increasing order.
func (t *Table[C]) Codes() []C {
	codes := make([]C, 0, len(t.Rows))
	for c := range t.Rows {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	return codes
}

// Failed is the error of a call the library failed with code c. Its description comes from Table.Describe
// when the table has one.
func (t *Table[C]) Failed(op string, c C, detail string) *Error[C] {
	e := &Error[C]{Op: op, Code: c, Name: t.NameOf(c), Detail: detail, Hint: t.Rows[c].Hint, Native: true,
		prefix: t.Prefix, sentinel: t.Sentinel(c)}
	if t.Describe != nil {
		e.Desc = t.Describe(c)
	}
	return e
}

// Refused is the error of a call refused on the Go side before reaching the library. Its Code is the
// lowest code whose row has this sentinel (the status the library would have given), or zero when none has.
// It has no Hint: the row's hint is about the library's status, while detail says what this call got wrong.
func (t *Table[C]) Refused(op string, sentinel error, detail string) *Error[C] {
	e := &Error[C]{Op: op, Detail: detail, prefix: t.Prefix, sentinel: sentinel}
	for _, c := range t.Codes() {
		if r := t.Rows[c]; sentinel != nil && r.Sentinel == sentinel {
			e.Code, e.Name = c, r.Name
			break
		}
	}
	return e
}

// Refusef is Refused with a detail formatted as fmt.Errorf formats it. An error given with %w is also the
// Error's Cause (several %w: their join), so errors.Is and errors.As reach it as well as the sentinel; its
// text is then part of Detail. sentinel may be nil when no sentinel of the package fits (a context error).
func (t *Table[C]) Refusef(op string, sentinel error, format string, args ...any) *Error[C] {
	w := fmt.Errorf(format, args...)
	e := t.Refused(op, sentinel, w.Error())
	if many, ok := w.(interface{ Unwrap() []error }); ok {
		e.Cause = errors.Join(many.Unwrap()...)
	} else {
		e.Cause = errors.Unwrap(w)
	}
	return e
}

// Error is a failed native call (Native true: the library returned Code), or an argument refused on the Go
// side before the call (Native false: Code is the status the library would have given, or zero). Unwrap
// gives the package's sentinel and the Cause, so errors.Is(err, pkg.ErrX) matches; errors.As reaches the
// fields.
type Error[C Code] struct {
	Op     string // the C function or operation, e.g. "cuMemAlloc_v2", "register memory"
	Code   C      // the status
	Name   string // the C name of Code, e.g. "NRT_TIMEOUT"; "" for a Go-side refusal no code stands for
	Desc   string // the library's own description of Code (cuGetErrorString, nrt_get_status_as_str), or ""
	Detail string // what was asked: names, sizes, indexes
	Hint   string // what to do about the library's status (from the table; "" for a Go-side refusal)
	Native bool   // true when the library returned Code; false when the call was refused on the Go side
	Cause  error  // an error of another package this one wraps (a layout or context error; see Refusef), or nil

	prefix   string
	sentinel error
}

// Error reads "prefix: op: detail: NAME (code): description — hint" for a native failure and
// "prefix: op: detail: sentinel" for a Go-side refusal; empty parts are left out.
func (e *Error[C]) Error() string {
	parts := make([]string, 0, 5)
	for _, p := range []string{e.prefix, e.Op, e.Detail} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	switch {
	case e.Native:
		parts = append(parts, fmt.Sprintf("%s (%d)", e.Name, int64(e.Code)))
		if e.Desc != "" && e.Desc != e.Name {
			parts = append(parts, e.Desc)
		}
	case e.sentinel != nil:
		parts = append(parts, strings.TrimPrefix(e.sentinel.Error(), e.prefix+": "))
	}
	msg := strings.Join(parts, ": ")
	if e.Hint != "" {
		msg += " — " + e.Hint
	}
	return msg
}

// Unwrap returns the sentinel of the code (or, for a Go-side refusal, the sentinel it was refused with) and
// the Cause, whichever are set, so errors.Is matches both.
func (e *Error[C]) Unwrap() []error {
	errs := make([]error, 0, 2)
	for _, err := range []error{e.sentinel, e.Cause} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
