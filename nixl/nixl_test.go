package nixl_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/benchpeer"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

var leaks atomic.Int64

func TestMain(m *testing.M) {
	// Peers: BenchmarkDRAMToDRAM's DRAM peer, TestTwoProcesses' other process, TestLoadFailureListsWhatWasTried's
	// failing load.
	testenv.ServePeer(testenv.Peers{benchpeer.Role: benchpeer.Main(nil), "peer": peerMain, "loadfail": loadFailMain})
	testenv.ExportNIXLLibDir()
	nixl.OnLeak(func(l nixl.Leak) {
		if l.What != "deliberately leaked" {
			fmt.Fprintf(os.Stderr, "LEAK: %+v\n", l)
		}
		leaks.Add(1)
	})
	goleak.VerifyTestMain(m)
}

func hostMem(t testing.TB, size int64) *nixl.HostMem {
	t.Helper()
	m, err := nixl.AllocHost(size, nixl.HostOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	return m
}

// telemetryAgent is a UCX agent that captures telemetry, named name-<pid>, closed when the test ends.
func telemetryAgent(t testing.TB, l *nixl.Library, name string) *nixl.Agent {
	t.Helper()
	a, err := l.NewAgent(fmt.Sprintf("%s-%d", name, os.Getpid()), nixl.AgentConfig{CaptureTelemetry: true, Backends: []nixl.BackendSpec{{Plugin: "UCX"}}})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	return a
}

// connectDRAM registers ma with a and mb with b until the test ends, and loads b's metadata into a.
func connectDRAM(t testing.TB, a, b *nixl.Agent, ma, mb *nixl.HostMem) {
	t.Helper()
	for _, side := range []struct {
		agent *nixl.Agent
		mem   *nixl.HostMem
	}{{a, ma}, {b, mb}} {
		r, err := side.agent.RegisterMem(nixl.DRAM, []nixl.Desc{side.mem.Desc()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = r.Close() })
	}
	md, err := b.LocalMetadata()
	require.NoError(t, err)
	_, err = a.LoadRemoteMetadata(md)
	require.NoError(t, err)
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
}

// pair is an initiator agent and a target agent, each with one registered DRAM buffer; the initiator has
// the target's metadata loaded.
type pair struct {
	init, target       *nixl.Agent
	initMem, targetMem *nixl.HostMem
	initReg, targetReg *nixl.Registration
}

func newPair(t testing.TB, size int64) *pair {
	t.Helper()
	p := &pair{init: nixltest.Agent(t, "init"), target: nixltest.Agent(t, "target")}
	p.initMem, p.targetMem = hostMem(t, size), hostMem(t, size)
	var err error
	p.initReg, err = p.init.RegisterMem(nixl.DRAM, []nixl.Desc{p.initMem.Desc()})
	require.NoError(t, err)
	p.targetReg, err = p.target.RegisterMem(nixl.DRAM, []nixl.Desc{p.targetMem.Desc()})
	require.NoError(t, err)
	md, err := p.target.LocalMetadata()
	require.NoError(t, err)
	name, err := p.init.LoadRemoteMetadata(md)
	require.NoError(t, err)
	require.Equal(t, p.target.Name(), name)
	return p
}

// postWait posts x and waits until it is done (bounded by ctx).
func postWait(t testing.TB, ctx context.Context, x *nixl.Xfer) {
	t.Helper()
	_, err := x.Post()
	require.NoError(t, err)
	require.NoError(t, x.Wait(ctx))
}

func TestPluginsAndParams(t *testing.T) {
	a := nixltest.Agent(t, "plugins")
	plugins, err := a.AvailablePlugins()
	require.NoError(t, err)
	require.Contains(t, plugins, "UCX")
	require.Contains(t, plugins, "POSIX")
	mems, params, err := a.PluginParams("UCX")
	require.NoError(t, err)
	require.Contains(t, mems, nixl.DRAM)
	require.Contains(t, mems, nixl.VRAM)
	require.Contains(t, params, "num_workers")
	be := a.Backend("UCX")
	require.NotNil(t, be)
	bmems, bparams, err := be.Params()
	require.NoError(t, err)
	require.Contains(t, bmems, nixl.DRAM)
	require.NotNil(t, bparams) // NIXL 1.5 reports no effective params for UCX (Python's get_backend_params agrees)
	require.Equal(t, []*nixl.Backend{be}, a.Backends())

	_, _, err = a.PluginParams("NO_SUCH_PLUGIN")
	require.Error(t, err)
}

func TestWriteAndReadWithNotifications(t *testing.T) {
	const size = 1 << 20
	p := newPair(t, size)
	src, dst := p.initMem.Bytes(), p.targetMem.Bytes()
	fill(src, 7)

	// WRITE initiator → target, notification with NUL bytes.
	notif := []byte("req-1\x00:tp=2\x00")
	x, err := p.init.CreateXfer(nixl.Write, nixl.DRAM, []nixl.Desc{p.initMem.Desc()}, nixl.DRAM, []nixl.Desc{p.targetMem.Desc()}, p.target.Name(), nixl.WithNotification(notif))
	require.NoError(t, err)
	postWait(t, testenv.Context(t, 30*time.Second), x)
	n, err := p.target.WaitNotification(testenv.Context(t, 30*time.Second), func(n nixl.Notification) bool { return true }, nil)
	require.NoError(t, err)
	require.Equal(t, p.init.Name(), n.Agent)
	require.Equal(t, notif, n.Msg)
	require.True(t, bytes.Equal(src, dst), "WRITE moved the wrong bytes")
	require.NoError(t, x.Close())
	require.NoError(t, x.Close(), "Close is idempotent")

	// READ target → initiator: change the target's bytes, read them back.
	fill(dst, 99)
	local, err := p.init.Prep("", nixl.DRAM, []nixl.Desc{p.initMem.Desc()})
	require.NoError(t, err)
	defer local.Close()
	remote, err := p.init.Prep(p.target.Name(), nixl.DRAM, []nixl.Desc{p.targetMem.Desc()})
	require.NoError(t, err)
	defer remote.Close()
	r, err := p.init.MakeXfer(nixl.Read, local, []int{0}, remote, []int{0}, nixl.WithNotification([]byte("read-done")))
	require.NoError(t, err)
	defer r.Close()
	postWait(t, testenv.Context(t, 30*time.Second), r)
	require.True(t, bytes.Equal(src, dst), "READ moved the wrong bytes")
	n, err = p.target.WaitNotification(testenv.Context(t, 30*time.Second), func(n nixl.Notification) bool { return string(n.Msg) == "read-done" }, nil)
	require.NoError(t, err)
	require.Equal(t, p.init.Name(), n.Agent)

	// Repost the completed request with a new notification and new data.
	fill(dst, 5)
	_, err = r.Post(nixl.WithNotification([]byte("again")))
	require.NoError(t, err)
	require.NoError(t, r.Wait(testenv.Context(t, 30*time.Second)))
	require.True(t, bytes.Equal(src, dst), "reposted READ moved the wrong bytes")
	_, err = p.target.WaitNotification(testenv.Context(t, 30*time.Second), func(n nixl.Notification) bool { return string(n.Msg) == "again" }, nil)
	require.NoError(t, err)
	// Once more, waited for by polling back to back.
	fill(dst, 6)
	_, err = r.Post()
	require.NoError(t, err)
	require.NoError(t, r.WaitBusy(testenv.Context(t, 30*time.Second), 10*time.Millisecond))
	require.True(t, bytes.Equal(src, dst), "a READ waited for with WaitBusy moved the wrong bytes")

	be, err := r.Backend()
	require.NoError(t, err)
	require.Equal(t, "UCX", be.Plugin())
}

func TestStandaloneNotificationAndEmpty(t *testing.T) {
	p := newPair(t, 4096)
	require.NoError(t, p.init.SendNotification(p.target.Name(), []byte{0, 1, 2, 0}))
	require.NoError(t, p.init.SendNotification(p.target.Name(), nil))
	var got [][]byte
	ctx := testenv.Context(t, 30*time.Second)
	for len(got) < 2 {
		ns, err := p.target.GetNotifications()
		require.NoError(t, err)
		for _, n := range ns {
			got = append(got, n.Msg)
		}
		require.NoError(t, ctx.Err())
		time.Sleep(time.Millisecond)
	}
	require.ElementsMatch(t, [][]byte{{0, 1, 2, 0}, {}}, [][]byte{got[0], append([]byte{}, got[1]...)})
}

func TestManyDescriptorsOneRequest(t *testing.T) {
	const n = 100_000
	const dlen = 64
	p := newPair(t, n*dlen)
	src, dst := p.initMem.Bytes(), p.targetMem.Bytes()
	fill(dst, 3)
	local := make([]nixl.Desc, n)
	remote := make([]nixl.Desc, n)
	for i := 0; i < n; i++ {
		// Reverse order on the remote side so a wrong pairing shows up in the bytes.
		local[i] = nixl.Desc{Addr: p.initMem.Addr() + uint64(i*dlen), Len: dlen}
		remote[i] = nixl.Desc{Addr: p.targetMem.Addr() + uint64((n-1-i)*dlen), Len: dlen}
	}
	x, err := p.init.CreateXfer(nixl.Read, nixl.DRAM, local, nixl.DRAM, remote, p.target.Name())
	require.NoError(t, err)
	defer x.Close()
	require.Equal(t, n, x.Len())
	postWait(t, testenv.Context(t, 30*time.Second), x)
	for i := 0; i < n; i++ {
		if !bytes.Equal(src[i*dlen:(i+1)*dlen], dst[(n-1-i)*dlen:(n-i)*dlen]) {
			t.Fatalf("descriptor %d moved the wrong bytes", i)
		}
	}
}

func TestErrorPaths(t *testing.T) {
	p := newPair(t, 1<<16)
	d := p.initMem.Desc()

	t.Run("unknown remote agent", func(t *testing.T) {
		_, err := p.init.Prep("no-such-agent", nixl.DRAM, []nixl.Desc{d})
		require.ErrorIs(t, err, nixl.ErrNotFound)
		_, err = p.init.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{d}, nixl.DRAM, []nixl.Desc{d}, "no-such-agent")
		require.Error(t, err)
		require.ErrorIs(t, p.init.CheckRemoteMetadata("no-such-agent", nixl.DRAM, nil), nixl.ErrNotFound)
		require.Error(t, p.init.SendNotification("no-such-agent", []byte("x")))
	})
	t.Run("out-of-range descriptor index", func(t *testing.T) {
		local, err := p.init.Prep("", nixl.DRAM, []nixl.Desc{d})
		require.NoError(t, err)
		defer local.Close()
		remote, err := p.init.Prep(p.target.Name(), nixl.DRAM, []nixl.Desc{p.targetMem.Desc()})
		require.NoError(t, err)
		defer remote.Close()
		_, err = p.init.MakeXfer(nixl.Read, local, []int{1}, remote, []int{0})
		require.ErrorIs(t, err, nixl.ErrIndexOutOfRange)
		_, err = p.init.MakeXfer(nixl.Read, local, []int{0}, remote, []int{-1})
		require.ErrorIs(t, err, nixl.ErrIndexOutOfRange)
		_, err = p.init.MakeXfer(nixl.Read, local, []int{0, 0}, remote, []int{0})
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
	})
	t.Run("descriptor outside registered memory", func(t *testing.T) {
		outside := nixl.Desc{Addr: p.targetMem.Addr() + uint64(p.targetMem.Len()), Len: 4096}
		_, err := p.init.Prep(p.target.Name(), nixl.DRAM, []nixl.Desc{outside})
		require.ErrorIs(t, err, nixl.ErrNotFound)
	})
	t.Run("deregistered memory", func(t *testing.T) {
		m := hostMem(t, 8192)
		reg, err := p.init.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()})
		require.NoError(t, err)
		pl, err := p.init.Prep("", nixl.DRAM, []nixl.Desc{m.Desc()})
		require.NoError(t, err)
		require.NoError(t, pl.Close())
		require.NoError(t, reg.Close())
		require.NoError(t, reg.Close(), "Close is idempotent")
		_, err = p.init.Prep("", nixl.DRAM, []nixl.Desc{m.Desc()})
		require.ErrorIs(t, err, nixl.ErrNotFound)
	})
	t.Run("bad backend params", func(t *testing.T) {
		a, err := nixltest.Lib(t).NewAgent(fmt.Sprintf("badbe-%d", os.Getpid()), nixl.AgentConfig{})
		require.NoError(t, err)
		defer a.Close()
		_, err = a.CreateBackend("NO_SUCH_PLUGIN", nil)
		require.Error(t, err)
		_, err = a.CreateBackend("UCX", map[string]string{"num_workers": "not-a-number"})
		require.Error(t, err)
		_, err = a.CreateBackend("UCX", nil)
		require.NoError(t, err)
		_, err = a.CreateBackend("UCX", nil)
		require.ErrorIs(t, err, nixl.ErrBackend, "a second UCX backend on one agent")
	})
	t.Run("bad input checked before NIXL", func(t *testing.T) {
		_, err := p.init.RegisterMem(nixl.DRAM, nil)
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
		_, err = p.init.RegisterMem(nixl.DRAM, []nixl.Desc{{Addr: 1, Len: 0}})
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
		_, err = p.init.RegisterMem(nixl.MemType(42), []nixl.Desc{d})
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
		_, err = p.init.LoadRemoteMetadata(nil)
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
		_, err = p.init.LoadRemoteMetadata([]byte("garbage that is not NIXL metadata"))
		require.Error(t, err)
		_, err = p.init.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{{Addr: d.Addr, Len: 8}}, nixl.DRAM, []nixl.Desc{{Addr: p.targetMem.Addr(), Len: 16}}, p.target.Name())
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
		_, err = nixltest.Lib(t).NewAgent("", nixl.AgentConfig{})
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
		_, err = nixl.AllocHost(0, nixl.HostOptions{})
		require.ErrorIs(t, err, nixl.ErrInvalidParam)
	})
	t.Run("invalidated remote", func(t *testing.T) {
		other := nixltest.Agent(t, "inval")
		md, err := other.LocalMetadata()
		require.NoError(t, err)
		name, err := p.init.LoadRemoteMetadata(md)
		require.NoError(t, err)
		require.NoError(t, p.init.CheckRemoteMetadata(name, nixl.DRAM, nil))
		require.NoError(t, p.init.InvalidateRemoteMetadata(name))
		require.ErrorIs(t, p.init.CheckRemoteMetadata(name, nixl.DRAM, nil), nixl.ErrNotFound)
	})
}

func TestAgentCloseReleasesChildren(t *testing.T) {
	l := nixltest.Lib(t)
	a, err := l.NewAgent(fmt.Sprintf("closer-%d", os.Getpid()), nixl.AgentConfig{Backends: []nixl.BackendSpec{{Plugin: "UCX"}}})
	require.NoError(t, err)
	m := hostMem(t, 1<<16)
	reg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()})
	require.NoError(t, err)
	pl, err := a.Prep("", nixl.DRAM, []nixl.Desc{m.Desc()})
	require.NoError(t, err)
	// Loopback: the agent reads its own memory (no metadata to load).
	x, err := a.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{{Addr: m.Addr(), Len: 4096}}, nixl.DRAM, []nixl.Desc{{Addr: m.Addr() + 8192, Len: 4096}}, a.Name())
	require.NoError(t, err)
	postWait(t, testenv.Context(t, 30*time.Second), x)

	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")
	require.NoError(t, x.Close(), "a child closed by its agent closes as a no-op")
	require.NoError(t, pl.Close())
	require.NoError(t, reg.Close())
	_, err = x.Status()
	require.ErrorIs(t, err, nixl.ErrClosed)
	_, err = a.LocalMetadata()
	require.ErrorIs(t, err, nixl.ErrClosed)
}

func TestLeakedHandleIsReportedAndReleased(t *testing.T) {
	a := nixltest.Agent(t, "leaky")
	m := hostMem(t, 1<<16)
	before := leaks.Load()
	func() {
		_, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()}) // dropped without Close
		require.NoError(t, err)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for leaks.Load() == before && time.Now().Before(deadline) {
		runtimeGC()
		time.Sleep(10 * time.Millisecond)
	}
	require.Greater(t, leaks.Load(), before, "the dropped registration was not reported")
	// The cleanup deregistered it: registering the same range again works.
	reg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()})
	require.NoError(t, err)
	require.NoError(t, reg.Close())
}

func TestTelemetryAndCost(t *testing.T) {
	l := nixltest.Lib(t)
	a, b := telemetryAgent(t, l, "tel-a"), telemetryAgent(t, l, "tel-b")
	ma, mb := hostMem(t, 1<<20), hostMem(t, 1<<20)
	connectDRAM(t, a, b, ma, mb)
	x, err := a.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{ma.Desc()}, nixl.DRAM, []nixl.Desc{mb.Desc()}, b.Name())
	require.NoError(t, err)
	defer x.Close()
	if d, _, err := x.EstimateCost(); err == nil {
		require.GreaterOrEqual(t, d, time.Duration(0))
	} else {
		require.True(t, errors.Is(err, nixl.ErrBackend) || errors.Is(err, nixl.ErrInvalidParam), "unexpected error %v", err)
	}
	postWait(t, testenv.Context(t, 30*time.Second), x)
	tel, err := x.Telemetry()
	require.NoError(t, err)
	require.EqualValues(t, 1<<20, tel.Bytes)
	require.EqualValues(t, 1, tel.Descs)

	// Without telemetry the sentinel says so.
	p := newPair(t, 4096)
	y, err := p.init.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{p.initMem.Desc()}, nixl.DRAM, []nixl.Desc{p.targetMem.Desc()}, p.target.Name())
	require.NoError(t, err)
	defer y.Close()
	postWait(t, testenv.Context(t, 30*time.Second), y)
	_, err = y.Telemetry()
	require.ErrorIs(t, err, nixl.ErrNoTelemetry)
}

func TestWaitHonoursContext(t *testing.T) {
	p := newPair(t, 1<<20)
	x, err := p.init.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{p.initMem.Desc()}, nixl.DRAM, []nixl.Desc{p.targetMem.Desc()}, p.target.Name())
	require.NoError(t, err)
	defer x.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = x.Post()
	require.NoError(t, err)
	// Either it finished before the first poll, or Wait reports the cancelled context.
	if err := x.Wait(ctx); err != nil {
		require.ErrorIs(t, err, context.Canceled)
		var e *nixl.Error
		require.ErrorAs(t, err, &e, "a wait ended by its context is the package's error too")
		require.Equal(t, "wait for transfer", e.Op)
	}
	require.NoError(t, x.Wait(testenv.Context(t, 30*time.Second)))
}

func TestConcurrentTransfers(t *testing.T) {
	const workers, size = 8, 1 << 16
	p := newPair(t, workers*size)
	fill(p.targetMem.Bytes(), 11)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			off := uint64(w * size)
			for i := 0; i < 20; i++ {
				x, err := p.init.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{{Addr: p.initMem.Addr() + off, Len: size}}, nixl.DRAM, []nixl.Desc{{Addr: p.targetMem.Addr() + off, Len: size}}, p.target.Name())
				if err != nil {
					errs <- err
					return
				}
				if _, err := x.Post(); err != nil {
					errs <- err
				} else if err := x.Wait(context.Background()); err != nil {
					errs <- err
				}
				if err := x.Close(); err != nil {
					errs <- err
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, p.targetMem.Bytes(), p.initMem.Bytes())
}

func TestTwoProcesses(t *testing.T) {
	dir := testenv.RequireNIXLLibDir(t)
	a := nixltest.Agent(t, "parent")
	m := hostMem(t, 1<<20)
	reg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()})
	require.NoError(t, err)
	defer reg.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testenv.PeerCommand(ctx, "peer", nil)
	cmd.Env = append(cmd.Env, "NIXL_LIB_DIR="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Wait()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	readLine := func() string {
		require.True(t, lines.Scan(), "peer process ended early")
		return lines.Text()
	}
	// The peer sends its metadata and the address of its buffer, filled with fill(…, 42).
	var addr uint64
	var peerMD string
	_, err = fmt.Sscanf(readLine(), "MD %s %d", &peerMD, &addr)
	require.NoError(t, err)
	md, err := hex.DecodeString(peerMD)
	require.NoError(t, err)
	peer, err := a.LoadRemoteMetadata(md)
	require.NoError(t, err)
	// READ the peer's buffer and check it.
	x, err := a.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{m.Desc()}, nixl.DRAM, []nixl.Desc{{Addr: addr, Len: 1 << 20}}, peer, nixl.WithNotification([]byte("read\x00done")))
	require.NoError(t, err)
	defer x.Close()
	postWait(t, ctx, x)
	want := make([]byte, 1<<20)
	fill(want, 42)
	require.True(t, bytes.Equal(want, m.Bytes()), "READ from the other process moved the wrong bytes")
	// WRITE our pattern into the peer, which checks it after the notification.
	fill(m.Bytes(), 17)
	w, err := a.CreateXfer(nixl.Write, nixl.DRAM, []nixl.Desc{m.Desc()}, nixl.DRAM, []nixl.Desc{{Addr: addr, Len: 1 << 20}}, peer, nixl.WithNotification([]byte("write-done")))
	require.NoError(t, err)
	defer w.Close()
	postWait(t, ctx, w)
	require.Equal(t, "OK read\x00done", strings.ReplaceAll(readLine(), `\0`, "\x00"))
	require.Equal(t, "OK write-done verified", readLine())
	stdin.Close()
}

// peerMain is the other process of TestTwoProcesses.
func peerMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "peer:", err); return 1 }
	l, err := nixl.Load(nixl.LoadOptions{})
	if err != nil {
		return fail(err)
	}
	// The peer is the target of the parent's transfers and receives their notifications, so it drives its own
	// progress (WaitNotification polls): with NIXL 1.5.1's progress thread a notification arriving from
	// another process is occasionally never delivered (see AgentConfig.NoProgressThread).
	a, err := l.NewAgent(fmt.Sprintf("peer-%d", os.Getpid()), nixl.AgentConfig{NoProgressThread: true, Backends: []nixl.BackendSpec{{Plugin: "UCX"}}})
	if err != nil {
		return fail(err)
	}
	defer a.Close()
	m, err := nixl.AllocHost(1<<20, nixl.HostOptions{})
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	fill(m.Bytes(), 42)
	reg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()})
	if err != nil {
		return fail(err)
	}
	defer reg.Close()
	md, err := a.LocalMetadata()
	if err != nil {
		return fail(err)
	}
	fmt.Printf("MD %s %d\n", hex.EncodeToString(md), m.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := a.WaitNotification(ctx, func(n nixl.Notification) bool { return true }, nil)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("OK %s\n", strings.ReplaceAll(string(n.Msg), "\x00", `\0`))
	n, err = a.WaitNotification(ctx, func(n nixl.Notification) bool { return true }, nil)
	if err != nil {
		return fail(err)
	}
	want := make([]byte, 1<<20)
	fill(want, 17)
	if !bytes.Equal(want, m.Bytes()) {
		return fail(errors.New("WRITE from the other process moved the wrong bytes"))
	}
	fmt.Printf("OK %s verified\n", n.Msg)
	// Wait for the parent to close stdin before tearing down, so its transfers are released first.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

func TestLoadFailureListsWhatWasTried(t *testing.T) {
	cmd := testenv.PeerCommand(testenv.Context(t, time.Minute), "loadfail", nil)
	cmd.Env = append(cmd.Env, "NIXL_LIB_DIR=/nonexistent/nixl/lib", "LD_LIBRARY_PATH=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	s := string(out)
	require.Contains(t, s, "ErrNotLoaded=true")
	require.Contains(t, s, "/explicit/dir/libnixl_capi.so (LoadOptions.LibDir): no such file")
	require.Contains(t, s, "/nonexistent/nixl/lib/libnixl_capi.so ($NIXL_LIB_DIR)")
	require.Contains(t, s, "dynamic loader search path")
	require.Contains(t, s, "/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu")
	require.Contains(t, s, "make nixl")
}

func loadFailMain() int {
	_, err := nixl.Load(nixl.LoadOptions{LibDir: "/explicit/dir"})
	if err == nil {
		fmt.Println("unexpectedly loaded")
		return 1
	}
	fmt.Println(err)
	fmt.Printf("ErrNotLoaded=%v\n", errors.Is(err, nixl.ErrNotLoaded))
	return 0
}

func TestLibraryInfo(t *testing.T) {
	l := nixltest.Lib(t)
	require.FileExists(t, l.Path())
	require.DirExists(t, l.PluginDir())
	require.Equal(t, l.PluginDir(), os.Getenv("NIXL_PLUGIN_DIR"))
	if strings.Contains(l.Path(), "/.nixl/") {
		// Unpacked by `make nixl` (.nixl/cuXX-<version>/lib, usually through the .nixl/current symlink).
		require.Regexp(t, `^\d+\.\d+\.\d+`, l.Version())
	}
	again, err := nixl.Load(nixl.LoadOptions{})
	require.NoError(t, err)
	require.Same(t, l, again, "one NIXL per process")
	_, err = nixl.Load(nixl.LoadOptions{LibDir: t.TempDir()})
	require.ErrorIs(t, err, nixl.ErrInvalidState, "a second, different NIXL")
}
