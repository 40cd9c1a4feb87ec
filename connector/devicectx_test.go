package connector

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// fakeDevice is a DeviceContext that counts its Do calls and the ones still running, or refuses them.
type fakeDevice struct {
	mu      sync.Mutex
	calls   int
	running int
	fail    error
}

func (f *fakeDevice) Do(fn func() error) error {
	f.mu.Lock()
	if f.fail != nil {
		f.mu.Unlock()
		return f.fail
	}
	f.calls++
	f.running++
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.running--; f.mu.Unlock() }()
	return fn()
}

func (f *fakeDevice) counts() (calls, running int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.running
}

// PrefillConfig.DeviceContext: the agent is registered inside it, the notification loop holds it until
// Close (so READs of this worker's DRAM are served with the context current), and a read completes and
// frees its blocks as without one. A context that cannot be made current leaves the role working.
func TestPrefillDeviceContext(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	for _, fail := range []error{nil, errors.New("no context")} {
		name := "ok"
		if fail != nil {
			name = "refused"
		}
		t.Run(name, func(t *testing.T) {
			l := testLib(t)
			dev := &fakeDevice{fail: fail}
			pc := newCache(t, tinyGeom(t, p, 16))
			pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: pc, Compat: tinyCompat(p), DeviceContext: dev}})
			if fail != nil {
				require.ErrorIs(t, err, fail, "registration runs inside the device context")
				dev.mu.Lock()
				dev.fail = nil
				dev.mu.Unlock()
				pre, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: pc, Compat: tinyCompat(p), DeviceContext: dev}})
			}
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					require.NoError(t, pre.Close())
				}
			})
			require.Eventually(t, func() bool { c, r := dev.counts(); return c == 2 && r == 1 }, 10*time.Second, time.Millisecond,
				"one Do for the registration, one held by the loop")
			d := tinyDecode(t, p, l, newCache(t, tinyGeom(t, p, 16)), nil)
			ctx := testenv.Context(t, 10*time.Second)
			kv, err := pre.Hold(ctx, "dc-1", 2*tinyBlock, patternFill(pc, 3))
			require.NoError(t, err)
			_, err = d.Pull(ctx, "dc-1", kv, []int{4, 5})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return pre.Held() == 0 }, 10*time.Second, time.Millisecond,
				"the loop in the device context frees the blocks on the decode's notification")
			require.NoError(t, pre.Close())
			closed = true
			_, running := dev.counts()
			assert.Zero(t, running, "Close ends the loop's hold on the context")
		})
	}
}

// A loop whose context cannot be made current still runs (without it).
func TestWithDeviceRefusedLoopRuns(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	l := testLib(t)
	dev := &refuseSecond{}
	pc := newCache(t, tinyGeom(t, p, 16))
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: pc, Compat: tinyCompat(p), DeviceContext: dev}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pre.Close()) })
	d := tinyDecode(t, p, l, newCache(t, tinyGeom(t, p, 16)), nil)
	ctx := testenv.Context(t, 10*time.Second)
	kv, err := pre.Hold(ctx, "dc-2", tinyBlock, patternFill(pc, 1))
	require.NoError(t, err)
	_, err = d.Pull(ctx, "dc-2", kv, []int{2})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pre.Held() == 0 }, 10*time.Second, time.Millisecond)
}

// refuseSecond runs the first Do (registration) and refuses the rest (the loop's).
type refuseSecond struct {
	mu sync.Mutex
	n  int
}

func (r *refuseSecond) Do(fn func() error) error {
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	if n > 1 {
		return errors.New("context lost")
	}
	return fn()
}
