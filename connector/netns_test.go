package connector

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/netns"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// Prefill and decode on different "hosts": each role in its own process inside its own network namespace,
// the two namespaces joined by a veth pair, the data plane pinned to the veth (UCX: UCX_TLS=tcp and
// UCX_NET_DEVICES, so that UCX cannot use shared memory between the processes; LIBFABRIC: FI_PROVIDER=tcp and
// FI_TCP_IFACE). The namespaces are made by the test (internal/netns: `ip netns add`, unique names per run) and
// always deleted after; they hold only lo and their veth end, with no route out, so no traffic leaves them.
//
// Addresses: 198.18.0.1/30 (prefill) and 198.18.0.2/30 (decode), from 198.18.0.0/15, the range RFC 2544 sets
// aside for benchmarking network devices (never routed on the Internet). They exist only inside the test's
// namespaces, whose only routes are the /30 on the veth: even a bug could not send a packet anywhere else.

const (
	nsReplyMark  = "@@ "
	nsPeerBlocks = 4096 // blocks of each peer's tiny-model cache (16 KiB each over both regions)
)

// newNetPair creates two namespaces joined by a veth pair (internal/netns) and deletes them when the test ends.
func newNetPair(t testing.TB) *netns.Pair {
	t.Helper()
	if err := netns.Check(); err != nil {
		testenv.Missing(t, "network namespaces", err.Error())
	}
	if _, err := exec.LookPath("tc"); err != nil {
		testenv.Missing(t, "tc (iproute2)", "apt-get install -y iproute2")
	}
	n, err := netns.New("gonixl")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, n.Close()) })
	return n
}

// nsPeer is a role process in a namespace, driven by line commands.
type nsPeer struct {
	child *testenv.Child
	lines chan string
}

// startNSPeer runs the test binary as role ("prefill" or "decode") inside namespace ns.
func startNSPeer(t testing.TB, role, ns, ifc, addr, backend string, p protocol.Profile, hold time.Duration) *nsPeer {
	t.Helper()
	dir := testenv.RequireNIXLLibDir(t)
	cmd := testenv.PeerCommand(context.Background(), "netns-"+role, map[string]string{"LIBDIR": dir, "PROFILE": p.Name,
		"BACKEND": backend, "HOST": addr, "IFACE": ifc, "HOLD_MS": fmt.Sprint(hold.Milliseconds())}, "ip", "netns", "exec", ns)
	cmd.Env = append(cmd.Env, netns.DataPlaneEnv(ifc)...)
	child := testenv.StartChild(t, cmd, true)
	pp := &nsPeer{child: child, lines: make(chan string, 64)}
	go func() {
		defer close(pp.lines)
		sc := bufio.NewScanner(child.Stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), nsReplyMark); ok {
				pp.lines <- s
			}
		}
	}()
	t.Cleanup(func() { _ = child.Stdin.Close() })
	_ = pp.await(t, 30*time.Second, "READY")
	return pp
}

// await returns the next reply, which must start with want, within d.
func (pp *nsPeer) await(t testing.TB, d time.Duration, want string) string {
	t.Helper()
	select {
	case line, ok := <-pp.lines:
		if !ok {
			t.Fatalf("%s peer exited; its stderr:\n%s", want, pp.child.Stderr.Tail(4000))
		}
		require.True(t, strings.HasPrefix(line, want), "want %s, got %q; stderr:\n%s", want, line, pp.child.Stderr.Tail(2000))
		return strings.TrimSpace(strings.TrimPrefix(line, want))
	case <-time.After(d):
		_ = pp.child.Cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, to stderr (ip netns exec execs it)
		time.Sleep(time.Second)
		t.Fatalf("no %s from the peer within %v; its stderr:\n%s", want, d, pp.child.Stderr.Tail(20000))
	}
	return ""
}

// send writes one command line.
func (pp *nsPeer) send(t testing.TB, format string, args ...any) {
	t.Helper()
	_, err := fmt.Fprintf(pp.child.Stdin, format+"\n", args...)
	require.NoError(t, err)
}

// hold prefills a request and returns its kv_transfer_params (as JSON, for the decode peer).
func (pp *nsPeer) hold(t testing.TB, id string, tokens, seed int) string {
	pp.send(t, "HOLD %s %d %d", id, tokens, seed)
	return pp.await(t, 30*time.Second, "PARAMS")
}

// held asks the prefill peer how many requests it holds.
func (pp *nsPeer) held(t testing.TB) int {
	pp.send(t, "HELD")
	n, err := strconv.Atoi(pp.await(t, 10*time.Second, "HELD"))
	require.NoError(t, err)
	return n
}

// eventuallyHeld waits until the prefill peer holds want requests.
func (pp *nsPeer) eventuallyHeld(t testing.TB, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := pp.held(t)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prefill peer still holds %d requests after %v (want %d)", n, within, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pullReply is the decode peer's answer to PULL.
type pullReply struct {
	OK      bool
	Bytes   int64
	Elapsed time.Duration
	Err     string
}

// pull asks the decode peer to read a request (checking the bytes against the pattern of seed), heartbeating
// the prefill's lease for keep first when keep > 0; the reply comes within timeout plus a margin.
func (pp *nsPeer) pull(t testing.TB, id string, seed int, timeout, keep time.Duration, params string) pullReply {
	t.Helper()
	pp.send(t, "PULL %s %d %d %d %s", id, seed, timeout.Milliseconds(), keep.Milliseconds(), params)
	line := pp.await(t, timeout+keep+15*time.Second, "PULLED")
	var r pullReply
	require.NoError(t, json.Unmarshal([]byte(line), &r), line)
	return r
}

// nsPeerMain serves one role inside a namespace: prints "READY", then answers
//
//	HOLD <id> <tokens> <seed>                      -> PARAMS <kv_transfer_params JSON>   (prefill)
//	HELD                                           -> HELD <requests held>               (prefill)
//	PULL <id> <seed> <timeout ms> <keep ms> <JSON> -> PULLED <pullReply JSON>            (decode)
//
// until its stdin closes.
func nsPeerMain(role string) int {
	fail := func(err error) int { fmt.Fprintf(os.Stderr, "%s peer: %v\n", role, err); return 1 }
	reply := func(format string, args ...any) { fmt.Printf(nsReplyMark+format+"\n", args...) }
	p, l, c, err := peerSetup(testenv.PeerParam("PROFILE"), nsPeerBlocks)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	backends := ParseBackends([]string{testenv.PeerParam("BACKEND")})
	ifc := testenv.PeerParam("IFACE")
	holdMS := testenv.PeerParamInt("HOLD_MS")
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	switch role {
	case "prefill":
		pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: c, Compat: tinyCompat(p), Backends: backends, DataDevice: ifc},
			Host: testenv.PeerParam("HOST"), HoldTimeout: time.Duration(holdMS) * time.Millisecond})
		if err != nil {
			return fail(err)
		}
		defer pre.Close()
		reply("READY %d", pre.Port())
		for in.Scan() {
			f := strings.Fields(in.Text())
			switch {
			case len(f) == 4 && f[0] == "HOLD":
				tokens, _ := strconv.Atoi(f[2])
				seed, _ := strconv.Atoi(f[3])
				kv, err := pre.Hold(context.Background(), f[1], tokens, patternFill(c, seed))
				if err != nil {
					return fail(err)
				}
				raw, err := p.EncodeParams(kv)
				if err != nil {
					return fail(err)
				}
				reply("PARAMS %s", raw)
			case len(f) == 1 && f[0] == "HELD":
				reply("HELD %d", pre.Held())
			default:
				return fail(fmt.Errorf("unknown command %q", in.Text()))
			}
		}
	case "decode":
		d, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: c, Compat: tinyCompat(p), Backends: backends, DataDevice: ifc}, HandshakeTimeout: 2 * time.Second, HandshakeAttempts: 2})
		if err != nil {
			return fail(err)
		}
		defer d.Close()
		reply("READY")
		for in.Scan() {
			f := strings.SplitN(in.Text(), " ", 6)
			if len(f) != 6 || f[0] != "PULL" {
				return fail(fmt.Errorf("unknown command %q", in.Text()))
			}
			seed, _ := strconv.Atoi(f[2])
			timeoutMS, _ := strconv.Atoi(f[3])
			keepMS, _ := strconv.Atoi(f[4])
			reply("PULLED %s", nsPull(d, c, f[1], seed, time.Duration(timeoutMS)*time.Millisecond, time.Duration(keepMS)*time.Millisecond, []byte(f[5])))
		}
	default:
		return fail(fmt.Errorf("unknown role %q", role))
	}
	return 0
}

// nsPull is the decode peer's PULL: decode the params, keep the lease alive for keep, read, check the bytes.
func nsPull(d *Decode, c *DRAMCache, id string, seed int, timeout, keep time.Duration, raw []byte) []byte {
	out := func(r pullReply) []byte { b, _ := json.Marshal(r); return b }
	kv, err := d.Profile().DecodeParams(raw)
	if err != nil {
		return out(pullReply{Err: err.Error()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+keep)
	defer cancel()
	start := time.Now()
	if keep > 0 {
		stop, err := d.KeepAlive(ctx, kv)
		if err != nil {
			return out(pullReply{Err: "keep-alive: " + err.Error(), Elapsed: time.Since(start)})
		}
		time.Sleep(keep)
		defer stop()
		start = time.Now()
	}
	local := localBlocks(len(kv.RemoteBlockIDs[0]), 0)
	res, err := d.Pull(ctx, id, kv, local)
	r := pullReply{Elapsed: time.Since(start), Bytes: res.Bytes}
	if err != nil {
		r.Err = strings.ReplaceAll(err.Error(), "\n", " ")
		return out(r)
	}
	for reg := 0; reg < c.Geometry().NumRegions(); reg++ {
		for j, b := range local {
			got := blockBytes(c, reg, b)
			for i := range got {
				if want := patternByte(seed, reg, int(kv.RemoteBlockIDs[0][j]), i); got[i] != want {
					r.Err = fmt.Sprintf("data: region %d, local block %d, byte %d: got %#x, want %#x", reg, b, i, got[i], want)
					return out(r)
				}
			}
		}
	}
	r.OK = true
	return out(r)
}

// nsRoles is one prefill and one decode peer across a netns.Pair.
type nsRoles struct {
	pre, dec *nsPeer
}

func startNSRoles(t testing.TB, n *netns.Pair, backend string, p protocol.Profile, hold time.Duration) *nsRoles {
	t.Helper()
	pre := startNSPeer(t, "prefill", n.Prefill, n.PrefillIf, netns.PrefillIP, backend, p, hold)
	dec := startNSPeer(t, "decode", n.Decode, n.DecodeIf, netns.DecodeIP, backend, p, 0)
	return &nsRoles{pre: pre, dec: dec}
}

// nsProfiles are the two vLLM wire eras the cross-namespace tiers run: the oldest and the newest profile.
func nsProfiles() []protocol.Profile {
	all := protocol.Profiles
	return []protocol.Profile{all[0], all[len(all)-1]}
}

// requireBackend fails (CI) or skips the test when NIXL's plugin for backend cannot be loaded in this process.
func requireBackend(t testing.TB, backend string) {
	t.Helper()
	l := testLib(t)
	a, err := l.NewAgent(fmt.Sprintf("probe-%s-%d", backend, time.Now().UnixNano()), nixl.AgentConfig{NoProgressThread: true})
	require.NoError(t, err)
	defer a.Close()
	if _, _, err := a.PluginParams(backend); err != nil {
		testenv.Missing(t, "NIXL's "+backend+" plugin and its libraries",
			fmt.Sprintf("%v; run `make fabric-deps` (it fills the folder $%s names; `gonixl env` lists what the plugin lacks)", err, nixl.EnvDepDirs))
	}
}

// crossNamespace runs the roles of every era over backend across two namespaces: requests of several lengths,
// each read and checked byte for byte, the prefill freeing each on the READ's notification; on lease
// profiles a request is also kept alive by heartbeats across the link beyond its lease, then read.
func crossNamespace(t *testing.T, backend string) {
	requireBackend(t, backend)
	n := newNetPair(t)
	for _, p := range nsProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			const hold = 2 * time.Second
			r := startNSRoles(t, n, backend, p, hold)
			for i, tokens := range []int{1, 40, 37*tinyBlock + 5, 1000 * tinyBlock} {
				id := fmt.Sprintf("%s-%d", strings.ToLower(backend), i)
				kv := r.pre.hold(t, id, tokens, 11+i)
				res := r.dec.pull(t, id, 11+i, 20*time.Second, 0, kv)
				require.True(t, res.OK, "request of %d tokens over %s: %s", tokens, backend, res.Err)
				t.Logf("%s %s: %d tokens, %d bytes in %v", backend, p.Name, tokens, res.Bytes, res.Elapsed)
				r.pre.eventuallyHeld(t, 0, 10*time.Second) // the READ's notification crossed the link
			}
			if p.Leases {
				// Heartbeats across the link keep the request beyond its lease (hold), then it is read.
				kv := r.pre.hold(t, "kept", 64, 5)
				res := r.dec.pull(t, "kept", 5, 10*time.Second, hold+hold/2, kv)
				require.True(t, res.OK, "a request kept alive by heartbeats for 1.5 leases: %s", res.Err)
				r.pre.eventuallyHeld(t, 0, 10*time.Second)
			}
		})
	}
}

// TestCrossNamespaceUCX: the roles on two "hosts" over NIXL's UCX backend (tcp on the veth).
func TestCrossNamespaceUCX(t *testing.T) { crossNamespace(t, "UCX") }

// netemAvailable reports whether the kernel has the netem qdisc (sch_netem), tried on the prefill's veth end.
func netemAvailable(t testing.TB, n *netns.Pair) bool {
	if err := netns.Run("tc", "-n", n.Prefill, "qdisc", "add", "dev", n.PrefillIf, "root", "netem", "delay", "1ms"); err != nil {
		t.Logf("no netem here (%v): the degraded link's loss and delay come from iptables in the namespaces", err)
		return false
	}
	require.NoError(t, netns.Run("tc", "-n", n.Prefill, "qdisc", "del", "dev", n.PrefillIf, "root"))
	return true
}

// crossNamespaceFaults: across the namespaces, over backend, with the newest profile:
//   - the link goes down in the middle of a READ: a clear error within the pull's deadline (or, if the READ
//     won the race, a completed and correct transfer); the prefill frees the unread blocks when the lease ends;
//     the link comes back and a new request is read (the decode handshakes again if it dropped the engine);
//   - a degraded link, 20 ± 5 ms and 1% loss each way (netem where the kernel has it, else iptables rules and
//     internal/netns's NFQUEUE Delayer): completed and checked, the prefill holding nothing after;
//   - an MTU of 1280 on both ends: completed.
func crossNamespaceFaults(t *testing.T, backend string) {
	requireBackend(t, backend)
	n := newNetPair(t)
	p := protocol.Profiles[len(protocol.Profiles)-1]
	const hold = 3 * time.Second
	r := startNSRoles(t, n, backend, p, hold)
	parent := t                           // peers that outlive a subtest are started under the parent test
	big := (nsPeerBlocks - 8) * tinyBlock // 4088 blocks, 64 MiB
	kv := r.pre.hold(t, "warm", 64, 1)
	require.True(t, r.dec.pull(t, "warm", 1, 20*time.Second, 0, kv).OK)
	r.pre.eventuallyHeld(t, 0, 10*time.Second)

	t.Run("link-down-mid-read", func(t *testing.T) {
		kv := r.pre.hold(t, "cut", big, 2)
		const deadline = 4 * time.Second
		r.dec.send(t, "PULL cut 2 %d 0 %s", deadline.Milliseconds(), kv)
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, n.SetLink(false))
		var res pullReply
		require.NoError(t, json.Unmarshal([]byte(r.dec.await(t, deadline+15*time.Second, "PULLED")), &res))
		if res.OK {
			t.Logf("the READ (%d bytes) completed in %v before the link went down", res.Bytes, res.Elapsed)
		} else {
			t.Logf("READ with the link down: %v after the start: %s", res.Elapsed, res.Err)
			require.Less(t, res.Elapsed, deadline+2*time.Second, "the error must come within the pull's deadline")
		}
		// Unread blocks go back when their lease ends, heartbeats or not (the decode's cannot cross).
		r.pre.eventuallyHeld(t, 0, hold+5*time.Second)
		require.NoError(t, n.SetLink(true))
		kv = r.pre.hold(t, "after", 40*tinyBlock, 3)
		if backend == "LIBFABRIC" {
			// NIXL's LIBFABRIC plugin retries fi_read on -FI_EAGAIN inside the post, "indefinitely" (its
			// libfabric_rail.cpp), and libfabric's tcp provider keeps the broken connection to that peer: the
			// decode's first post after the link came back blocks in C, deaf to the pull's context, until
			// libfabric fails it (60 s here before, 120 s in the runs of 2 Dec 2026), and a new handshake
			// (metadata loaded again) does not help. A decode restarted (a new endpoint) reads at once.
			// Bounded generously: the 60 s inside libfabric stretched past 75 s on a loaded 2-core machine, and
			// its 120 s came in at 120.08 s under a load average of 19.
			res := r.dec.pull(t, "after", 3, 200*time.Second, 0, kv)
			if res.OK {
				t.Logf("LIBFABRIC: the first READ after the link came back completed in %v", res.Elapsed)
			} else {
				t.Logf("LIBFABRIC: the first READ after the link came back failed after %v: %s", res.Elapsed, res.Err)
				require.Less(t, res.Elapsed, 215*time.Second)
			}
			_ = r.dec.child.Stdin.Close()
			r.dec = startNSPeer(parent, "decode", n.Decode, n.DecodeIf, netns.DecodeIP, backend, p, 0)
			kv = r.pre.hold(t, "after-restart", 40*tinyBlock, 3)
		}
		var last pullReply
		for i := 0; i < 5; i++ { // the decode may first need to see the old engine fail and handshake anew
			if last = r.dec.pull(t, "again", 3, 5*time.Second, 0, kv); last.OK {
				break
			}
			t.Logf("after the link came back, try %d (%v): %s", i, last.Elapsed, last.Err)
			time.Sleep(500 * time.Millisecond)
			kv = r.pre.hold(t, fmt.Sprintf("after-%d", i), 40*tinyBlock, 3)
		}
		require.True(t, last.OK, "no READ succeeded after the link came back: %s", last.Err)
		t.Logf("after the link came back: %d bytes in %v", last.Bytes, last.Elapsed)
		r.pre.eventuallyHeld(t, 0, hold+5*time.Second)
	})

	t.Run("degraded-link", func(t *testing.T) {
		// 20 ± 5 ms each way and 1% loss each way: netem where the kernel has it, else iptables rules in the
		// namespaces (a random DROP, an NFQUEUE to internal/netns's Delayer).
		var im *netns.Impaired
		if netemAvailable(t, n) {
			require.NoError(t, n.OnBoth("tc", "-n", "{ns}", "qdisc", "add", "dev", "{if}", "root", "netem", "delay", "20ms", "5ms", "loss", "1%"))
			defer func() { require.NoError(t, n.OnBoth("tc", "-n", "{ns}", "qdisc", "del", "dev", "{if}", "root")) }()
		} else {
			if err := netns.CheckIptables(); err != nil {
				testenv.Missing(t, "iptables (loss and delay on a kernel without sch_netem)", err.Error())
			}
			var err error
			im, err = n.Impair(netns.Impairment{Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond, Loss: 0.01})
			require.NoError(t, err)
			defer func() { require.NoError(t, im.Close()) }()
		}
		start := time.Now()
		kv := r.pre.hold(t, "slow", 256*tinyBlock, 4) // 4 MiB
		const deadline = 30 * time.Second
		res := r.dec.pull(t, "slow", 4, deadline, 0, kv)
		require.True(t, res.OK, "READ over a degraded link: %s", res.Err)
		require.Less(t, res.Elapsed, deadline)
		// A READ is at least one round trip, and each direction holds every packet at least 15 ms.
		require.GreaterOrEqual(t, res.Elapsed, 30*time.Millisecond, "the READ did not cross the degraded veth")
		r.pre.eventuallyHeld(t, 0, hold+5*time.Second) // the notification crossed it too; nothing outlives the lease
		if im != nil {
			dropped, err := im.Dropped()
			require.NoError(t, err)
			require.Positive(t, im.Delayed())
			short, long := im.Held()
			require.GreaterOrEqual(t, short, 15*time.Millisecond, "every packet across the link was held 20 ± 5 ms")
			t.Logf("degraded link (20 ± 5 ms, 1%% loss each way, iptables + NFQUEUE): %d bytes read in %v; %d packets held %v–%v, %d dropped; case took %v",
				res.Bytes, res.Elapsed, im.Delayed(), short, long, dropped, time.Since(start))
		} else {
			t.Logf("degraded link (netem 20 ± 5 ms, 1%% loss each way): %d bytes read in %v; case took %v", res.Bytes, res.Elapsed, time.Since(start))
		}
	})

	t.Run("mtu-1280", func(t *testing.T) {
		require.NoError(t, n.OnBoth("ip", "-n", "{ns}", "link", "set", "{if}", "mtu", "1280"))
		defer func() { require.NoError(t, n.OnBoth("ip", "-n", "{ns}", "link", "set", "{if}", "mtu", "1500")) }()
		kv := r.pre.hold(t, "mtu", 512*tinyBlock, 6) // 8 MiB
		res := r.dec.pull(t, "mtu", 6, 30*time.Second, 0, kv)
		require.True(t, res.OK, "READ with an MTU of 1280: %s", res.Err)
		r.pre.eventuallyHeld(t, 0, 10*time.Second)
	})
}

// TestCrossNamespaceFaultsUCX: link loss, a degraded link and a small MTU under NIXL's UCX backend.
func TestCrossNamespaceFaultsUCX(t *testing.T) { crossNamespaceFaults(t, "UCX") }

// BenchmarkCrossNamespaceREAD: the decode role reading from the prefill role across the namespaces (each in
// its own process, the data plane on the veth), over UCX (tcp) and then LIBFABRIC (tcp provider) in the same
// run: requests of 64 and 1024 blocks (1 and 16 MiB of the tiny model), 8 per iteration after a warm-up
// (the handshake). Metrics: GB/s (bytes over the sum of the pulls' times, as the decode measured them,
// bytes checked) and, for LIBFABRIC, x_ucx (its GB/s over UCX's of the same size in this run).
func BenchmarkCrossNamespaceREAD(b *testing.B) {
	n := newNetPair(b)
	p := protocol.Profiles[len(protocol.Profiles)-1]
	ucx := map[int]float64{}
	for _, backend := range []string{"UCX", "LIBFABRIC"} {
		requireBackend(b, backend)
		r := startNSRoles(b, n, backend, p, time.Minute)
		for _, blocks := range []int{64, 1024} {
			b.Run(fmt.Sprintf("%s/blocks=%d", backend, blocks), func(b *testing.B) {
				kv := r.pre.hold(b, "warm", blocks*tinyBlock, 1)
				require.True(b, r.dec.pull(b, "warm", 1, time.Minute, 0, kv).OK)
				var bytes int64
				var took time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for j := 0; j < 8; j++ {
						id := fmt.Sprintf("b%d-%d", i, j)
						kv := r.pre.hold(b, id, blocks*tinyBlock, 2+j)
						res := r.dec.pull(b, id, 2+j, time.Minute, 0, kv)
						require.True(b, res.OK, res.Err)
						bytes += res.Bytes
						took += res.Elapsed
					}
				}
				b.StopTimer()
				gbps := float64(bytes) / took.Seconds() / 1e9
				b.ReportMetric(gbps, "GB/s")
				if backend == "UCX" {
					ucx[blocks] = gbps
				} else if ucx[blocks] > 0 {
					b.ReportMetric(gbps/ucx[blocks], "x_ucx")
				}
			})
		}
	}
}
