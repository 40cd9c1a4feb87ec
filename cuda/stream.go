package cuda

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// Stream is a CUDA stream (created non-blocking: it does not synchronise with the legacy default stream).
// Work enqueued on one stream runs in order. Safe for concurrent use; Close waits for running calls.
type Stream struct {
	r   *resource
	dev *Device
	h   uintptr
}

const streamNonBlocking = 0x1

// NewStream creates a stream (cuStreamCreate, CU_STREAM_NON_BLOCKING).
func (dev *Device) NewStream() (*Stream, error) {
	st := dev.st
	if err := st.use(); err != nil {
		return nil, err
	}
	defer st.mu.RUnlock()
	h, r := cStreamCreate(st.ctx, streamNonBlocking)
	if err := check(r, "cuStreamCreate", ""); err != nil {
		return nil, err
	}
	ctx := st.ctx
	s := &Stream{dev: dev, h: h}
	s.r = st.newResource(fmt.Sprintf("stream %#x", h), func() error {
		// Destroying a stream with work pending is allowed; the driver frees it once the work completes.
		return check(cStreamDestroy(ctx, h), "cuStreamDestroy_v2", "")
	})
	runtime.AddCleanup(s, func(r *resource) { _ = r.close() }, s.r)
	return s, nil
}

// Enqueue issues every copy of ops on the stream in one cgo call and returns without waiting. Host
// buffers must stay valid (and should be pinned) until the stream has finished them.
func (s *Stream) Enqueue(dir Direction, ops []Copy) error {
	if err := checkOps(dir, ops); err != nil {
		return err
	}
	if err := s.r.use(); err != nil {
		return err
	}
	defer s.r.done()
	i, r := cCopyBatch(s.r.st.ctx, s.r.st.ordinal, dir, ops, s.h, false)
	return batchErr(dir, ops, i, r)
}

// Synchronize blocks the calling goroutine (and its OS thread) until the stream is idle
// (cuStreamSynchronize). Use Wait to honour a context.
func (s *Stream) Synchronize() error {
	if err := s.r.use(); err != nil {
		return err
	}
	defer s.r.done()
	return check(cStreamSync(s.r.st.ctx, s.h), "cuStreamSynchronize", "")
}

// Query reports whether all work on the stream has completed (cuStreamQuery).
func (s *Stream) Query() (bool, error) {
	if err := s.r.use(); err != nil {
		return false, err
	}
	defer s.r.done()
	switch r := cStreamQuery(s.r.st.ctx, s.h); r {
	case Success:
		return true, nil
	case Result(600):
		return false, nil
	default:
		return false, check(r, "cuStreamQuery", "")
	}
}

// Wait polls the stream until it is idle, an error occurs, or ctx ends.
func (s *Stream) Wait(ctx context.Context) error {
	if err := s.r.use(); err != nil {
		return err
	}
	defer s.r.done()
	return pollWait(ctx, func() Result { return cStreamQuery(s.r.st.ctx, s.h) }, "cuStreamQuery")
}

// WaitEvent makes future work on s wait for e (cuStreamWaitEvent); it does not block the host.
func (s *Stream) WaitEvent(e *Event) error {
	if err := s.r.use(); err != nil {
		return err
	}
	defer s.r.done()
	if err := e.r.use(); err != nil {
		return err
	}
	defer e.r.done()
	return check(cStreamWaitEvent(s.r.st.ctx, s.h, e.h), "cuStreamWaitEvent", "")
}

// Close destroys the stream. It is idempotent.
func (s *Stream) Close() error { return s.r.close() }

// Event is a CUDA event, for ordering streams and timing work.
type Event struct {
	r   *resource
	dev *Device
	h   uintptr
}

const eventDisableTiming = 0x2

// NewEvent creates an event (cuEventCreate); timing enables Elapsed on it.
func (dev *Device) NewEvent(timing bool) (*Event, error) {
	st := dev.st
	if err := st.use(); err != nil {
		return nil, err
	}
	defer st.mu.RUnlock()
	flags := uint32(0)
	if !timing {
		flags = eventDisableTiming
	}
	h, r := cEventCreate(st.ctx, flags)
	if err := check(r, "cuEventCreate", ""); err != nil {
		return nil, err
	}
	ctx := st.ctx
	e := &Event{dev: dev, h: h}
	e.r = st.newResource(fmt.Sprintf("event %#x", h), func() error {
		return check(cEventDestroy(ctx, h), "cuEventDestroy_v2", "")
	})
	runtime.AddCleanup(e, func(r *resource) { _ = r.close() }, e.r)
	return e, nil
}

// Record captures the work enqueued so far on s (nil: the legacy default stream) (cuEventRecord).
func (e *Event) Record(s *Stream) error {
	if err := e.r.use(); err != nil {
		return err
	}
	defer e.r.done()
	var h uintptr
	if s != nil {
		if err := s.r.use(); err != nil {
			return err
		}
		defer s.r.done()
		h = s.h
	}
	return check(cEventRecord(e.r.st.ctx, e.h, h), "cuEventRecord", "")
}

// Synchronize blocks until the recorded work has completed (cuEventSynchronize).
func (e *Event) Synchronize() error {
	if err := e.r.use(); err != nil {
		return err
	}
	defer e.r.done()
	return check(cEventSync(e.r.st.ctx, e.h), "cuEventSynchronize", "")
}

// Query reports whether the recorded work has completed (cuEventQuery).
func (e *Event) Query() (bool, error) {
	if err := e.r.use(); err != nil {
		return false, err
	}
	defer e.r.done()
	switch r := cEventQuery(e.r.st.ctx, e.h); r {
	case Success:
		return true, nil
	case Result(600):
		return false, nil
	default:
		return false, check(r, "cuEventQuery", "")
	}
}

// Wait polls until the recorded work has completed, an error occurs, or ctx ends.
func (e *Event) Wait(ctx context.Context) error {
	if err := e.r.use(); err != nil {
		return err
	}
	defer e.r.done()
	return pollWait(ctx, func() Result { return cEventQuery(e.r.st.ctx, e.h) }, "cuEventQuery")
}

// Close destroys the event. It is idempotent.
func (e *Event) Close() error { return e.r.close() }

// Elapsed is the GPU time between two completed events recorded with timing enabled
// (cuEventElapsedTime_v2, about 0.5 µs resolution).
func Elapsed(start, end *Event) (time.Duration, error) {
	if err := start.r.use(); err != nil {
		return 0, err
	}
	defer start.r.done()
	if end != start {
		if err := end.r.use(); err != nil {
			return 0, err
		}
		defer end.r.done()
	}
	ms, r := cEventElapsed(start.r.st.ctx, start.h, end.h)
	if err := check(r, "cuEventElapsedTime_v2", ""); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
