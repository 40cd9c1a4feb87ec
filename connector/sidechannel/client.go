package sidechannel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/zmtp"
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
	// ErrHandshake: the peer does not speak ZMTP 3 with NULL security as a ROUTER or REP socket (is the
	// address a vLLM side channel?).
	ErrHandshake = errors.New("sidechannel: ZMTP handshake failed")
)

// Defaults of FetchOptions' zero fields.
const (
	DefaultFetchTimeout = 5 * time.Second        // vLLM's RCVTIMEO, for a profile with no HandshakeTimeout
	DefaultAttempts     = 3                      // tries per rank in all
	DefaultBackoff      = 100 * time.Millisecond // before the second try, doubling after
	DefaultMaxReplySize = 64 << 20               // bytes
)

// FetchOptions tunes Fetch and FetchAll. The zero value means vLLM's behaviour plus bounded retries.
type FetchOptions struct {
	// Timeout per attempt; 0 (or less) = Profile.HandshakeTimeout (vLLM's RCVTIMEO), or DefaultFetchTimeout
	// when the profile has none.
	Timeout time.Duration
	// Attempts in total per rank (each on a fresh connection after a timeout); 0 (or less) = DefaultAttempts.
	Attempts int
	// Backoff before the second attempt, doubling after; 0 (or less) = DefaultBackoff.
	Backoff time.Duration
	// MaxReplySize bounds a reply (the connection is dropped on a larger one, as libzmq does); 0 (or less) =
	// DefaultMaxReplySize.
	MaxReplySize int64
	// Logger gets a line per failed attempt; nil logs nothing.
	Logger *zap.Logger
}

// WithDefaults returns o with the defaults in its zero fields, under profile p: what Fetch uses.
func (o FetchOptions) WithDefaults(p protocol.Profile) FetchOptions {
	o.Timeout = positiveOr(o.Timeout, positiveOr(p.HandshakeTimeout, DefaultFetchTimeout))
	o.Attempts = positiveOr(o.Attempts, DefaultAttempts)
	o.Backoff = positiveOr(o.Backoff, DefaultBackoff)
	o.MaxReplySize = positiveOr(o.MaxReplySize, DefaultMaxReplySize)
	return o
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

// FetchAll asks for several ranks over one REQ connection, one after another, like vLLM's decode side. A
// timeout or a lost connection reconnects (a REQ socket that lost its reply is stuck) and retries that rank,
// up to Attempts; while nothing listens it dials again every 100 ms within the attempt, like libzmq.
// Every wait is bounded by ctx and the per-attempt timeout.
func FetchAll(ctx context.Context, p protocol.Profile, addr string, ranks []protocol.Rank, opts FetchOptions) ([]Result, error) {
	ep, hostPort, err := endpoint(addr)
	if err != nil {
		return nil, err
	}
	opts = opts.WithDefaults(p)
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

	c := &client{addr: hostPort, maxReply: opts.MaxReplySize}
	defer c.closeConn()

	out := make([]Result, 0, len(ranks))
	for i, r := range ranks {
		var res Result
		backoff := opts.Backoff
		for attempt := 1; ; attempt++ {
			res, err = c.roundTrip(ctx, p, reqs[i], opts.Timeout)
			if err == nil || !errors.Is(err, ErrTimeout) || attempt >= opts.Attempts || ctx.Err() != nil {
				break
			}
			log.Warn("side-channel attempt got no reply; retrying on a fresh connection", zap.String("endpoint", ep),
				zap.Stringer("rank", r), zap.Int("attempt", attempt), zap.Duration("timeout", opts.Timeout), zap.Error(err))
			c.closeConn()
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

// reconnectInterval is how often a REQ client dials again while the server is not there (libzmq's
// ZMQ_RECONNECT_IVL default).
const reconnectInterval = 100 * time.Millisecond

// client is a REQ socket with one connection: send a request, wait for its reply; after a timeout the
// connection is dropped (a REQ socket that lost its reply is stuck), as vLLM's decode side does by opening a
// fresh socket per handshake.
type client struct {
	addr     string
	maxReply int64
	conn     *zmtp.Conn
}

func (c *client) closeConn() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// connect dials until deadline like libzmq's reconnecting connect: the server may not be up yet, or may close
// new connections while it is at its connection cap.
func (c *client) connect(ctx context.Context, deadline time.Time) error {
	for {
		err := c.dialOnce(ctx, deadline)
		if err == nil || ctx.Err() != nil || !errors.Is(err, errRedial) {
			return err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%w (%v)", ErrTimeout, err)
		}
		t := time.NewTimer(min(wait, reconnectInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// errRedial marks a failed connection attempt that connect retries: refused, or closed before the handshake
// ended.
var errRedial = errors.New("sidechannel: connection failed")

func (c *client) dialOnce(ctx context.Context, deadline time.Time) error {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", c.addr)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: connect: %v", errRedial, err)
	}
	_ = nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	zc, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.REQ, MaxMessageSize: c.maxReply, MaxFrames: 8})
	stop()
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = nc.Close()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("%w (ZMTP handshake: %v)", ErrTimeout, err)
		case errors.Is(err, zmtp.ErrProtocol), errors.Is(err, zmtp.ErrIncompatible), errors.Is(err, zmtp.ErrPeerError):
			return fmt.Errorf("%w with %s: %w (is it a ZMQ ROUTER or REP socket without CURVE/PLAIN security?)", ErrHandshake, c.addr, err)
		}
		return fmt.Errorf("%w: closed during the ZMTP handshake (server at its connection cap?): %v", errRedial, err)
	}
	c.conn = zc
	return nil
}

func (c *client) roundTrip(ctx context.Context, p protocol.Profile, req []byte, timeout time.Duration) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	deadline := start.Add(timeout)
	if c.conn == nil {
		if err := c.connect(ctx, deadline); err != nil {
			return Result{}, err
		}
	}
	nc := c.conn.NetConn()
	if err := nc.SetDeadline(deadline); err != nil {
		c.closeConn()
		return Result{}, fmt.Errorf("sidechannel: set deadline: %w", err)
	}
	// A cancelled ctx ends the wait at once.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (Result, error) {
		c.closeConn()
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return Result{}, fmt.Errorf("%w (%v)", ErrTimeout, timeout)
		case errors.Is(err, zmtp.ErrTooLarge):
			return Result{}, fmt.Errorf("sidechannel: reply over MaxReplySize (%d bytes): %w", c.maxReply, err)
		case errors.Is(err, zmtp.ErrProtocol), errors.Is(err, zmtp.ErrPeerError):
			return Result{}, fmt.Errorf("%w: %w", ErrHandshake, err)
		}
		// The connection broke before the reply (server restarted, or it dropped us): no reply, retryable.
		return Result{}, fmt.Errorf("%w: connection lost before the reply (%v)", ErrTimeout, err)
	}
	t0 := monotonicSeconds()
	if err := c.conn.WriteMessage([][]byte{{}, req}); err != nil {
		return fail(err)
	}
	var frames [][]byte
	for {
		msg, err := c.conn.ReadMessage()
		if err != nil {
			return fail(err)
		}
		// REQ semantics: a reply must start with the empty delimiter; anything else is dropped.
		if len(msg) >= 2 && len(msg[0]) == 0 {
			frames = msg[1:]
			break
		}
	}
	rtt := time.Since(start)
	t1 := monotonicSeconds()
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

// endpoint turns "host:port", "[v6]:port" or "tcp://…" into a ZMQ endpoint and the address to dial.
func endpoint(addr string) (string, string, error) {
	a := strings.TrimPrefix(addr, "tcp://")
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return "", "", fmt.Errorf("%w: address %q is not host:port", ErrConfig, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", "", fmt.Errorf("%w: address %q has no valid port", ErrConfig, addr)
	}
	hp := net.JoinHostPort(host, port)
	return "tcp://" + hp, hp, nil
}
