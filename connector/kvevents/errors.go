package kvevents

import "errors"

// Sentinel errors. Every error this package returns wraps one of them, so callers can branch with errors.Is.
var (
	// ErrUnknownVersion: no KV-event format is known for this vLLM version. Pick one with FormatByName when you
	// know which format the consumer expects.
	ErrUnknownVersion = errors.New("kvevents: no KV-event format for this vLLM version")
	// ErrInvalid: an event or configuration that cannot be put on the wire for the format (e.g. a field the
	// release does not have, a negative block size). Fix the value; nothing was published.
	ErrInvalid = errors.New("kvevents: invalid value")
	// ErrClosed: the publisher was closed; create a new one.
	ErrClosed = errors.New("kvevents: publisher closed")
	// ErrBadRequest: a replay request that is not vLLM's [empty, start sequence] (two frames after the
	// routing identity); vLLM ignores it, and so does the publisher (counted in Stats.BadRequests).
	ErrBadRequest = errors.New("kvevents: malformed replay request")
)
