package connector

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// listeners returns the addresses this process listens on (TCP, IPv4 and IPv6), read from /proc: the
// sockets of /proc/net/tcp{,6} in state LISTEN whose inode is one of this process's file descriptors.
func listeners(t *testing.T) []net.IP {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd (not Linux?): %v", err)
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []net.IP
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" || !mine[fs[9]] { // 0A: TCP_LISTEN
				continue
			}
			hexIP, _, _ := strings.Cut(fs[1], ":")
			out = append(out, procIP(t, hexIP))
		}
		f.Close()
	}
	return out
}

// procIP decodes /proc/net/tcp's address: 32-bit words in host (little-endian) order.
func procIP(t *testing.T, h string) net.IP {
	ip := make(net.IP, len(h)/2)
	for w := 0; w < len(ip)/4; w++ {
		v, err := strconv.ParseUint(h[8*w:8*w+8], 16, 32)
		require.NoError(t, err)
		ip[4*w], ip[4*w+1], ip[4*w+2], ip[4*w+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	return ip
}

// hasExternalInterface reports whether this host has a non-loopback IPv4 address (without one, "listens only
// on loopback" cannot be told apart from "listens everywhere").
func hasExternalInterface() bool {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return true
		}
	}
	return false
}

// With the side channel on loopback (the default), NIXL's UCX data plane listens on loopback only: no
// listener of this process on another address, and transfers still work. AllDataDevices restores UCX's
// default (every interface).
func TestDataPlaneStaysOnLoopback(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	lo := DataDeviceFor("127.0.0.1")
	require.NotEmpty(t, lo, "this host has a loopback interface")
	assert.Equal(t, lo, DataDeviceFor("localhost"))
	assert.Equal(t, lo, DataDeviceFor("::1"))
	assert.Empty(t, DataDeviceFor("0.0.0.0"))
	assert.Empty(t, DataDeviceFor("192.0.2.10"), "a routable address: no restriction")
	before := map[string]bool{}
	for _, ip := range listeners(t) {
		before[ip.String()] = true
	}
	pr := newPair(t, p, pairOpts{decodeDevice: lo})
	ctx := testenv.Context(t, 30*time.Second)
	kv := pr.prefill(t, ctx, "lo", 2*tinyBlock, 5)
	_, err := pr.dec.Pull(ctx, "lo", kv, localBlocks(2, 0))
	require.NoError(t, err)
	requirePattern(t, pr.dcache, localBlocks(2, 0), kv.RemoteBlockIDs[0], 5)
	ls := listeners(t)
	require.NotEmpty(t, ls, "the side channel and the data plane listen")
	for _, ip := range ls {
		assert.True(t, ip.IsLoopback() || before[ip.String()], "a listener on %v although everything is on loopback", ip)
	}
	if !hasExternalInterface() {
		t.Log("this host has no external IPv4 interface; the check above cannot fail here")
		return
	}
	// The explicit opt-out: UCX's default, listening on every interface.
	c := newCache(t, tinyGeom(t, p, 8))
	all, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: c, Compat: tinyCompat(p), DataDevice: AllDataDevices}})
	require.NoError(t, err)
	defer all.Close()
	external := false
	for _, ip := range listeners(t) {
		external = external || !ip.IsLoopback()
	}
	assert.True(t, external, "AllDataDevices: UCX listens on the external interface too")
}

// withDataDevice adds NET_DEVICES to the UCX backend's engine_config unless the caller's params already set
// it, keeps the caller's other settings and maps, and leaves other backends alone.
func TestWithDataDevice(t *testing.T) {
	in := []nixl.BackendSpec{{Plugin: "UCX", Params: map[string]string{"num_workers": "2", "engine_config": "TLS=tcp"}}, {Plugin: "LIBFABRIC"}}
	out := withDataDevice(in, "lo")
	assert.Equal(t, map[string]string{"num_workers": "2", "engine_config": "TLS=tcp,NET_DEVICES=lo"}, out[0].Params)
	assert.Nil(t, out[1].Params)
	assert.Equal(t, "TLS=tcp", in[0].Params["engine_config"], "the caller's map is not modified")
	assert.Equal(t, map[string]string{"engine_config": "NET_DEVICES=lo"}, withDataDevice([]nixl.BackendSpec{{Plugin: "ucx"}}, "lo")[0].Params)
	own := []nixl.BackendSpec{{Plugin: "UCX", Params: map[string]string{"engine_config": "net_devices=eth1"}}}
	assert.Equal(t, "net_devices=eth1", withDataDevice(own, "lo")[0].Params["engine_config"])
	assert.Equal(t, in, withDataDevice(in, ""))
	assert.Empty(t, resolveDataDevice(AllDataDevices, "127.0.0.1"))
	assert.Equal(t, "eth9", resolveDataDevice("eth9", "127.0.0.1"))
	assert.Equal(t, DataDeviceFor("127.0.0.1"), resolveDataDevice("", "127.0.0.1"))
}

// The trust model in action: any agent that got the prefill worker's metadata can send a forged completion
// notification ("<request id>:1") and free a request's blocks before its decode peer read them. With
// NotifyFrom, the prefill worker honours only the listed agents: the forged notification is dropped and
// counted, while the real decode peer's completion still frees the blocks.
func TestNotifyFromAllowList(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	// forge sends "<reqID>:1" from an agent of its own that knows only the prefill agent's metadata (what the
	// side channel hands to anyone). The agent stays alive until the test ends, so that the message is sent.
	forge := func(t *testing.T, pr *pair, reqID string) {
		t.Helper()
		md, err := pr.pre.Agent().LocalMetadata()
		require.NoError(t, err)
		a, err := testLib(t).NewAgent(fmt.Sprintf("intruder-%d", time.Now().UnixNano()), nixl.AgentConfig{Backends: DefaultBackends})
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Close() })
		target, err := a.LoadRemoteMetadata(md)
		require.NoError(t, err)
		msg, err := p.EncodeNotification(protocol.Notification{RequestID: reqID, Count: 1})
		require.NoError(t, err)
		require.NoError(t, a.SendNotification(target, msg))
	}

	t.Run("no allow-list: a forged completion without the params' suffix is dropped", func(t *testing.T) {
		pr := newPair(t, p, pairOpts{clock: newFakeClock()}) // the hold never expires here
		ctx := testenv.Context(t, 30*time.Second)
		_, err := pr.pre.Hold(ctx, "victim", 2*tinyBlock, nil)
		require.NoError(t, err)
		forge(t, pr, "victim")
		require.Eventually(t, func() bool { return pr.preM.ForgedNotifications() == 1 }, 30*time.Second, time.Millisecond)
		assert.EqualValues(t, 1, pr.preM.Notifications())
		assert.Equal(t, 1, pr.pre.Held())
		assert.Zero(t, pr.preM.BlocksFreed())
		assert.Zero(t, pr.preM.RejectedNotifications())
	})

	t.Run("allow-list: only the decode peer's notification counts", func(t *testing.T) {
		plog, plogs := observed()
		pr := newPair(t, p, pairOpts{prefillLog: plog, clock: newFakeClock(), notifyFrom: func(decID string) []string {
			return []string{"someone-else", decID + "-*"}
		}})
		ctx := testenv.Context(t, 30*time.Second)
		kv := pr.prefill(t, ctx, "victim", 2*tinyBlock, 8)
		forge(t, pr, kv.RemoteRequestID) // even with the params' id: the sender is not listed
		// The counter moves before the log line is written: wait for the line.
		const dropped = "notification from an agent outside NotifyFrom dropped"
		require.Eventually(t, func() bool { return plogs.FilterMessage(dropped).Len() == 1 }, 30*time.Second, time.Millisecond)
		assert.EqualValues(t, 1, pr.preM.RejectedNotifications())
		assert.Equal(t, 1, pr.pre.Held(), "the forged completion must not free the blocks")
		rejected := plogs.FilterMessage(dropped).All()
		require.Len(t, rejected, 1)
		assert.Contains(t, fieldsOf(rejected[0])["from"], "intruder-")

		_, err := pr.dec.Pull(ctx, "victim", kv, localBlocks(2, 0))
		require.NoError(t, err)
		requirePattern(t, pr.dcache, localBlocks(2, 0), kv.RemoteBlockIDs[0], 8)
		require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, time.Millisecond,
			"the listed decode peer's completion frees the blocks")
		assert.EqualValues(t, 1, pr.preM.RejectedNotifications())
	})

	t.Run("exact names", func(t *testing.T) {
		pr := &Prefill{cfg: PrefillConfig{NotifyFrom: []string{"a", "b-*"}}}
		for name, want := range map[string]bool{"a": true, "ab": false, "b-": true, "b-x": true, "b": false, "": false} {
			assert.Equal(t, want, pr.notifyAllowed(name), name)
		}
		assert.True(t, (&Prefill{}).notifyAllowed("anyone"))
	})
}
