package sidechannel

import (
	"sync"
	"time"
)

// bucket is a token bucket: rate tokens a second, at most burst saved up. reserve takes a token now and says
// how long to wait before it may be used, so tokens may go negative by what the waiting callers took.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int, now time.Time) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

func (b *bucket) reserve(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(b.burst, b.tokens+el.Seconds()*b.rate)
		b.last = now
	}
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// logLimiter lets at most limit lines through per interval and counts the rest; the first line let through
// after a suppressed stretch carries the count.
type logLimiter struct {
	mu         sync.Mutex
	limit      int
	interval   time.Duration
	start      time.Time
	n          int
	suppressed uint64
}

// allow reports whether a line may be logged now and, if so, how many lines were suppressed before it.
func (l *logLimiter) allow(now time.Time) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= l.interval {
		l.start, l.n = now, 0
	}
	if l.n >= l.limit {
		l.suppressed++
		return false, 0
	}
	l.n++
	s := l.suppressed
	l.suppressed = 0
	return true, s
}

// flush returns and clears the count of lines suppressed since the last line let through.
func (l *logLimiter) flush() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.suppressed
	l.suppressed = 0
	return s
}
