package sidechannel

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
)

// DefaultMaxRequestSize bounds a side-channel request. vLLM's requests are 13–20 bytes; libzmq drops the
// connection of a peer that sends a larger message (ZMQ_MAXMSGSIZE).
const DefaultMaxRequestSize = 4096

// DefaultHost is where a Server binds unless told otherwise: loopback only (vLLM's default is "localhost").
const DefaultHost = "127.0.0.1"

// ServerConfig configures a Server.
type ServerConfig struct {
	// Host to bind: DefaultHost when empty. Use a routable address (or "0.0.0.0") for cross-node setups;
	// that address is also what P advertises as remote_host.
	Host string
	// Port to bind; 0 picks a free port (see Server.Port). vLLM's default is Profile.SideChannelPort plus
	// the DP index.
	Port int
	// Payloads maps each served (pp, tp) rank to its reply payload (Profile.EncodeHandshake). It can be
	// replaced later with Server.SetPayloads.
	Payloads map[protocol.Rank][]byte
	// MaxRequestSize bounds a request (bytes, all frames); DefaultMaxRequestSize when 0.
	MaxRequestSize int64
	// Clock returns the monotonic clock (seconds) sent as the H4 second frame; a process-local monotonic
	// clock when nil, like vLLM's time.perf_counter().
	Clock func() float64
	// Logger receives one line per rejected request; nil logs nothing.
	Logger *zap.Logger
	// PollInterval is how often the serving goroutine checks for shutdown; 50 ms when 0.
	PollInterval time.Duration
}

// Stats counts what a Server did.
type Stats struct {
	Served   uint64 // replies with a payload
	Rejected uint64 // well-framed requests answered with an empty payload (unknown rank, malformed message)
	Dropped  uint64 // messages not answered (bad envelope, oversized)
}

// Server is the prefill-side side-channel listener: a ZMQ ROUTER that answers metadata requests for its
// (pp, tp) ranks in the profile's framing, with H4's second clock frame where the profile has one.
//
// Unlike vLLM's listener it survives bad input: a malformed request or an unknown rank is logged and answered
// with an empty payload (a vLLM decoder then fails at once with "Failed to decode NixlHandshakePayload"
// instead of timing out), a message without a REQ envelope is dropped, and an oversized message makes libzmq
// drop that peer's connection. It stops when its context is cancelled or Close is called.
//
// Concurrency: one goroutine owns the socket; all methods are safe for concurrent use.
type Server struct {
	profile  protocol.Profile
	cfg      ServerConfig
	log      *zap.Logger
	endpoint string
	port     int

	mu       sync.RWMutex
	payloads map[protocol.Rank][]byte

	served, rejected, dropped atomic.Uint64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	err       error // set before done closes
}

var processStart = time.Now()

func monotonicSeconds() float64 { return time.Since(processStart).Seconds() }

// NewServer binds the ROUTER socket and starts serving in a goroutine. It returns once the socket is bound (or
// with the bind error). Cancel ctx or call Close to stop it.
func NewServer(ctx context.Context, p protocol.Profile, cfg ServerConfig) (*Server, error) {
	if cfg.Host == "" {
		cfg.Host = DefaultHost
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("%w: port %d out of range", ErrConfig, cfg.Port)
	}
	if cfg.MaxRequestSize <= 0 {
		cfg.MaxRequestSize = DefaultMaxRequestSize
	}
	if cfg.Clock == nil {
		cfg.Clock = monotonicSeconds
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{
		profile:  p,
		cfg:      cfg,
		log:      log.With(zap.String("component", "sidechannel.Server"), zap.String("profile", p.Name)),
		payloads: copyPayloads(cfg.Payloads),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	ready := make(chan error, 1)
	go s.run(ctx, ready)
	if err := <-ready; err != nil {
		<-s.done
		return nil, err
	}
	return s, nil
}

func copyPayloads(m map[protocol.Rank][]byte) map[protocol.Rank][]byte {
	out := make(map[protocol.Rank][]byte, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Endpoint returns the bound ZMQ endpoint, e.g. "tcp://127.0.0.1:5600".
func (s *Server) Endpoint() string { return s.endpoint }

// Addr returns "host:port" for a client (the values P advertises as remote_host and remote_port).
func (s *Server) Addr() string { return net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.port)) }

// Port returns the bound port.
func (s *Server) Port() int { return s.port }

// SetPayloads replaces the served payloads (vLLM republishes them after a KV-cache re-registration).
func (s *Server) SetPayloads(m map[protocol.Rank][]byte) {
	c := copyPayloads(m)
	s.mu.Lock()
	s.payloads = c
	s.mu.Unlock()
}

// SetPayload serves payload for one rank (nil stops serving it), leaving the other ranks as they are: the
// prefill workers of one engine share one side channel, each publishing its own rank.
func (s *Server) SetPayload(r protocol.Rank, payload []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := copyPayloads(s.payloads)
	if payload == nil {
		delete(c, r)
	} else {
		c[r] = append([]byte(nil), payload...)
	}
	s.payloads = c
}

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	return Stats{Served: s.served.Load(), Rejected: s.rejected.Load(), Dropped: s.dropped.Load()}
}

// Done is closed when the server has stopped and released its socket.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops the server and waits until its socket and ZMQ context are closed. It is idempotent and returns
// the error that stopped the server, if any (nil after a normal stop).
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return s.err
}

func bindHost(h string) (string, bool) {
	if strings.Contains(h, ":") { // IPv6 literal
		return "[" + strings.Trim(h, "[]") + "]", true
	}
	if h == "0.0.0.0" {
		return "*", false
	}
	return h, false
}

func (s *Server) run(ctx context.Context, ready chan<- error) {
	defer close(s.done)
	// libzmq sockets are not thread-safe: keep this socket on one OS thread for its whole life.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	zctx, err := zmq.NewContext()
	if err != nil {
		ready <- fmt.Errorf("sidechannel: new ZMQ context: %w", err)
		return
	}
	sock, err := s.open(zctx)
	if err != nil {
		_ = zctx.Term()
		ready <- err
		return
	}
	ready <- nil
	s.log.Debug("serving", zap.String("endpoint", s.endpoint))
	s.err = s.loop(ctx, sock)
	_ = sock.Close()
	if err := zctx.Term(); err != nil && s.err == nil {
		s.err = fmt.Errorf("sidechannel: terminate ZMQ context: %w", err)
	}
}

func (s *Server) open(zctx *zmq.Context) (*zmq.Socket, error) {
	sock, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		return nil, fmt.Errorf("sidechannel: new ROUTER socket: %w", err)
	}
	host, v6 := bindHost(s.cfg.Host)
	port := "*"
	if s.cfg.Port != 0 {
		port = strconv.Itoa(s.cfg.Port)
	}
	for _, set := range []func() error{
		func() error { return sock.SetLinger(0) },
		func() error { return sock.SetMaxmsgsize(s.cfg.MaxRequestSize) },
		func() error { return sock.SetIpv6(v6) },
		func() error { return sock.SetSndtimeo(0) },
	} {
		if err := set(); err != nil {
			_ = sock.Close()
			return nil, fmt.Errorf("sidechannel: set ROUTER option: %w", err)
		}
	}
	ep := "tcp://" + host + ":" + port
	if err := sock.Bind(ep); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("%w: bind %s: %v (is the port in use?)", ErrConfig, ep, err)
	}
	last, err := sock.GetLastEndpoint()
	if err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("sidechannel: read bound endpoint: %w", err)
	}
	s.endpoint = last
	if i := strings.LastIndexByte(last, ':'); i >= 0 {
		s.port, _ = strconv.Atoi(last[i+1:])
	}
	return sock, nil
}

func (s *Server) loop(ctx context.Context, sock *zmq.Socket) error {
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.stop:
			return nil
		default:
		}
		polled, err := poller.Poll(s.cfg.PollInterval)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("sidechannel: poll: %w", err)
		}
		if len(polled) == 0 {
			continue
		}
		// Drain what is queued, without blocking.
		for i := 0; i < 64; i++ {
			msg, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
					break
				}
				s.log.Warn("receive failed", zap.Error(err))
				break
			}
			s.handle(sock, msg)
		}
	}
}

func (s *Server) handle(sock *zmq.Socket, frames [][]byte) {
	var total int64
	for _, f := range frames {
		total += int64(len(f))
	}
	// A REQ peer's message arrives as [identity, "", request].
	if len(frames) != 3 || len(frames[1]) != 0 || total > s.cfg.MaxRequestSize {
		s.dropped.Add(1)
		s.log.Warn("dropping message without a REQ envelope or over the size limit",
			zap.Int("frames", len(frames)), zap.Int64("bytes", total))
		return
	}
	id, body := frames[0], frames[2]
	req, err := s.profile.DecodeRequest(body)
	var payload []byte
	if err != nil {
		s.rejected.Add(1)
		s.log.Warn("malformed metadata request; answering with an empty payload", zap.Error(err),
			zap.Int("bytes", len(body)))
	} else {
		if req.UnexpectedTag {
			s.log.Warn("metadata request without the get_meta_msg tag; answering anyway")
		}
		s.mu.RLock()
		p, ok := s.payloads[req.Rank]
		s.mu.RUnlock()
		if !ok {
			s.rejected.Add(1)
			s.log.Warn("metadata request for a rank this server does not have; answering with an empty payload",
				zap.Stringer("rank", req.Rank))
		} else {
			s.served.Add(1)
			payload = p
		}
	}
	reply, err := s.profile.ReplyFrames(payload, s.cfg.Clock())
	if err != nil {
		s.log.Error("cannot build reply", zap.Error(err))
		return
	}
	parts := append([][]byte{id, {}}, reply...)
	for i, part := range parts {
		flag := zmq.DONTWAIT
		if i < len(parts)-1 {
			flag |= zmq.SNDMORE
		}
		if _, err := sock.SendBytes(part, flag); err != nil {
			s.log.Warn("reply not sent (peer gone?)", zap.Error(err))
			return
		}
	}
}
