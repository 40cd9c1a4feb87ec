package connector

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// prefillPeerMain is a Go prefill worker in its own process: it registers a tiny-model DRAM cache, serves the
// side channel, prefills GONIXL_PEER_REQUESTS requests of GONIXL_PEER_TOKENS tokens with the test pattern,
// prints "PARAMS <kv_transfer_params JSON>" per request and serves until its stdin closes.
func prefillPeerMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "prefill peer:", err); return 1 }
	p, l, c, err := peerSetup(testenv.PeerParam("PROFILE"), testenv.PeerParamInt("BLOCKS"))
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	cfg := PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: c, Compat: tinyCompat(p), EngineID: testenv.PeerParam("ENGINE")},
		HoldTimeout: time.Hour}
	if testenv.PeerParam("LISTENER") != "" { // the parent's socket (startPeer's ln), inherited as fd 3
		f := os.NewFile(3, "side channel")
		ln, err := net.FileListener(f) // a duplicate of f's descriptor
		_ = f.Close()
		if err != nil {
			return fail(err)
		}
		srv, err := sidechannel.NewServer(context.Background(), p, sidechannel.ServerConfig{Listener: ln})
		if err != nil {
			return fail(err)
		}
		defer srv.Close()
		cfg.SideChannel = srv
	}
	pre, err := NewPrefill(cfg)
	if err != nil {
		return fail(err)
	}
	defer pre.Close()
	for i := 0; i < max(1, testenv.PeerParamInt("REQUESTS")); i++ {
		kv, err := pre.Hold(context.Background(), fmt.Sprintf("peer-req-%d", i), testenv.PeerParamInt("TOKENS"),
			patternFill(c, testenv.PeerParamInt("SEED")+i))
		if err != nil {
			return fail(err)
		}
		raw, err := p.EncodeParams(kv)
		if err != nil {
			return fail(err)
		}
		fmt.Printf("PARAMS %s\n", raw)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// peerSetup is what a peer process starts with: its profile, NIXL (from $GONIXL_PEER_LIBDIR) and a tiny-model
// DRAM cache of blocks blocks.
func peerSetup(profile string, blocks int) (protocol.Profile, *nixl.Library, *DRAMCache, error) {
	p, err := protocol.ProfileByName(profile)
	if err != nil {
		return p, nil, nil, err
	}
	l, err := nixl.Load(nixl.LoadOptions{LibDir: testenv.PeerParam("LIBDIR")})
	if err != nil {
		return p, nil, nil, err
	}
	g, err := geomFor(p, blocks)
	if err != nil {
		return p, nil, nil, err
	}
	c, err := NewDRAMCache(g, false)
	return p, l, c, err
}

// peerProc is a running prefill peer process.
type peerProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	params []protocol.KVTransferParams
	stderr *testenv.Buffer // read while the child runs: locked
	once   sync.Once
	err    error
}

// startPeer runs the test binary as a prefill server and reads its kv_transfer_params. The server serves its
// side channel on ln when set (a socket of this process, inherited: a peer restarted on it keeps the port,
// which no other process can take meanwhile), else on a port it binds.
func startPeer(t *testing.T, p protocol.Profile, engine string, ln *net.TCPListener, blocks, tokens, requests, seed int) *peerProc {
	t.Helper()
	dir := testenv.RequireNIXLLibDir(t)
	params := map[string]string{"PROFILE": p.Name, "LIBDIR": dir, "ENGINE": engine,
		"BLOCKS": fmt.Sprint(blocks), "TOKENS": fmt.Sprint(tokens), "REQUESTS": fmt.Sprint(requests), "SEED": fmt.Sprint(seed)}
	var f *os.File
	if ln != nil {
		var err error
		f, err = ln.File() // a duplicate descriptor: closed here once the child has its own
		require.NoError(t, err)
		defer f.Close()
		params["LISTENER"] = "3"
	}
	cmd := testenv.PeerCommand(context.Background(), "prefill", params)
	if f != nil {
		cmd.ExtraFiles = []*os.File{f}
	}
	child := testenv.StartChild(t, cmd, true)
	pp := &peerProc{cmd: cmd, stderr: child.Stderr, stdin: child.Stdin}
	out := child.Stdout
	t.Cleanup(func() { pp.kill() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(30 * time.Second)
	for len(pp.params) < requests {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "prefill peer exited early: %s", pp.stderr.String())
			raw, found := strings.CutPrefix(line, "PARAMS ")
			require.True(t, found, line)
			kv, err := p.DecodeParams([]byte(raw))
			require.NoError(t, err)
			pp.params = append(pp.params, kv)
		case <-deadline:
			t.Fatalf("prefill peer did not start: %s", pp.stderr.String())
		}
	}
	go func() {
		for range lines { //nolint:revive // drain stdout until the process exits
		}
	}()
	return pp
}

// kill ends the process with SIGKILL (no clean-up of its NIXL agent or sockets) and reaps it.
func (pp *peerProc) kill() {
	pp.once.Do(func() {
		_ = pp.cmd.Process.Kill()
		pp.err = pp.cmd.Wait()
		_ = pp.stdin.Close()
	})
}

// The prefill process dies (SIGKILL) while the decode role is reading from it: every pull returns an error
// within its deadline (no hang), the handshake is dropped, and a prefill engine restarted under the same id and
// port is handshaken again and read from.
func TestPrefillKilledMidRead(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			l := testLib(t)
			const blocks, tokens = 8192, 8000 * tinyBlock // 8000 blocks of 16 KiB: 125 MiB per READ
			engine := fmt.Sprintf("killed-%s-%d", p.Name, time.Now().UnixNano())
			// The side channel's socket is this process's, kept open through the kill: the restarted engine
			// serves the same port, which nothing else can bind meanwhile.
			ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			peer := startPeer(t, p, engine, ln, blocks, tokens, 1, 7)
			kv := peer.params[0]
			require.Equal(t, ln.Addr().(*net.TCPAddr).Port, kv.RemotePort)

			dlog, dlogs := observed()
			m := &Metrics{}
			dc := newCache(t, tinyGeom(t, p, blocks))
			d, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: dc, Compat: tinyCompat(p), Logger: dlog, Metrics: m}, HandshakeTimeout: time.Second, HandshakeAttempts: 2})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, d.Close()) })
			local := localBlocks(len(kv.RemoteBlockIDs[0]), 0)

			ctx := testenv.Context(t, 10*time.Second)
			_, err = d.Pull(ctx, "first", kv, local)
			require.NoError(t, err)
			requirePattern(t, dc, local, kv.RemoteBlockIDs[0], 7)

			// Pull in a loop and kill the peer while a READ is in flight.
			const deadline = 3 * time.Second
			type outcome struct {
				err   error
				start time.Time
				took  time.Duration
			}
			results := make(chan outcome, 1024)
			started := make(chan struct{}, 1)
			go func() {
				defer close(results)
				for i := 0; ; i++ {
					pctx, cancel := context.WithTimeout(context.Background(), deadline)
					start := time.Now()
					if i == 2 {
						started <- struct{}{}
					}
					_, err := d.Pull(pctx, fmt.Sprintf("loop-%d", i), kv, local)
					cancel()
					results <- outcome{err, start, time.Since(start)}
					if err != nil || i > 5000 {
						return
					}
				}
			}()
			<-started
			time.Sleep(time.Millisecond)
			killedAt := time.Now()
			peer.kill()
			var last outcome
			for o := range results {
				last = o
				// Generous margin (a loaded machine): the point is that a pull ends at its deadline, not hangs.
				assert.Less(t, o.took, deadline+15*time.Second, "a pull must end at its deadline")
			}
			require.Error(t, last.err, "pulls from a dead prefill engine must fail")
			assert.Less(t, time.Since(killedAt), 2*deadline+15*time.Second, "the failure must come at the deadline")
			t.Logf("pull failed %v after SIGKILL (in flight at the kill: %v; it ran %v): %v",
				last.start.Add(last.took).Sub(killedAt), last.start.Before(killedAt), last.took, last.err)
			assert.EqualValues(t, 1, m.RequestErrors())
			d.hs.mu.Lock()
			assert.Empty(t, d.hs.remotes, "the dead engine's handshake is dropped")
			d.hs.mu.Unlock()
			assert.NotEmpty(t, dlogs.FilterMessage("pull failed").All())

			// The engine comes back (same id, same port): the next pull handshakes again and succeeds.
			peer2 := startPeer(t, p, engine, ln, blocks, 3*tinyBlock, 1, 50)
			kv2 := peer2.params[0]
			local2 := localBlocks(3, 0)
			res, err := d.Pull(testenv.Context(t, 10*time.Second), "after-restart", kv2, local2)
			require.NoError(t, err)
			assert.Positive(t, res.Handshake)
			requirePattern(t, dc, local2, kv2.RemoteBlockIDs[0], 50)
			assert.EqualValues(t, 2, m.Handshakes())
			peer2.kill()
		})
	}
}

// A prefill engine that is not there: the handshake fails within HandshakeTimeout × attempts with a clear error,
// and nothing is cached.
func TestPullNoPrefillEngine(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	l := testLib(t)
	dc := newCache(t, tinyGeom(t, p, 8))
	m := &Metrics{}
	d, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: dc, Compat: tinyCompat(p), Metrics: m}, HandshakeTimeout: 300 * time.Millisecond, HandshakeAttempts: 2})
	require.NoError(t, err)
	defer d.Close()
	kv := protocol.KVTransferParams{DoRemotePrefill: true, RemoteBlockIDs: protocol.BlockIDs{{1, 2}}, RemoteEngineID: "gone",
		RemoteRequestID: "r", RemoteHost: "127.0.0.1", RemotePort: testenv.RefusedPort(t), TPSize: 1}
	// The context is far longer than HandshakeTimeout × attempts (0.6 s): the handshake timeout ends the
	// pull, not the context.
	_, err = d.Pull(testenv.Context(t, 5*time.Minute), "r", kv, []int{1, 2})
	require.Error(t, err)
	assert.ErrorIs(t, err, sidechannel.ErrTimeout)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "handshake with gone")
	assert.False(t, errors.Is(err, ErrBadParams))
	assert.Zero(t, m.Handshakes())
	assert.EqualValues(t, 1, m.RequestErrors())
	d.hs.mu.Lock()
	assert.Empty(t, d.hs.remotes)
	d.hs.mu.Unlock()
}
