//go:build unix

package poll

import (
	"syscall"
	"time"
)

// Sleep sleeps for d with the kernel's own timer (nanosleep), blocking the calling OS thread. Go's timers
// (time.Sleep, time.Timer) can be far coarser: on the hosts this project measures on (the 2-core machine and
// the H200 host, both virtual machines) every sleep under a millisecond lasted far longer than asked
// (BenchmarkSleep, x_timer; docs/measured.md, "Per-request cost (issue 25)"), so a poll loop meant to
// run every 50 µs ran at the timer's resolution instead. Use it for sleeps below a
// millisecond only; it cannot be interrupted (the callers check their context after it).
func Sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		if err := syscall.Nanosleep(&ts, &rem); err != syscall.EINTR {
			return
		}
		ts = rem
	}
}
