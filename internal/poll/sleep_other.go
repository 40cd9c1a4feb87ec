//go:build !unix

package poll

import "time"

// Sleep sleeps for d (time.Sleep where there is no nanosleep).
func Sleep(d time.Duration) { time.Sleep(d) }
