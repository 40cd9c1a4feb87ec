package poll

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestUntilDone(t *testing.T) {
	// Past the spinning phase and into the backoff.
	n := 0
	err := Default.Until(context.Background(), func() bool { n++; return n == 100 })
	require.NoError(t, err)
	require.Equal(t, 100, n)
}

func TestUntilDoneBeforeContext(t *testing.T) {
	// Finished work is reported as finished even when the context has already ended.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n := 0
	require.NoError(t, Default.Until(ctx, func() bool { n++; return true }))
	require.Equal(t, 1, n)
	n = 0
	require.ErrorIs(t, Default.Until(ctx, func() bool { n++; return false }), context.Canceled)
	require.Equal(t, 1, n)
}

func TestUntilContextEnds(t *testing.T) {
	for _, b := range []Backoff{Default, {}, {Spins: 0, Min: time.Hour, Max: time.Hour}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		n := 0
		err := b.Until(ctx, func() bool { n++; return false })
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "%+v", b)
		require.Positive(t, n)
	}
}

func TestUntilDelayCapped(t *testing.T) {
	// With no spins and a tiny cap, many polls fit in a short while: the delay does not keep doubling.
	// Doubling without the cap would sleep for years; the context turns that into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := Backoff{Min: time.Microsecond, Max: 10 * time.Microsecond}
	n := 0
	require.NoError(t, b.Until(ctx, func() bool { n++; return n == 50 }))
	require.Equal(t, 50, n)
}

func TestNextDelay(t *testing.T) {
	us := time.Microsecond
	b := Backoff{Min: 5 * us, Max: time.Millisecond}
	require.Equal(t, 5*us, b.next(0, 0))
	require.Equal(t, 10*us, b.next(5*us, time.Hour), "without Slack the delay doubles whatever the time waited")
	require.Equal(t, time.Millisecond, b.next(800*us, 0), "capped at Max")
	b.Slack = 1.0 / 8
	require.Equal(t, 5*us, b.next(0, 0), "Min first")
	require.Equal(t, 5*us, b.next(5*us, 10*us), "never below Min")
	require.Equal(t, 25*us, b.next(40*us, 200*us), "at most an eighth of the time waited")
	require.Equal(t, 80*us, b.next(40*us, time.Second), "doubling still bounds it")
	require.Equal(t, time.Millisecond, b.next(time.Millisecond, time.Hour), "and Max")
	require.Equal(t, Default.Slack, 1.0/8)
}

// BenchmarkUntilOvershoot waits for work that ends a fixed time after the wait begins (as a transfer of that
// duration does) with Default and with Default without Slack (doubling alone), and reports how far past the
// work's end each wait returned (overshoot, a fraction of the work's time) and x_doubling: doubling's total
// wait over Default's.
func BenchmarkUntilOvershoot(b *testing.B) {
	doubling := Default
	doubling.Slack = 0
	for _, work := range []time.Duration{300 * time.Microsecond, 3 * time.Millisecond, 30 * time.Millisecond} {
		b.Run("work="+work.String(), func(b *testing.B) {
			wait := func(bo Backoff) time.Duration {
				start := time.Now()
				end := start.Add(work)
				if err := bo.Until(context.Background(), func() bool { return !time.Now().Before(end) }); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			var td, ts time.Duration
			for range b.N {
				td += wait(doubling)
				ts += wait(Default)
			}
			n := float64(b.N)
			b.ReportMetric((ts.Seconds()/n-work.Seconds())/work.Seconds(), "overshoot")
			b.ReportMetric((td.Seconds()/n-work.Seconds())/work.Seconds(), "overshoot_doubling")
			b.ReportMetric(td.Seconds()/ts.Seconds(), "x_doubling")
		})
	}
}

// BenchmarkSleep times sleeps of 50 µs through Go's timer and through Sleep (nanosleep): x_timer is the
// timer's time over Sleep's (the hosts' Go timers round sleeps under a millisecond up;
// docs/measured.md, "Per-request cost (issue 25)").
func BenchmarkSleep(b *testing.B) {
	const d = 50 * time.Microsecond
	var tt, ts time.Duration
	for range b.N {
		t0 := time.Now()
		tm := time.NewTimer(d)
		<-tm.C
		t1 := time.Now()
		Sleep(d)
		ts += time.Since(t1)
		tt += t1.Sub(t0)
	}
	b.ReportMetric(float64(tt.Microseconds())/float64(b.N), "timer_us")
	b.ReportMetric(float64(ts.Microseconds())/float64(b.N), "sleep_us")
	b.ReportMetric(tt.Seconds()/ts.Seconds(), "x_timer")
}

func TestSleep(t *testing.T) {
	Sleep(0)
	Sleep(-time.Second)
	start := time.Now()
	Sleep(200 * time.Microsecond)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Microsecond, "Sleep sleeps at least d")
}

// BenchmarkGosched times runtime.Gosched on a goroutine locked to its OS thread (as inside cuda.Device.Do)
// and on one that is not: x_unlocked is the locked yield's time over the unlocked one's. A locked goroutine's
// yield parks its thread and wakes it again through another, which is why Backoff's spins and the prefill
// role's busy loop do not yield at every poll.
func BenchmarkGosched(b *testing.B) {
	run := func(lock bool) time.Duration {
		d := make(chan time.Duration)
		go func() {
			if lock {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			t := time.Now()
			for range b.N {
				runtime.Gosched()
			}
			d <- time.Since(t)
		}()
		return <-d
	}
	unlocked := run(false)
	locked := run(true)
	n := float64(b.N)
	b.ReportMetric(float64(locked.Nanoseconds())/n, "locked_ns")
	b.ReportMetric(float64(unlocked.Nanoseconds())/n, "unlocked_ns")
	b.ReportMetric(locked.Seconds()/unlocked.Seconds(), "x_unlocked")
}

func TestUntilSpinFor(t *testing.T) {
	// Polls back to back for SpinFor, then sleeps between polls: with Min an hour, the poll after SpinFor
	// would sleep past the context's end, so done must have come true while spinning.
	b := Backoff{SpinFor: 20 * time.Millisecond, Min: time.Hour, Max: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	n := 0
	require.NoError(t, b.Until(ctx, func() bool { n++; return time.Since(start) > 5*time.Millisecond }))
	require.Greater(t, n, 100, "polls while spinning")
	// Past SpinFor it backs off: the context ends during the first sleep.
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.Until(ctx, func() bool { return false }), context.DeadlineExceeded)
}
