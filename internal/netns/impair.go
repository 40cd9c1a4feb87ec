package netns

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Impairment is what Impair does to the packets leaving each veth end, for kernels without sch_netem.
type Impairment struct {
	Delay, Jitter time.Duration // each packet is held Delay ± Jitter (uniform; never reordered); 0: none
	Loss          float64       // the share of packets dropped at random, 0 to 1
}

// CheckIptables says why Impair cannot work here (no iptables), or nil.
func CheckIptables() error {
	if _, err := exec.LookPath("iptables"); err != nil {
		return errors.New("iptables not found: apt-get install -y iptables")
	}
	return nil
}

// Impaired is an Impairment in place on a Pair; Close removes it.
type Impaired struct {
	p        *Pair
	rules    [][]string // per end: iptables arguments after "-w -A"/"-D", in the order added
	delayers []*Delayer
	loss     bool

	once sync.Once
	err  error
}

// Impair degrades both veth ends' outgoing packets with iptables rules in the namespaces' OUTPUT chains: an
// `-m statistic --mode random` DROP for the loss, then an NFQUEUE rule (queue 0, --queue-bypass) feeding a
// Delayer for the delay. The rules and queues live in the Pair's namespaces, so nothing else is touched.
func (p *Pair) Impair(im Impairment) (*Impaired, error) {
	if err := CheckIptables(); err != nil {
		return nil, err
	}
	if im.Loss < 0 || im.Loss > 1 {
		return nil, fmt.Errorf("netns: loss %v: want a share between 0 and 1", im.Loss)
	}
	out := &Impaired{p: p, loss: im.Loss > 0}
	for _, e := range p.ends() {
		if im.Loss > 0 {
			out.rules = append(out.rules, []string{e.ns, "OUTPUT", "-o", e.ifc, "-m", "statistic", "--mode", "random",
				"--probability", strconv.FormatFloat(im.Loss, 'f', -1, 64), "-j", "DROP"})
		}
		if im.Delay > 0 {
			d, err := NewDelayer(e.ns, 0, im.Delay, im.Jitter)
			if err != nil {
				return nil, errors.Join(err, out.Close())
			}
			out.delayers = append(out.delayers, d)
			out.rules = append(out.rules, []string{e.ns, "OUTPUT", "-o", e.ifc, "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"})
		}
	}
	for i, r := range out.rules {
		if err := Run("ip", append([]string{"netns", "exec", r[0], "iptables", "-w", "-A"}, r[1:]...)...); err != nil {
			out.rules = out.rules[:i]
			return nil, errors.Join(err, out.Close())
		}
	}
	return out, nil
}

// Dropped is how many packets the loss rules dropped, both ends together.
func (im *Impaired) Dropped() (int64, error) {
	var n int64
	for _, e := range im.p.ends() {
		if !im.loss {
			break
		}
		// The loss rule is the chain's first.
		b, err := exec.Command("ip", "netns", "exec", e.ns, "iptables", "-w", "-n", "-v", "-x", "-L", "OUTPUT", "1").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("netns: reading the loss rule's counter in %s: %v: %s", e.ns, err, b)
		}
		f := strings.Fields(string(b))
		if len(f) < 3 || f[2] != "DROP" {
			return 0, fmt.Errorf("netns: the first OUTPUT rule in %s is not the loss rule: %s", e.ns, b)
		}
		c, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("netns: the loss rule's counter in %s: %w", e.ns, err)
		}
		n += c
	}
	return n, nil
}

// Delayed is how many packets the Delayers held, both ends together.
func (im *Impaired) Delayed() int64 {
	var n int64
	for _, d := range im.delayers {
		n += d.Packets()
	}
	return n
}

// Held is the shortest and the longest time a Delayer held a packet (over the packets released on time),
// both ends together; zero before the first.
func (im *Impaired) Held() (shortest, longest time.Duration) {
	for i, d := range im.delayers {
		lo, hi := d.Held()
		if i == 0 || (lo > 0 && (shortest == 0 || lo < shortest)) {
			shortest = lo
		}
		longest = max(longest, hi)
	}
	return shortest, longest
}

// Close removes the rules, then stops the Delayers (releasing what they still hold). Closing twice is not an
// error.
func (im *Impaired) Close() error {
	im.once.Do(func() {
		var errs []error
		for i := len(im.rules) - 1; i >= 0; i-- {
			r := im.rules[i]
			errs = append(errs, Run("ip", append([]string{"netns", "exec", r[0], "iptables", "-w", "-D"}, r[1:]...)...))
		}
		for _, d := range im.delayers {
			errs = append(errs, d.Close())
		}
		im.err = errors.Join(errs...)
	})
	return im.err
}
