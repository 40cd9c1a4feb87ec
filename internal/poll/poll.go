// Package poll waits for work that can only be polled (a CUDA stream, a NIXL transfer, a notification
// queue): it asks, spins a little while the answer is likely to come soon, then sleeps with a doubling
// delay, and honours a context throughout. gonixl's device packages share it so that every such wait
// behaves the same.
package poll

import (
	"context"
	"time"
)

// Backoff says how to pace the polls: the first Spins polls follow each other at once, then the delay
// between polls starts at Min and doubles up to Max. The spins do not yield the processor
// (runtime.Gosched): on a goroutine locked to its OS thread (a CUDA context's, cuda.Device.Do) a yield hands
// the thread off to the scheduler and back, which costs a few hundred times an unlocked one
// (BenchmarkGosched, x_unlocked), so yielding spins there polled at that interval instead of back to back;
// Spins polls are microseconds, far less than the scheduler's own time slice. Slack, when
// positive, also caps each delay at Slack × the time waited so far (never below Min): doubling alone can
// sleep past the work's end by as long as the wait already took, doubling a transfer's time in the worst
// case, while a delay of at most Slack × the elapsed time overshoots by at most that fraction
// (BenchmarkUntilOvershoot).
type Backoff struct {
	Spins int
	// SpinFor, when positive, keeps polling back to back until that long has passed since the first poll
	// (besides the Spins polls): for work expected within about that time on a host whose idle cores wake
	// slowly, where each sleep between polls can cost more than the poll saves.
	SpinFor  time.Duration
	Min, Max time.Duration
	Slack    float64
}

// Default suits waits that usually end within microseconds to milliseconds (a DMA copy, a RDMA READ): 64
// spins, then 5 µs doubling to 1 ms but at most an eighth of the time waited, so a wait ends at most about
// 12% after its work (and 1 ms for long ones), and a long wait costs at most one poll per millisecond.
var Default = Backoff{Spins: 64, Min: 5 * time.Microsecond, Max: time.Millisecond, Slack: 1.0 / 8}

// Until calls done until it returns true or ctx ends. done runs at least once, even when ctx has already
// ended, so work that is finished is never reported as timed out. Until returns nil when done returned
// true, and ctx.Err() (unwrapped, for the caller to wrap) otherwise. A done that fails records its error
// itself and returns true.
func (b Backoff) Until(ctx context.Context, done func() bool) error {
	var delay time.Duration
	var start, first time.Time
	if b.SpinFor > 0 {
		first = time.Now()
	}
	for i := 0; ; i++ {
		if done() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i < b.Spins || (b.SpinFor > 0 && time.Since(first) < b.SpinFor) {
			continue
		}
		var waited time.Duration
		if start.IsZero() {
			start = time.Now()
		} else {
			waited = time.Since(start)
		}
		delay = b.next(delay, waited)
		if delay < time.Millisecond { // Go's timers would round it up to about a millisecond (Sleep)
			Sleep(delay)
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// next is the delay after delay (0: none yet) once waited has passed since the first sleep.
func (b Backoff) next(delay, waited time.Duration) time.Duration {
	switch {
	case delay == 0:
		delay = max(b.Min, time.Nanosecond)
	case delay < b.Max:
		delay = min(2*delay, b.Max)
	}
	if b.Slack > 0 {
		delay = min(delay, max(time.Duration(b.Slack*float64(waited)), b.Min, time.Nanosecond))
	}
	return delay
}
