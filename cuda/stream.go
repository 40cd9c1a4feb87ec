package cuda

import (
	"context"
	"fmt"
	"time"
)

// Stream is a CUDA stream (created non-blocking: it does not synchronise with the legacy default stream).
// Work enqueued on one stream runs in order. Safe for concurrent use; Close waits for running calls.
type Stream struct {
	r   *resource
	dev *Device
	h   streamHandle
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
	s.r = newResource(st, s, fmt.Sprintf("stream %#x", h), func() error {
		// Destroying a stream with work pending is allowed; the driver frees it once the work completes.
		return check(cStreamDestroy(ctx, h), "cuStreamDestroy_v2", "")
	})
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

func (s *Stream) work() work[streamHandle] {
	return work[streamHandle]{s.r, s.h, cStreamSync, "cuStreamSynchronize", cStreamQuery, "cuStreamQuery"}
}

// Synchronize blocks the calling goroutine (and its OS thread) until the stream is idle
// (cuStreamSynchronize). Use Wait to honour a context.
func (s *Stream) Synchronize() error { return s.work().synchronize() }

// Query reports whether all work on the stream has completed (cuStreamQuery).
func (s *Stream) Query() (bool, error) { return s.work().query() }

// Wait polls the stream until it is idle, an error occurs, or ctx ends.
func (s *Stream) Wait(ctx context.Context) error { return s.work().wait(ctx) }

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
	h   eventHandle
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
	e.r = newResource(st, e, fmt.Sprintf("event %#x", h), func() error {
		return check(cEventDestroy(ctx, h), "cuEventDestroy_v2", "")
	})
	return e, nil
}

// Record captures the work enqueued so far on s (nil: the legacy default stream) (cuEventRecord).
func (e *Event) Record(s *Stream) error {
	if err := e.r.use(); err != nil {
		return err
	}
	defer e.r.done()
	var h streamHandle
	if s != nil {
		if err := s.r.use(); err != nil {
			return err
		}
		defer s.r.done()
		h = s.h
	}
	return check(cEventRecord(e.r.st.ctx, e.h, h), "cuEventRecord", "")
}

func (e *Event) work() work[eventHandle] {
	return work[eventHandle]{e.r, e.h, cEventSync, "cuEventSynchronize", cEventQuery, "cuEventQuery"}
}

// Synchronize blocks until the recorded work has completed (cuEventSynchronize).
func (e *Event) Synchronize() error { return e.work().synchronize() }

// Query reports whether the recorded work has completed (cuEventQuery).
func (e *Event) Query() (bool, error) { return e.work().query() }

// Wait polls until the recorded work has completed, an error occurs, or ctx ends.
func (e *Event) Wait(ctx context.Context) error { return e.work().wait(ctx) }

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

// work is what a Stream and an Event share: a handle whose enqueued work the host can synchronize with
// (syncFn, named syncOp), query (queryFn, named queryOp) or wait for, each with the handle in use.
type work[H streamHandle | eventHandle] struct {
	r       *resource
	h       H
	syncFn  func(ctxHandle, H) Result
	syncOp  string
	queryFn func(ctxHandle, H) Result
	queryOp string
}

func (w work[H]) synchronize() error {
	if err := w.r.use(); err != nil {
		return err
	}
	defer w.r.done()
	return check(w.syncFn(w.r.st.ctx, w.h), w.syncOp, "")
}

func (w work[H]) query() (bool, error) {
	if err := w.r.use(); err != nil {
		return false, err
	}
	defer w.r.done()
	return queryDone(w.queryFn(w.r.st.ctx, w.h), w.queryOp)
}

func (w work[H]) wait(ctx context.Context) error {
	if err := w.r.use(); err != nil {
		return err
	}
	defer w.r.done()
	return pollWait(ctx, func() Result { return w.queryFn(w.r.st.ctx, w.h) }, w.queryOp)
}
