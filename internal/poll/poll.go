// Package poll waits for work that can only be polled (a CUDA stream, a NIXL transfer, a notification
// queue): it asks, spins a little while the answer is likely to come soon, then sleeps with a doubling
// delay, and honours a context throughout. gonixl's device packages share it so that every such wait
// behaves the same.
package poll

import (
	"context"
	"runtime"
	"time"
)

// Backoff says how to pace the polls: the first Spins polls only yield the processor
// (runtime.Gosched), then the delay between polls starts at Min and doubles up to Max.
type Backoff struct {
	Spins    int
	Min, Max time.Duration
}

// Default suits waits that usually end within microseconds (a DMA copy, a small RDMA READ): 64 spins,
// then 5 µs doubling to 1 ms, so a long wait costs at most one poll per millisecond.
var Default = Backoff{Spins: 64, Min: 5 * time.Microsecond, Max: time.Millisecond}

// Until calls done until it returns true or ctx ends. done runs at least once, even when ctx has already
// ended, so work that is finished is never reported as timed out. Until returns nil when done returned
// true, and ctx.Err() (unwrapped, for the caller to wrap) otherwise. A done that fails records its error
// itself and returns true.
func (b Backoff) Until(ctx context.Context, done func() bool) error {
	var delay time.Duration
	for i := 0; ; i++ {
		if done() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i < b.Spins {
			runtime.Gosched()
			continue
		}
		switch {
		case delay == 0:
			delay = max(b.Min, time.Nanosecond)
		case delay < b.Max:
			delay = min(2*delay, b.Max)
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
