// Package netns makes two "hosts" on one machine for gonixl's tests and demo: two network namespaces joined by
// a veth pair, each holding only lo and its veth end, addressed from 198.18.0.0/15 (the range RFC 2544 reserves
// for benchmarking network devices, never routed) with no route out, so no traffic leaves them. It drives
// iproute2's ip (root only) and has no cgo. Impair degrades the link on kernels without sch_netem: iptables
// rules in the two namespaces drop packets at random and hand them to a Delayer (a netfilter queue client
// over raw nfnetlink) that holds each for a delay.
package netns

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"
)

// The addresses of the two ends (a /30 of their own).
const (
	PrefillIP = "198.18.0.1"
	DecodeIP  = "198.18.0.2"
	PrefixLen = "/30"
)

var seq atomic.Int64

// Pair is the namespaces of the prefill and the decode "host" and their veth ends.
type Pair struct {
	Prefill, Decode     string // namespace names
	PrefillIf, DecodeIf string // veth ends
}

// Check says why Pair cannot be made here (not root, no ip), or nil.
func Check() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("ip (iproute2) not found: apt-get install -y iproute2")
	}
	return nil
}

// Run runs tool (ip or tc) with args and returns its output in the error when it fails.
func Run(tool string, args ...string) error {
	out, err := exec.Command(tool, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New creates the namespaces (names unique to this process and call, prefix e.g. "gonixl") and the veth pair,
// and waits until both ends are up. Close deletes them.
func New(prefix string) (*Pair, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	// Random, not the pid: namespaces left by a killed run (pid reused) must not collide with ours. The
	// interface names ("gxp"+id) stay within Linux's 15 bytes.
	var r [3]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, fmt.Errorf("netns: random name: %w", err)
	}
	id := fmt.Sprintf("%x%02x", r, seq.Add(1)&0xff)
	p := &Pair{Prefill: prefix + "-" + id + "-p", Decode: prefix + "-" + id + "-d", PrefillIf: "gxp" + id, DecodeIf: "gxd" + id}
	steps := [][]string{
		{"netns", "add", p.Prefill}, {"netns", "add", p.Decode},
		// Created in the prefill namespace, so that the pair never exists in the host's.
		{"-n", p.Prefill, "link", "add", p.PrefillIf, "type", "veth", "peer", "name", p.DecodeIf, "netns", p.Decode},
	}
	for _, e := range p.ends() {
		// No IPv6 link-local address: libfabric's tcp provider would otherwise pick it while it is still
		// tentative (duplicate address detection) and fail in fi_enable with "Bad file descriptor".
		steps = append(steps, []string{"-n", e.ns, "link", "set", e.ifc, "addrgenmode", "none"},
			[]string{"-n", e.ns, "addr", "add", e.ip + PrefixLen, "dev", e.ifc},
			[]string{"-n", e.ns, "link", "set", "lo", "up"}, []string{"-n", e.ns, "link", "set", e.ifc, "up"})
	}
	for _, s := range steps {
		if err := Run("ip", s...); err != nil {
			_ = p.Close()
			return nil, err
		}
	}
	if err := p.WaitUp(10 * time.Second); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

type end struct{ ns, ifc, ip string }

func (p *Pair) ends() []end {
	return []end{{p.Prefill, p.PrefillIf, PrefillIP}, {p.Decode, p.DecodeIf, DecodeIP}}
}

// WaitUp waits until both veth ends report operational state UP (carrier on both sides).
func (p *Pair) WaitUp(within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, e := range p.ends() {
		for {
			out, err := exec.Command("ip", "-n", e.ns, "-o", "link", "show", "dev", e.ifc).CombinedOutput()
			if err == nil && strings.Contains(string(out), "state UP") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s in %s is not up after %v: %s", e.ifc, e.ns, within, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// SetLink sets both veth ends up (waiting for carrier) or down: the peers see the link go at once.
func (p *Pair) SetLink(up bool) error {
	state := map[bool]string{true: "up", false: "down"}[up]
	for _, e := range p.ends() {
		if err := Run("ip", "-n", e.ns, "link", "set", e.ifc, state); err != nil {
			return err
		}
	}
	if up {
		return p.WaitUp(10 * time.Second)
	}
	return nil
}

// OnBoth runs tool with args on each end: "{ns}" and "{if}" in args become its namespace and interface.
func (p *Pair) OnBoth(tool string, args ...string) error {
	for _, e := range p.ends() {
		a := make([]string, len(args))
		for i, s := range args {
			a[i] = strings.NewReplacer("{ns}", e.ns, "{if}", e.ifc).Replace(s)
		}
		if err := Run(tool, a...); err != nil {
			return err
		}
	}
	return nil
}

// Close deletes the namespaces, and with them the veth pair. Deleting one already gone is not an error.
func (p *Pair) Close() error {
	var errs []error
	for _, ns := range []string{p.Prefill, p.Decode} {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("deleting network namespace %s: %v: %s", ns, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// DataPlaneEnv pins NIXL's data plane to a namespace's veth end: UCX over tcp on it (UCX would otherwise use
// shared memory between the "hosts"), libfabric's tcp provider (FI_PROVIDER unless set) on it.
func DataPlaneEnv(ifc string) []string {
	prov := os.Getenv("FI_PROVIDER")
	if prov == "" {
		prov = "tcp"
	}
	return []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=" + ifc, "FI_PROVIDER=" + prov, "FI_TCP_IFACE=" + ifc}
}
