package nixl

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/gonixl/gonixl/internal/poll"
)

// Op is a transfer direction, seen from the initiating (local) agent.
type Op int

// Read pulls remote bytes into local memory; Write pushes local bytes to remote memory.
const (
	Read  Op = 0 // READ
	Write Op = 1 // WRITE
)

// Prepped is a descriptor list prepared once (prepXferDlist) so that many transfers can be made from it by
// index (MakeXfer). A Prepped is safe for concurrent use; Close releases it (idempotent).
type Prepped struct {
	ref    childRef
	agent  string // "" for local
	mem    MemType
	n      int
	remote bool
}

// Len returns the number of descriptors.
func (p *Prepped) Len() int { return p.n }

// MemType returns the list's memory type.
func (p *Prepped) MemType() MemType { return p.mem }

// Remote returns the peer agent the list describes, or "" for a local list.
func (p *Prepped) Remote() string { return p.agent }

// Close releases the prepared list.
func (p *Prepped) Close() error {
	return p.ref.a.closeChild(p.ref.id, "release prepared descriptor list")
}

// Prep prepares descs for transfers. remote is "" for the local side, or the name of a peer whose metadata
// is loaded (the remote side; descriptors must lie inside memory the peer registered). The whole list goes
// to NIXL in one call.
func (a *Agent) Prep(remote string, mem MemType, descs []Desc, opts ...Option) (*Prepped, error) {
	op := "prepare descriptor list"
	side := "local"
	if remote != "" {
		side = "remote agent " + remote
	}
	var p *Prepped
	if err := a.withRemote(op, remote, opts, func(cr cString, o optHandle) error {
		l, err := buildXferList(op, mem, descs, false)
		if err != nil {
			return err
		}
		defer cDestroyXferList(l)
		h, st := cPrepXferDlist(a.h, cr, l, o)
		if err := check(op, st,
			fmt.Sprintf("%d %s descriptors for %s: is the memory registered (and the remote metadata loaded)?", len(descs), mem, side)); err != nil {
			return err
		}
		// Owned by the agent before its lock is released, so that a concurrent Close releases it.
		id := a.addChild(&child{kind: kindPrepped, prepped: h, desc: fmt.Sprintf("%d %s descriptors (%s)", len(descs), mem, side)})
		p = &Prepped{ref: childRef{a, id}, agent: remote, mem: mem, n: len(descs), remote: remote != ""}
		return nil
	}); err != nil {
		return nil, err
	}
	runtime.AddCleanup(p, func(ref childRef) { ref.leaked() }, p.ref)
	return p, nil
}

// State is a transfer's progress.
type State int

// InProgress: posted and running. Done: complete (the data is in place).
const (
	InProgress State = iota // IN_PROGRESS
	Done                    // DONE
)

// Xfer is a transfer request. It can be posted again after it completed (optionally with a new
// notification). Its methods are safe for concurrent use; Close releases it (idempotent; if the transfer
// is still running NIXL tries to cancel it, and when it cannot, Close returns an error and the request
// stays owned by the agent, which retries when it is closed).
type Xfer struct {
	ref    childRef
	op     Op
	remote string
	count  int
	mu     sync.Mutex
}

// Op returns the transfer direction.
func (x *Xfer) Op() Op { return x.op }

// Remote returns the peer agent.
func (x *Xfer) Remote() string { return x.remote }

// Len returns the number of descriptor pairs.
func (x *Xfer) Len() int { return x.count }

var idxPool = sync.Pool{New: func() any { s := make([]cIndex, 0, 1024); return &s }}

// toCIndices validates indices against a list length and converts them to C ints in a pooled buffer.
func toCIndices(op, side string, idx []int, n int, buf *[]cIndex) error {
	out := (*buf)[:0]
	for i, v := range idx {
		if v < 0 || v >= n {
			return goErr(op, ErrIndexOutOfRange, "%s index %d at position %d is outside the prepared list of %d descriptors", side, v, i, n)
		}
		out = append(out, cIndex(v))
	}
	*buf = out
	return nil
}

// MakeXfer makes a transfer from prepared lists: pair i moves local descriptor localIdx[i] and remote
// descriptor remoteIdx[i] (their lengths must match). Indices are checked against the lists before NIXL is
// called; the whole index arrays go to NIXL in one call.
func (a *Agent) MakeXfer(op Op, local *Prepped, localIdx []int, remote *Prepped, remoteIdx []int, opts ...Option) (*Xfer, error) {
	name := "make transfer request"
	if local == nil || remote == nil {
		return nil, goErr(name, ErrInvalidParam, "nil prepared list")
	}
	if local.ref.a != a || remote.ref.a != a {
		return nil, goErr(name, ErrInvalidParam, "prepared lists belong to another agent")
	}
	if len(localIdx) != len(remoteIdx) || len(localIdx) == 0 {
		return nil, goErr(name, ErrInvalidParam, "need as many local as remote indices, at least one (got %d and %d)", len(localIdx), len(remoteIdx))
	}
	lb, rb := idxPool.Get().(*[]cIndex), idxPool.Get().(*[]cIndex)
	defer idxPool.Put(lb)
	defer idxPool.Put(rb)
	if err := toCIndices(name, "local", localIdx, local.n, lb); err != nil {
		return nil, err
	}
	if err := toCIndices(name, "remote", remoteIdx, remote.n, rb); err != nil {
		return nil, err
	}
	o, end, err := a.useOpts(name, opts)
	if err != nil {
		return nil, err
	}
	defer end()
	lc, err := a.child(local.ref.id, name)
	if err != nil {
		return nil, err
	}
	rc, err := a.child(remote.ref.id, name)
	if err != nil {
		return nil, err
	}
	h, st := cMakeXferReq(a.h, op, lc.prepped, *lb, rc.prepped, *rb, o)
	if err := check(name, st,
		fmt.Sprintf("%s of %d descriptors from %s: do the paired lengths match?", op, len(localIdx), remote.agent)); err != nil {
		return nil, err
	}
	return a.newXfer(h, op, remote.agent, len(localIdx)), nil
}

// CreateXfer makes a transfer from two descriptor lists (prepared internally; pair i moves local[i] and
// remote[i], whose lengths must match) to or from the agent remote.
func (a *Agent) CreateXfer(op Op, localMem MemType, local []Desc, remoteMem MemType, remote []Desc, remoteAgent string, opts ...Option) (*Xfer, error) {
	name := "create transfer request"
	if len(local) != len(remote) {
		return nil, goErr(name, ErrInvalidParam, "local and remote lists differ in length (%d vs %d)", len(local), len(remote))
	}
	for i := range local {
		if local[i].Len != remote[i].Len {
			return nil, goErr(name, ErrInvalidParam, "pair %d: local length %d != remote length %d", i, local[i].Len, remote[i].Len)
		}
	}
	var x *Xfer
	if err := a.withRemote(name, remoteAgent, opts, func(cr cString, o optHandle) error {
		lh, err := buildXferList(name, localMem, local, false)
		if err != nil {
			return err
		}
		defer cDestroyXferList(lh)
		rh, err := buildXferList(name, remoteMem, remote, false)
		if err != nil {
			return err
		}
		defer cDestroyXferList(rh)
		h, st := cCreateXferReq(a.h, op, lh, rh, cr, o)
		if err := check(name, st,
			fmt.Sprintf("%s of %d descriptors with %s: is its metadata loaded and are both sides registered?", op, len(local), remoteAgent)); err != nil {
			return err
		}
		x = a.newXfer(h, op, remoteAgent, len(local)) // under the agent's lock, like Prep's child
		return nil
	}); err != nil {
		return nil, err
	}
	return x, nil
}

func (a *Agent) newXfer(h xferHandle, op Op, remote string, n int) *Xfer {
	id := a.addChild(&child{kind: kindXfer, xfer: h, desc: fmt.Sprintf("%s of %d descriptors with %s", op, n, remote)})
	x := &Xfer{ref: childRef{a, id}, op: op, remote: remote, count: n}
	runtime.AddCleanup(x, func(ref childRef) { ref.leaked() }, x.ref)
	return x
}

func (x *Xfer) handle(op string) (xferHandle, func(), error) {
	done, err := x.ref.a.use(op)
	if err != nil {
		return nil, nil, err
	}
	c, err := x.ref.a.child(x.ref.id, op)
	if err != nil {
		done()
		return nil, nil, err
	}
	return c.xfer, done, nil
}

// Post starts (or restarts, once complete) the transfer. A notification given here replaces the one given
// at creation.
func (x *Xfer) Post(opts ...Option) (State, error) {
	op := "post transfer"
	x.mu.Lock()
	defer x.mu.Unlock()
	h, done, err := x.handle(op)
	if err != nil {
		return InProgress, err
	}
	defer done()
	o, err := buildOpts(op, opts)
	if err != nil {
		return InProgress, err
	}
	defer freeOpts(o)
	st := cPostXfer(x.ref.a.h, h, o)
	if err := check(op, st, fmt.Sprintf("%s with %s: either the request is still in progress (it cannot be reposted until Status says Done) or the peer went away (load its metadata again after it restarts)", x.op, x.remote)); err != nil {
		return InProgress, err
	}
	if Status(st) == StatusSuccess {
		return Done, nil
	}
	return InProgress, nil
}

// Status polls the transfer: InProgress, Done, or an error (the transfer failed; e.g. the peer went away).
func (x *Xfer) Status() (State, error) {
	op := "transfer status"
	h, done, err := x.handle(op)
	if err != nil {
		return InProgress, err
	}
	defer done()
	st := cXferStatus(x.ref.a.h, h)
	if err := check(op, st, fmt.Sprintf("%s with %s", x.op, x.remote)); err != nil {
		return InProgress, err
	}
	if Status(st) == StatusSuccess {
		return Done, nil
	}
	return InProgress, nil
}

// Wait polls Status until the transfer is done, fails, or ctx ends (then it returns ctx's error and the
// transfer may still be running: Close it to cancel). Polling backs off from a busy spin to 1 ms sleeps.
func (x *Xfer) Wait(ctx context.Context) error {
	return x.wait(ctx, poll.Default)
}

func (x *Xfer) wait(ctx context.Context, b poll.Backoff) error {
	var err error
	if cerr := b.Until(ctx, func() bool {
		var st State
		st, err = x.Status()
		return err != nil || st == Done
	}); cerr != nil {
		return goErr("wait for transfer", nil, "%v with %s: %w", x.op, x.remote, cerr)
	}
	return err
}

// WaitBusy is Wait polling back to back for up to spin (then backing off as Wait does): each poll
// progresses the transfer (Status drives NIXL's UCX worker), so a transfer expected within about spin
// completes on the calling thread without sleeps between polls or a progress thread's wake-ups, at the cost
// of a busy core meanwhile. spin ≤ 0 is Wait.
func (x *Xfer) WaitBusy(ctx context.Context, spin time.Duration) error {
	b := poll.Default
	b.SpinFor = spin
	return x.wait(ctx, b)
}

// Close releases the request.
func (x *Xfer) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ref.a.closeChild(x.ref.id, "release transfer request")
}

// EstimateCost asks the backend for an estimate of the transfer's duration and its error margin.
func (x *Xfer) EstimateCost() (duration, margin time.Duration, err error) {
	op := "estimate transfer cost"
	h, done, err := x.handle(op)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	d, e, st := cEstimateXferCost(x.ref.a.h, h)
	if err := check(op, st, ""); err != nil {
		return 0, 0, err
	}
	return d, e, nil
}

// Telemetry is NIXL's per-request telemetry (AgentConfig.CaptureTelemetry must be set).
type Telemetry struct {
	Start        time.Time
	PostDuration time.Duration
	XferDuration time.Duration
	Bytes        uint64
	Descs        uint64
}

// Telemetry returns the request's telemetry.
func (x *Xfer) Telemetry() (Telemetry, error) {
	op := "transfer telemetry"
	h, done, err := x.handle(op)
	if err != nil {
		return Telemetry{}, err
	}
	defer done()
	t, st := cXferTelemetry(x.ref.a.h, h)
	if err := check(op, st, ""); err != nil {
		return Telemetry{}, err
	}
	return t, nil
}

// Backend returns the backend NIXL chose for the request.
func (x *Xfer) Backend() (*Backend, error) {
	op := "query transfer backend"
	h, done, err := x.handle(op)
	if err != nil {
		return nil, err
	}
	defer done()
	inner, st := cQueryXferBackend(x.ref.a.h, h)
	if err := check(op, st, ""); err != nil {
		return nil, err
	}
	for _, b := range x.ref.a.Backends() {
		if cBackendEngine(b.h) == inner {
			return b, nil
		}
	}
	return nil, goErr(op, ErrNotFound, "NIXL named a backend this agent does not know")
}
