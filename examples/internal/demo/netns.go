package demo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Two "hosts" on one machine: network namespaces joined by a veth pair, made by the demo (root only) and
// deleted after. They hold only lo and their veth end, addressed from 198.18.0.0/15 (RFC 2544's benchmarking
// range, never routed), with no route out: no traffic leaves them.
const (
	NetNSPrefillIP = "198.18.0.1"
	NetNSDecodeIP  = "198.18.0.2"
)

// NetNS is the namespaces of the prefill and the decode "host" and their veth ends.
type NetNS struct {
	Prefill, Decode     string // namespace names
	PrefillIf, DecodeIf string // veth ends
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NewNetNS creates the namespaces (names unique to this process) and the veth pair, waiting until both ends
// are up. Close deletes them.
func NewNetNS() (*NetNS, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("ip (iproute2) not found: apt-get install -y iproute2")
	}
	id := fmt.Sprintf("%x", os.Getpid()&0xffffff)
	n := &NetNS{Prefill: "gonixl-demo-" + id + "-p", Decode: "gonixl-demo-" + id + "-d", PrefillIf: "gxp" + id, DecodeIf: "gxd" + id}
	steps := [][]string{
		{"netns", "add", n.Prefill}, {"netns", "add", n.Decode},
		{"-n", n.Prefill, "link", "add", n.PrefillIf, "type", "veth", "peer", "name", n.DecodeIf, "netns", n.Decode},
	}
	for _, s := range []struct{ ns, ifc, ip string }{{n.Prefill, n.PrefillIf, NetNSPrefillIP}, {n.Decode, n.DecodeIf, NetNSDecodeIP}} {
		// No IPv6 link-local address: libfabric's tcp provider would pick it while still tentative.
		steps = append(steps, []string{"-n", s.ns, "link", "set", s.ifc, "addrgenmode", "none"},
			[]string{"-n", s.ns, "addr", "add", s.ip + "/30", "dev", s.ifc},
			[]string{"-n", s.ns, "link", "set", "lo", "up"}, []string{"-n", s.ns, "link", "set", s.ifc, "up"})
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range []struct{ ns, ifc string }{{n.Prefill, n.PrefillIf}, {n.Decode, n.DecodeIf}} {
		for {
			out, _ := exec.Command("ip", "-n", s.ns, "-o", "link", "show", "dev", s.ifc).CombinedOutput()
			if strings.Contains(string(out), "state UP") {
				break
			}
			if time.Now().After(deadline) {
				n.Close()
				return nil, fmt.Errorf("%s in %s not up after 10 s: %s", s.ifc, s.ns, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return n, nil
}

// Close deletes the namespaces (and with them the veth pair).
func (n *NetNS) Close() {
	for _, ns := range []string{n.Prefill, n.Decode} {
		_ = ipCmd("netns", "del", ns)
	}
}

// DataPlaneEnv pins NIXL's data plane to a namespace's veth end: UCX over tcp on it (no shared memory
// between the "hosts"), libfabric's tcp provider on it.
func DataPlaneEnv(ifc string) []string {
	prov := os.Getenv("FI_PROVIDER")
	if prov == "" {
		prov = "tcp"
	}
	return []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=" + ifc, "FI_PROVIDER=" + prov, "FI_TCP_IFACE=" + ifc}
}
