package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A Delayer is added latency without sch_netem: an iptables NFQUEUE rule in a namespace hands each matching
// packet (its metadata only, not its bytes) to a netfilter queue bound by the Delayer, which gives the kernel
// its ACCEPT verdict once the packet's delay has passed; the kernel holds the packet until then. Packets leave
// in the order they came (a packet's release time is never before the previous one's), so the jitter does not
// reorder them. The kernel queues at most QueueMaxLen packets awaiting a verdict (it drops beyond that), so the
// Delayer's own backlog is bounded by the same number. It speaks nfnetlink (NETLINK_NETFILTER,
// NFNL_SUBSYS_QUEUE) directly: no libnetfilter_queue, no cgo.
type Delayer struct {
	f       *os.File
	queue   uint16
	delay   time.Duration
	jitter  time.Duration
	pending chan delayed
	done    chan struct{}
	wg      sync.WaitGroup
	packets atomic.Int64
	minHeld atomic.Int64 // ns, over packets released on time (not by Close); -1 before the first
	maxHeld atomic.Int64
	last    time.Time // the reader's; the release time of the newest packet

	errMu sync.Mutex
	err   error

	closeOnce sync.Once
	closeErr  error
}

// QueueMaxLen bounds the packets a Delayer's queue holds (in the kernel and in the Delayer) at once.
const QueueMaxLen = 4096

type delayed struct {
	id      uint32
	got, at time.Time // received, due
}

// nfnetlink_queue's protocol (linux/netfilter/nfnetlink_queue.h, nfnetlink.h).
const (
	nfnlSubsysQueue      = 3
	nfqnlMsgPacket       = 0
	nfqnlMsgConfig       = 2
	nfqnlMsgVerdictBatch = 3

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2

	nfqaCfgCmd         = 1
	nfqaCfgParams      = 2
	nfqaCfgQueueMaxlen = 3
	nfqaCfgMask        = 4
	nfqaCfgFlags       = 5

	nfqnlCfgCmdBind   = 1
	nfqnlCfgCmdUnbind = 2
	nfqnlCopyMeta     = 1
	nfqaCfgFGSO       = 1 << 2 // hand GSO packets over whole (one verdict for up to 64 KiB), not segmented

	nfAccept = 1

	solNetlink       = 270
	netlinkNoENOBUFS = 5
	nlaTypeMask      = 0x3fff
)

// NewDelayer binds netfilter queue queue in namespace ns (a name `ip netns` knows) and starts releasing the
// packets it is handed after delay ± jitter (uniform). Bind it before adding the NFQUEUE rule that feeds it;
// Close stops it. It needs root (CAP_NET_ADMIN in the namespace).
func NewDelayer(ns string, queue uint16, delay, jitter time.Duration) (*Delayer, error) {
	if jitter < 0 || jitter > delay {
		return nil, fmt.Errorf("netns: delay %v ± %v: the jitter must be between 0 and the delay", delay, jitter)
	}
	fd, err := netlinkIn(ns)
	if err != nil {
		return nil, err
	}
	// Nonblocking, so that the os.File goes through Go's poller: reads take deadlines and Close wakes them.
	d := &Delayer{f: os.NewFile(uintptr(fd), "nfqueue:"+ns), queue: queue, delay: delay, jitter: jitter,
		pending: make(chan delayed, QueueMaxLen), done: make(chan struct{})}
	d.minHeld.Store(-1)
	cmd := make([]byte, 4)
	cmd[0] = nfqnlCfgCmdBind
	params := make([]byte, 5) // copy_range 0, copy_mode META
	params[4] = nfqnlCopyMeta
	flags := binary.BigEndian.AppendUint32(nil, nfqaCfgFGSO)
	steps := [][]byte{
		attr(nil, nfqaCfgCmd, cmd),
		attr(attr(attr(attr(nil, nfqaCfgParams, params), nfqaCfgQueueMaxlen, binary.BigEndian.AppendUint32(nil, QueueMaxLen)),
			nfqaCfgMask, flags), nfqaCfgFlags, flags),
	}
	for i, attrs := range steps {
		if err := d.request(uint32(i+1), nfqnlMsgConfig, attrs); err != nil {
			_ = d.f.Close()
			if i == 0 && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EBUSY)) {
				return nil, fmt.Errorf("netns: netfilter queue %d in %s is bound by another process (or this one lacks CAP_NET_ADMIN): %w", queue, ns, err)
			}
			return nil, fmt.Errorf("netns: configuring netfilter queue %d in %s: %w", queue, ns, err)
		}
	}
	d.wg.Add(2)
	go d.read()
	go d.release()
	return d, nil
}

// netlinkIn opens a NETLINK_NETFILTER socket inside namespace ns.
func netlinkIn(ns string) (int, error) {
	fd := -1
	err := inNamespace(ns, func() error {
		var err error
		fd, err = syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, syscall.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netns: netlink socket in %s: %w", ns, err)
		}
		return nil
	})
	if err != nil {
		if fd >= 0 {
			syscall.Close(fd)
		}
		return -1, err
	}
	for _, o := range []struct{ level, opt, v int }{
		{syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 8 << 20}, // room for every queued packet's message
		{solNetlink, netlinkNoENOBUFS, 1},
	} {
		if err := syscall.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			syscall.Close(fd)
			return -1, fmt.Errorf("netns: netlink socket option %d/%d: %w", o.level, o.opt, err)
		}
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("netns: binding the netlink socket: %w", err)
	}
	return fd, nil
}

// inNamespace runs f on a thread of its own inside namespace ns (sockets f makes belong to ns and stay there).
// The thread goes back to its own namespace after, or, if it cannot, dies with its goroutine (it stays locked),
// so no other goroutine ever runs in ns.
func inNamespace(ns string, f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back := true
		ch <- func() error {
			self, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				return fmt.Errorf("netns: %w", err)
			}
			defer self.Close()
			target, err := os.Open("/var/run/netns/" + ns)
			if err != nil {
				return fmt.Errorf("netns: namespace %s: %w", ns, err)
			}
			defer target.Close()
			if err := setns(int(target.Fd())); err != nil {
				return fmt.Errorf("netns: entering %s: %w", ns, err)
			}
			ferr := f()
			if err := setns(int(self.Fd())); err != nil {
				back = false
				return errors.Join(ferr, fmt.Errorf("netns: back from %s: %w", ns, err))
			}
			return ferr
		}()
		if back {
			runtime.UnlockOSThread()
		}
	}()
	return <-ch
}

func setns(fd int) error {
	if _, _, e := syscall.RawSyscall(sysSetns, uintptr(fd), syscall.CLONE_NEWNET, 0); e != 0 {
		return e
	}
	return nil
}

// attr appends one netlink attribute (host-order header, payload padded to 4 bytes).
func attr(b []byte, typ uint16, payload []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// message is one nfnetlink message of the queue subsystem for this queue.
func (d *Delayer) message(seq uint32, msg uint16, flags uint16, attrs []byte) []byte {
	b := make([]byte, 0, 20+len(attrs))
	b = binary.NativeEndian.AppendUint32(b, uint32(20+len(attrs)))
	b = binary.NativeEndian.AppendUint16(b, nfnlSubsysQueue<<8|msg)
	b = binary.NativeEndian.AppendUint16(b, syscall.NLM_F_REQUEST|flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, syscall.AF_UNSPEC, 0) // nfgenmsg: family, NFNETLINK_V0
	b = binary.BigEndian.AppendUint16(b, d.queue)
	return append(b, attrs...)
}

// request sends a configuration message and waits (1 s at most) for the kernel's acknowledgement.
func (d *Delayer) request(seq uint32, msg uint16, attrs []byte) error {
	if _, err := d.f.Write(d.message(seq, msg, syscall.NLM_F_ACK, attrs)); err != nil {
		return err
	}
	if err := d.f.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	defer d.f.SetReadDeadline(time.Time{})
	buf := make([]byte, 8192)
	for {
		n, err := d.f.Read(buf)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == syscall.NLMSG_ERROR && m.Header.Seq == seq && len(m.Data) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return syscall.Errno(-e)
				}
				return nil
			}
		}
	}
}

// read receives the kernel's packet messages and queues each with its release time.
func (d *Delayer) read() {
	defer d.wg.Done()
	defer close(d.pending)
	buf := make([]byte, 1<<16)
	for {
		n, err := d.f.Read(buf)
		if err != nil {
			select {
			case <-d.done:
			default:
				d.fail(fmt.Errorf("netns: reading the netfilter queue: %w", err))
			}
			return
		}
		ids, err := queueMessages(buf[:n])
		if err != nil {
			d.fail(err)
		}
		for _, id := range ids {
			got := time.Now()
			at := got.Add(d.delay)
			if d.jitter > 0 {
				at = at.Add(time.Duration(rand.Int64N(int64(2*d.jitter)+1)) - d.jitter)
			}
			if at.Before(d.last) {
				at = d.last // in order: no reordering
			}
			d.last = at
			d.packets.Add(1)
			select {
			case d.pending <- delayed{id, got, at}: // never full: the kernel queues at most QueueMaxLen
			case <-d.done:
				return
			}
		}
	}
}

// queueMessages decodes what one read from a queue's socket holds: the ids of the packets handed over, in
// order, and the first error (one the kernel reported, a refused verdict, or a message that does not decode).
func queueMessages(b []byte) (ids []uint32, err error) {
	msgs, perr := syscall.ParseNetlinkMessage(b)
	if perr != nil {
		return nil, fmt.Errorf("netns: a netfilter queue message: %w", perr)
	}
	for _, m := range msgs {
		switch {
		case m.Header.Type == syscall.NLMSG_ERROR && len(m.Data) >= 4:
			if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 && err == nil {
				err = fmt.Errorf("netns: the kernel refused a verdict: %w", syscall.Errno(-e))
			}
		case m.Header.Type == nfnlSubsysQueue<<8|nfqnlMsgPacket && len(m.Data) >= 4:
			id, ok := packetID(m.Data[4:])
			if !ok {
				if err == nil {
					err = errors.New("netns: a queued packet's message has no packet header")
				}
				continue
			}
			ids = append(ids, id)
		}
	}
	return ids, err
}

// packetID finds NFQA_PACKET_HDR's packet id among a packet message's attributes.
func packetID(b []byte) (uint32, bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			return 0, false
		}
		if binary.NativeEndian.Uint16(b[2:])&nlaTypeMask == nfqaPacketHdr && l >= 8 {
			return binary.BigEndian.Uint32(b[4:]), true
		}
		l = (l + 3) &^ 3
		if l > len(b) {
			break
		}
		b = b[l:]
	}
	return 0, false
}

// release gives each packet its ACCEPT verdict at its time, one batch verdict for all that are due together;
// once the Delayer is closing, at once.
func (d *Delayer) release() {
	defer d.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	wait := func(at time.Time) {
		if w := time.Until(at); w > 0 {
			timer.Reset(w)
			select {
			case <-timer.C:
			case <-d.done:
			}
		}
	}
	for p := range d.pending {
		wait(p.at)
		d.held(p)
		last := p.id
		for more := true; more; {
			select {
			case q, ok := <-d.pending:
				if !ok {
					more = false
					break
				}
				if time.Until(q.at) > 0 {
					d.verdict(last)
					wait(q.at)
				}
				d.held(q)
				last = q.id
			default:
				more = false
			}
		}
		d.verdict(last)
	}
}

// held notes how long p was held, unless Close cut its delay short.
func (d *Delayer) held(p delayed) {
	select {
	case <-d.done:
		return
	default:
	}
	h := int64(time.Since(p.got))
	if m := d.minHeld.Load(); m < 0 || h < m {
		d.minHeld.Store(h)
	}
	if h > d.maxHeld.Load() {
		d.maxHeld.Store(h)
	}
}

// Held is the shortest and the longest time a packet was held, over the packets released on time (not by
// Close); zero before the first.
func (d *Delayer) Held() (shortest, longest time.Duration) {
	return time.Duration(max(d.minHeld.Load(), 0)), time.Duration(d.maxHeld.Load())
}

// verdict accepts every queued packet up to id (NFQNL_MSG_VERDICT_BATCH).
func (d *Delayer) verdict(id uint32) {
	hdr := binary.BigEndian.AppendUint32(nil, nfAccept)
	hdr = binary.BigEndian.AppendUint32(hdr, id)
	if _, err := d.f.Write(d.message(0, nfqnlMsgVerdictBatch, 0, attr(nil, nfqaVerdictHdr, hdr))); err != nil {
		d.fail(fmt.Errorf("netns: a verdict: %w", err))
	}
}

func (d *Delayer) fail(err error) {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	if d.err == nil {
		d.err = err
	}
}

// Packets is how many packets the Delayer has been handed so far.
func (d *Delayer) Packets() int64 { return d.packets.Load() }

// Err is the first error the Delayer met while running (a refused verdict, a failed read), or nil.
func (d *Delayer) Err() error {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	return d.err
}

// Close releases the packets still held at once, unbinds the queue and waits for the Delayer's goroutines. Remove
// the NFQUEUE rule first (or give it --queue-bypass): a queue nobody binds drops what the rule sends it.
// Closing twice is not an error. It returns Err.
func (d *Delayer) Close() error {
	d.closeOnce.Do(func() {
		close(d.done)
		_ = d.f.SetReadDeadline(time.Now()) // wakes read
		d.wg.Wait()                         // release has accepted everything read
		unbind := make([]byte, 4)
		unbind[0] = nfqnlCfgCmdUnbind
		_, werr := d.f.Write(d.message(0, nfqnlMsgConfig, 0, attr(nil, nfqaCfgCmd, unbind)))
		cerr := d.f.Close()
		d.closeErr = errors.Join(d.Err(), werr, cerr)
	})
	return d.closeErr
}
