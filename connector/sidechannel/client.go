package sidechannel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
)

// Errors of this package; errors also wrap protocol's sentinels where the bytes were at fault.
var (
	// ErrTimeout: no reply within the per-attempt timeout, for every attempt. Is the prefill side up and is
	// remote_host:remote_port reachable (vLLM binds "localhost" unless VLLM_NIXL_SIDE_CHANNEL_HOST is set)?
	ErrTimeout = errors.New("sidechannel: no reply before the timeout")
	// ErrRejected: the server answered with an empty payload (a gonixl server does that for an unknown rank
	// or a request it cannot parse).
	ErrRejected = errors.New("sidechannel: server rejected the metadata request")
	// ErrConfig: bad address, port or option.
	ErrConfig = errors.New("sidechannel: invalid configuration")
)

// FetchOptions tunes Fetch and FetchAll. The zero value means vLLM's behaviour plus bounded retries.
type FetchOptions struct {
	// Timeout per attempt; Profile.HandshakeTimeout (vLLM's RCVTIMEO, 5 s) when 0.
	Timeout time.Duration
	// Attempts in total per rank (each on a fresh socket after a timeout); 3 when 0.
	Attempts int
	// Backoff before the second attempt, doubling after; 100 ms when 0.
	Backoff time.Duration
	// MaxReplySize bounds a reply (libzmq drops larger messages); 64 MiB when 0.
	MaxReplySize int64
	// Logger gets a line per failed attempt; nil logs nothing.
	Logger *zap.Logger
}

// Result is one rank's reply.
type Result struct {
	Rank    protocol.Rank
	Payload []byte // the handshake payload (Profile.OpenHandshake decodes it)
	// RemoteClock is the server's monotonic clock (H4 only; HasClock says whether it was sent).
	RemoteClock float64
	HasClock    bool
	// ClockOffset estimates RemoteClock minus this process's monotonic clock (seconds), from the round
	// trip's midpoint as vLLM does; valid when HasClock.
	ClockOffset float64
	RTT         time.Duration
}

// Fetch asks the side channel at addr ("host:port", "[v6]:port" or "tcp://…") for one rank's metadata.
func Fetch(ctx context.Context, p protocol.Profile, addr string, rank protocol.Rank, opts FetchOptions) (Result, error) {
	res, err := FetchAll(ctx, p, addr, []protocol.Rank{rank}, opts)
	if err != nil {
		return Result{}, err
	}
	return res[0], nil
}

// FetchAll asks for several ranks over one REQ socket, one after another, like vLLM's decode side. A timeout
// reopens the socket (a REQ socket that lost its reply is stuck) and retries that rank, up to Attempts.
// Every wait is bounded by ctx and the per-attempt timeout.
func FetchAll(ctx context.Context, p protocol.Profile, addr string, ranks []protocol.Rank, opts FetchOptions) ([]Result, error) {
	ep, v6, err := endpoint(addr)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 {
		opts.Timeout = p.HandshakeTimeout
		if opts.Timeout <= 0 {
			opts.Timeout = 5 * time.Second
		}
	}
	if opts.Attempts <= 0 {
		opts.Attempts = 3
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 100 * time.Millisecond
	}
	if opts.MaxReplySize <= 0 {
		opts.MaxReplySize = 64 << 20
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	reqs := make([][]byte, len(ranks))
	for i, r := range ranks {
		if reqs[i], err = p.EncodeRequest(r); err != nil {
			return nil, err
		}
	}

	runtime.LockOSThread() // the REQ socket lives on this thread only
	defer runtime.UnlockOSThread()
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("sidechannel: new ZMQ context: %w", err)
	}
	c := &client{zctx: zctx, ep: ep, v6: v6, maxReply: opts.MaxReplySize}
	defer c.shutdown()

	out := make([]Result, 0, len(ranks))
	for i, r := range ranks {
		var res Result
		backoff := opts.Backoff
		for attempt := 1; ; attempt++ {
			res, err = c.roundTrip(ctx, p, reqs[i], opts.Timeout)
			if err == nil || !errors.Is(err, ErrTimeout) || attempt >= opts.Attempts || ctx.Err() != nil {
				break
			}
			log.Warn("side-channel attempt timed out; retrying on a fresh socket", zap.String("endpoint", ep),
				zap.Stringer("rank", r), zap.Int("attempt", attempt), zap.Duration("timeout", opts.Timeout))
			c.closeSocket()
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
			backoff *= 2
		}
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w (%v)", ctx.Err(), err)
			}
			return nil, fmt.Errorf("sidechannel: metadata of rank %v from %s (vLLM %s): %w", r, ep, p.Name, err)
		}
		res.Rank = r
		out = append(out, res)
	}
	return out, nil
}

type client struct {
	zctx     *zmq.Context
	sock     *zmq.Socket
	ep       string
	v6       bool
	maxReply int64
}

func (c *client) open() error {
	sock, err := c.zctx.NewSocket(zmq.REQ)
	if err != nil {
		return fmt.Errorf("sidechannel: new REQ socket: %w", err)
	}
	for _, set := range []func() error{
		func() error { return sock.SetLinger(0) },
		func() error { return sock.SetMaxmsgsize(c.maxReply) },
		func() error { return sock.SetIpv6(c.v6) },
	} {
		if err := set(); err != nil {
			_ = sock.Close()
			return fmt.Errorf("sidechannel: set REQ option: %w", err)
		}
	}
	if err := sock.Connect(c.ep); err != nil {
		_ = sock.Close()
		return fmt.Errorf("%w: connect %s: %v", ErrConfig, c.ep, err)
	}
	c.sock = sock
	return nil
}

func (c *client) closeSocket() {
	if c.sock != nil {
		_ = c.sock.Close()
		c.sock = nil
	}
}

func (c *client) shutdown() {
	c.closeSocket()
	_ = c.zctx.Term()
}

func (c *client) roundTrip(ctx context.Context, p protocol.Profile, req []byte, timeout time.Duration) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if c.sock == nil {
		if err := c.open(); err != nil {
			return Result{}, err
		}
	}
	start := time.Now()
	t0 := monotonicSeconds()
	if _, err := c.sock.SendBytes(req, zmq.DONTWAIT); err != nil {
		c.closeSocket()
		if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			return Result{}, fmt.Errorf("%w: request could not be queued", ErrTimeout)
		}
		return Result{}, fmt.Errorf("sidechannel: send: %w", err)
	}
	deadline := start.Add(timeout)
	poller := zmq.NewPoller()
	poller.Add(c.sock, zmq.POLLIN)
	for {
		if err := ctx.Err(); err != nil {
			c.closeSocket()
			return Result{}, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			c.closeSocket()
			return Result{}, fmt.Errorf("%w (%v)", ErrTimeout, timeout)
		}
		polled, err := poller.Poll(min(left, 50*time.Millisecond))
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			c.closeSocket()
			return Result{}, fmt.Errorf("sidechannel: poll: %w", err)
		}
		if len(polled) > 0 {
			break
		}
	}
	frames, err := c.sock.RecvMessageBytes(zmq.DONTWAIT)
	rtt := time.Since(start)
	t1 := monotonicSeconds()
	if err != nil {
		c.closeSocket()
		return Result{}, fmt.Errorf("sidechannel: receive: %w", err)
	}
	rep, err := p.DecodeReply(frames)
	if err != nil {
		return Result{}, err
	}
	if len(rep.Payload) == 0 {
		return Result{}, ErrRejected
	}
	res := Result{Payload: rep.Payload, RemoteClock: rep.Clock, HasClock: rep.HasClock, RTT: rtt}
	if rep.HasClock {
		res.ClockOffset = rep.Clock - (t0+t1)/2
	}
	return res, nil
}

// endpoint turns "host:port", "[v6]:port" or "tcp://…" into a ZMQ endpoint and says whether it is IPv6.
func endpoint(addr string) (string, bool, error) {
	a := strings.TrimPrefix(addr, "tcp://")
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return "", false, fmt.Errorf("%w: address %q is not host:port", ErrConfig, addr)
	}
	if strings.Contains(host, ":") {
		return "tcp://[" + host + "]:" + port, true, nil
	}
	return "tcp://" + host + ":" + port, false, nil
}
