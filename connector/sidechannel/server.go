package sidechannel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/lifetime"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// DefaultMaxRequestSize bounds a side-channel request. vLLM's requests are 13–20 bytes; like libzmq with
// ZMQ_MAXMSGSIZE, the server drops the connection of a peer that sends a larger message.
const DefaultMaxRequestSize = 4096

// DefaultHost is where a Server binds unless told otherwise: loopback only (vLLM's default is "localhost").
const DefaultHost = "127.0.0.1"

// Defaults of the per-peer bounds (ServerConfig fields left 0).
const (
	DefaultMaxConnections        = 1024
	DefaultMaxConnectionsPerHost = 256
	DefaultMaxQueuedReplies      = 8
	DefaultRequestRate           = 100 // requests a second per remote host
	DefaultRequestBurst          = 100
	DefaultHandshakeTimeout      = 5 * time.Second
	DefaultIdleTimeout           = 2 * time.Minute
	DefaultEvictIdle             = time.Second
	DefaultWriteTimeout          = 10 * time.Second
	DefaultSendBufferSize        = 256 << 10
	receiveBufferSize            = 64 << 10 // requests are tiny; a pipelining peer's excess waits in its own buffers
	DefaultLogLimit              = 10
	DefaultLogInterval           = time.Minute
)

// ServerConfig configures a Server. Zero values mean the defaults.
type ServerConfig struct {
	// Host to bind: DefaultHost when empty. Use a routable address (or "0.0.0.0") for cross-node setups;
	// that address is also what P advertises as remote_host.
	Host string
	// Port to bind; 0 picks a free port (see Server.Port). vLLM's default is Profile.SideChannelPort plus
	// the DP index.
	Port int
	// Listener, when set, is served instead of binding Host:Port (which are then ignored): a socket bound
	// before, e.g. one inherited from a supervisor that keeps the port across restarts. It must be a TCP
	// listener; the server closes it at Close (after an error from NewServer it is still the caller's). Nil:
	// the server binds its own.
	Listener net.Listener
	// Payloads maps each served (pp, tp) rank to its reply payload (Profile.EncodeHandshake). It can be
	// replaced later with Server.SetPayloads.
	Payloads map[protocol.Rank][]byte
	// MaxRequestSize bounds a request (bytes, all frames); DefaultMaxRequestSize when 0. A peer that sends
	// more is disconnected before the oversized frame is read.
	MaxRequestSize int64
	// Clock returns the monotonic clock (seconds) sent as the H4 second frame; a process-local monotonic
	// clock when nil, like vLLM's time.perf_counter().
	Clock func() float64
	// Logger receives lines about bad input (rate-limited: LogLimit lines per LogInterval, then a count of
	// the suppressed ones); nil logs nothing.
	Logger *zap.Logger

	// MaxConnections caps the open connections (all peers); DefaultMaxConnections when 0. A connection
	// over the cap is closed at once (a libzmq peer reconnects later).
	MaxConnections int
	// MaxConnectionsPerHost caps the open connections from one remote IP address; DefaultMaxConnectionsPerHost
	// (or MaxConnections if smaller) when 0. vLLM's decode workers open one short-lived connection each per
	// handshake.
	MaxConnectionsPerHost int
	// MaxQueuedReplies bounds the replies waiting to be written on one connection; DefaultMaxQueuedReplies
	// when 0. A peer that pipelines requests without reading the replies is not read from while its queue
	// is full, and is disconnected when a reply cannot be written within WriteTimeout.
	MaxQueuedReplies int
	// RequestRate limits the requests per second from one remote host (all its connections together), with
	// bursts of RequestBurst; requests over the rate wait (the peer is not read from meanwhile).
	// DefaultRequestRate and DefaultRequestBurst when 0; a negative RequestRate turns the limit off.
	RequestRate  float64
	RequestBurst int
	// HandshakeTimeout bounds the ZMTP greeting and READY exchange of a new connection (slow or silent peers
	// are disconnected); DefaultHandshakeTimeout when 0.
	HandshakeTimeout time.Duration
	// IdleTimeout disconnects a peer that sends no complete message for this long; DefaultIdleTimeout when 0,
	// none when negative. vLLM's decode side opens a connection per handshake and closes it after.
	IdleTimeout time.Duration
	// EvictIdle makes the caps fair: a new connection over MaxConnectionsPerHost evicts its host's least
	// recently active connection, and one over MaxConnections the least recently active connection of the
	// host holding the most, provided that connection has been idle (no complete message, no reply pending)
	// for at least EvictIdle. Silent or idle peers thus cannot hold slots against a decode worker that
	// handshakes; a peer would need to send on every connection more often than the per-host RequestRate
	// allows to keep more than about RequestRate×EvictIdle of them. DefaultEvictIdle when 0; negative: no
	// eviction (a connection over a cap is refused).
	EvictIdle time.Duration
	// WriteTimeout bounds writing one reply; DefaultWriteTimeout when 0.
	WriteTimeout time.Duration
	// SendBufferSize is each connection's kernel send buffer (SO_SNDBUF): what a peer that does not read can
	// make the kernel hold for it; DefaultSendBufferSize when 0, the kernel's autotuning (up to
	// net.ipv4.tcp_wmem's maximum, 4 MiB on Linux by default) when negative. The receive buffer is 64 KiB.
	SendBufferSize int
	// LogLimit and LogInterval rate-limit the lines about bad input; DefaultLogLimit and
	// DefaultLogInterval when 0.
	LogLimit    int
	LogInterval time.Duration
}

// Stats counts what a Server did, and what it holds now.
type Stats struct {
	Served   uint64 // replies with a payload
	Rejected uint64 // well-framed requests answered with an empty payload (unknown rank, malformed message)
	Dropped  uint64 // messages not answered (no REQ envelope, oversized)

	Accepted    uint64 // connections accepted
	Refused     uint64 // connections closed at once because MaxConnections (or MaxConnectionsPerHost) were open and none could be evicted
	Evicted     uint64 // idle connections closed to admit a new one at a cap (EvictIdle)
	Disconnects uint64 // connections the server closed because of the peer: a failed handshake, a protocol error, an oversized message, an idle or write timeout
	Throttled   uint64 // requests that waited for the per-host rate limit

	Open           int // connections open now
	Hosts          int // remote hosts with per-host state now (0 once every peer has left)
	Queued         int // replies queued or being written now, all connections together
	QueueHighWater int // the most replies one connection has had queued at once (at most MaxQueuedReplies)
}

// Server is the prefill-side side-channel listener: a ZMQ ROUTER (ZMTP 3.1, NULL security, pure Go) that
// answers metadata requests for its (pp, tp) ranks in the profile's framing, with H4's second clock frame
// where the profile has one. vLLM's decode side connects with a pyzmq REQ socket.
//
// Unlike vLLM's listener it survives bad input: a malformed request or an unknown rank is logged and answered
// with an empty payload (a vLLM decoder then fails at once with "Failed to decode NixlHandshakePayload"
// instead of timing out), a message without a REQ envelope is dropped, and a peer that sends an oversized
// message or bad ZMTP is disconnected. Memory per peer is bounded: MaxConnections, MaxConnectionsPerHost,
// MaxQueuedReplies, RequestRate, HandshakeTimeout, IdleTimeout, WriteTimeout and SendBufferSize (kernel
// memory); nothing of a peer is kept after it leaves. It stops when its context is cancelled or Close is
// called.
//
// Concurrency: each connection has a reading goroutine (and a writing one after its handshake); all
// methods are safe for concurrent use.
type Server struct {
	profile  protocol.Profile
	cfg      ServerConfig
	log      *zap.Logger
	logLim   logLimiter
	ln       net.Listener
	endpoint string
	port     int

	mu       sync.RWMutex
	payloads map[protocol.Rank][]byte

	peersMu sync.Mutex
	peers   map[*peer]struct{}
	hosts   map[string]*hostState
	closing bool
	wg      sync.WaitGroup // accept loop and peer goroutines

	served, rejected, dropped                 atomic.Uint64
	accepted, refused, disconnects, throttled atomic.Uint64
	evicted                                   atomic.Uint64
	open, queued, highWater                   atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce lifetime.Once
	err       error // set before done closes
}

type hostState struct {
	refs   int
	peers  map[*peer]struct{} // its connections (refs of them)
	bucket *bucket            // nil: no rate limit
}

// peer is one connection.
type peer struct {
	nc    net.Conn
	addr  string
	host  string
	state *hostState
	slots chan struct{} // one token per queued reply
	dead  chan struct{} // closed by kill
	once  sync.Once
	last  atomic.Int64 // when the peer was accepted or last sent a complete message (UnixNano)
	// detached: the peer no longer counts against the caps (evicted, or released); guarded by peersMu.
	detached bool
}

// kill closes the connection (idempotent); the peer's goroutines notice and leave.
func (p *peer) kill() {
	p.once.Do(func() {
		close(p.dead)
		_ = p.nc.Close()
	})
}

func (p *peer) killed() bool {
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

var processStart = time.Now()

func monotonicSeconds() float64 { return time.Since(processStart).Seconds() }

// NewServer binds the listening socket and starts serving in goroutines. It returns once the socket is bound
// (or with the bind error). Cancel ctx or call Close to stop it.
func NewServer(ctx context.Context, p protocol.Profile, cfg ServerConfig) (*Server, error) {
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("%w: port %d out of range", ErrConfig, cfg.Port)
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{
		profile:  p,
		cfg:      cfg,
		log:      log.With(zap.String("component", "sidechannel.Server"), zap.String("profile", p.Name)),
		logLim:   logLimiter{limit: cfg.LogLimit, interval: cfg.LogInterval},
		payloads: copyPayloads(cfg.Payloads),
		peers:    map[*peer]struct{}{},
		hosts:    map[string]*hostState{},
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	ln := cfg.Listener
	if ln == nil {
		network, addr := listenAddr(cfg.Host, cfg.Port)
		var err error
		if ln, err = net.Listen(network, addr); err != nil {
			return nil, fmt.Errorf("%w: bind tcp://%s: %v (is the port in use?)", ErrConfig, addr, err)
		}
	}
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("%w: Listener serves %s at %s, not TCP", ErrConfig, ln.Addr().Network(), ln.Addr())
	}
	if cfg.Listener != nil {
		s.cfg.Host = ta.IP.String() // Addr names where it listens
	}
	s.ln = ln
	s.port = ta.Port
	s.endpoint = "tcp://" + net.JoinHostPort(ta.IP.String(), strconv.Itoa(ta.Port))
	s.wg.Add(1)
	go s.acceptLoop()
	go s.run(ctx)
	s.log.Debug("serving", zap.String("endpoint", s.endpoint))
	return s, nil
}

// withDefaults returns cfg with the defaults in the fields left 0 (nil, ""). A negative value also means the
// default, except where the field gives it a meaning: RequestRate (no limit), IdleTimeout (none), EvictIdle
// (no eviction) and SendBufferSize (the kernel's autotuning).
func (cfg ServerConfig) withDefaults() ServerConfig {
	cfg.Host = cmp.Or(cfg.Host, DefaultHost)
	if cfg.Clock == nil {
		cfg.Clock = monotonicSeconds
	}
	cfg.MaxRequestSize = positiveOr(cfg.MaxRequestSize, DefaultMaxRequestSize)
	cfg.MaxConnections = positiveOr(cfg.MaxConnections, DefaultMaxConnections)
	cfg.MaxConnectionsPerHost = positiveOr(cfg.MaxConnectionsPerHost, min(DefaultMaxConnectionsPerHost, cfg.MaxConnections))
	cfg.MaxQueuedReplies = positiveOr(cfg.MaxQueuedReplies, DefaultMaxQueuedReplies)
	cfg.RequestRate = cmp.Or(cfg.RequestRate, DefaultRequestRate)
	cfg.RequestBurst = positiveOr(cfg.RequestBurst, DefaultRequestBurst)
	cfg.HandshakeTimeout = positiveOr(cfg.HandshakeTimeout, DefaultHandshakeTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	cfg.EvictIdle = cmp.Or(cfg.EvictIdle, DefaultEvictIdle)
	cfg.WriteTimeout = positiveOr(cfg.WriteTimeout, DefaultWriteTimeout)
	cfg.SendBufferSize = cmp.Or(cfg.SendBufferSize, DefaultSendBufferSize)
	cfg.LogLimit = positiveOr(cfg.LogLimit, DefaultLogLimit)
	cfg.LogInterval = positiveOr(cfg.LogInterval, DefaultLogInterval)
	return cfg
}

// positiveOr returns v when it is positive, else def.
func positiveOr[T int | int64 | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// listenAddr picks the network and address to listen on: IPv4 only unless the host is an IPv6 literal (libzmq
// with ZMQ_IPV6 off, as vLLM's sockets are).
func listenAddr(host string, port int) (string, string) {
	h := strings.Trim(host, "[]")
	if strings.Contains(h, ":") {
		return "tcp", net.JoinHostPort(h, strconv.Itoa(port))
	}
	if h == "*" {
		h = "0.0.0.0"
	}
	return "tcp4", net.JoinHostPort(h, strconv.Itoa(port))
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

// Stats returns the counters so far and what the server holds now.
func (s *Server) Stats() Stats {
	s.peersMu.Lock()
	hosts := len(s.hosts)
	s.peersMu.Unlock()
	return Stats{
		Served: s.served.Load(), Rejected: s.rejected.Load(), Dropped: s.dropped.Load(),
		Accepted: s.accepted.Load(), Refused: s.refused.Load(), Disconnects: s.disconnects.Load(),
		Throttled: s.throttled.Load(), Evicted: s.evicted.Load(),
		Open: int(s.open.Load()), Hosts: hosts, Queued: int(s.queued.Load()), QueueHighWater: int(s.highWater.Load()),
	}
}

// Done is closed when the server has stopped and closed its socket and every connection.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops the server and waits until its socket and connections are closed and their goroutines gone.
// The first Close returns the error the server met while stopping, if any (nil after a normal stop, also
// when its context stopped it first); later ones return nil once the first has finished. This is the
// connector roles' contract too (internal/lifetime.Once).
func (s *Server) Close() error {
	return s.closeOnce.Close(func() error {
		close(s.stop)
		<-s.done
		return s.err
	})
}

func (s *Server) run(ctx context.Context) {
	defer close(s.done)
	select {
	case <-ctx.Done():
	case <-s.stop:
	}
	s.peersMu.Lock()
	s.closing = true
	for p := range s.peers {
		p.kill()
	}
	s.peersMu.Unlock()
	if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		s.err = fmt.Errorf("sidechannel: close listener: %w", err)
	}
	s.wg.Wait()
	if n := s.logLim.flush(); n > 0 {
		s.log.Warn("bad-input lines suppressed by the log rate limit", zap.Uint64("suppressed", n))
	}
}

// badInput logs a line about a peer's bad input, rate-limited.
func (s *Server) badInput(msg string, fields ...zap.Field) {
	ok, suppressed := s.logLim.allow(time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		fields = append(fields, zap.Uint64("suppressed_before", suppressed))
	}
	s.log.Warn(msg, fields...)
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait and try again.
			s.badInput("accept failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
			t := time.NewTimer(backoff)
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.admit(nc)
	}
}

// admit registers a new connection and starts its goroutine. At a cap it evicts an idle connection
// (ServerConfig.EvictIdle), or closes the new one when none is idle.
func (s *Server) admit(nc net.Conn) {
	addr := nc.RemoteAddr().String()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	now := time.Now()
	s.peersMu.Lock()
	st := s.hosts[host]
	full := int(s.open.Load()) >= s.cfg.MaxConnections || st != nil && st.refs >= s.cfg.MaxConnectionsPerHost
	var victim *peer
	if full && !s.closing {
		if victim = s.victim(st, now); victim != nil {
			s.detach(victim)
			full = false
		}
	}
	if s.closing || full {
		closing := s.closing
		s.peersMu.Unlock()
		_ = nc.Close()
		if !closing {
			s.refused.Add(1)
			s.badInput("connection refused: MaxConnections (or MaxConnectionsPerHost) are open, none idle for EvictIdle", zap.String("peer", addr),
				zap.Int("max_connections", s.cfg.MaxConnections), zap.Int("max_connections_per_host", s.cfg.MaxConnectionsPerHost))
		}
		return
	}
	st = s.hosts[host] // detach may have removed it
	if st == nil {
		st = &hostState{peers: map[*peer]struct{}{}}
		if s.cfg.RequestRate > 0 {
			st.bucket = newBucket(s.cfg.RequestRate, s.cfg.RequestBurst, now)
		}
		s.hosts[host] = st
	}
	st.refs++
	if tc, ok := nc.(*net.TCPConn); ok {
		if s.cfg.SendBufferSize > 0 {
			_ = tc.SetWriteBuffer(s.cfg.SendBufferSize)
		}
		_ = tc.SetReadBuffer(receiveBufferSize)
	}
	p := &peer{nc: nc, addr: addr, host: host, state: st,
		slots: make(chan struct{}, s.cfg.MaxQueuedReplies), dead: make(chan struct{})}
	p.last.Store(now.UnixNano())
	st.peers[p] = struct{}{}
	s.peers[p] = struct{}{}
	s.open.Add(1)
	s.accepted.Add(1)
	s.wg.Add(1)
	s.peersMu.Unlock()
	if victim != nil {
		victim.kill()
		s.evicted.Add(1)
		s.log.Debug("idle connection evicted for a new one at the connection cap", zap.String("evicted", victim.addr), zap.String("peer", addr))
	}
	go s.serve(p)
}

// victim picks the connection to evict for a new one from host st (nil: a new host): at the per-host cap
// the least recently active of st's, else the least recently active of the host holding the most
// connections; nil when eviction is off or that connection is not idle (ServerConfig.EvictIdle). Called
// with peersMu held.
func (s *Server) victim(st *hostState, now time.Time) *peer {
	if s.cfg.EvictIdle < 0 {
		return nil
	}
	if st == nil || st.refs < s.cfg.MaxConnectionsPerHost {
		st = nil
		for _, h := range s.hosts {
			if st == nil || h.refs > st.refs {
				st = h
			}
		}
		if st == nil {
			return nil
		}
	}
	var lru *peer
	for p := range st.peers {
		if len(p.slots) == 0 && (lru == nil || p.last.Load() < lru.last.Load()) {
			lru = p
		}
	}
	if lru == nil || now.Sub(time.Unix(0, lru.last.Load())) < s.cfg.EvictIdle {
		return nil
	}
	return lru
}

// detach stops counting p against the caps (once). Called with peersMu held.
func (s *Server) detach(p *peer) {
	if p.detached {
		return
	}
	p.detached = true
	delete(p.state.peers, p)
	if p.state.refs--; p.state.refs == 0 && s.hosts[p.host] == p.state {
		delete(s.hosts, p.host)
	}
	s.open.Add(-1)
}

// release forgets a peer once its goroutines are done: nothing of it stays behind.
func (s *Server) release(p *peer) {
	p.kill()
	s.peersMu.Lock()
	delete(s.peers, p)
	s.detach(p)
	s.peersMu.Unlock()
	s.wg.Done()
}

func (s *Server) serve(p *peer) {
	defer s.release(p)
	zc, err := zmtp.Handshake(p.nc, zmtp.Options{
		Type:             zmtp.ROUTER,
		MaxMessageSize:   s.cfg.MaxRequestSize,
		MaxFrames:        4,
		HandshakeTimeout: s.cfg.HandshakeTimeout,
		WriteTimeout:     s.cfg.WriteTimeout,
		ReadBufferSize:   1024,
	})
	if err != nil {
		if !p.killed() && !errors.Is(err, io.EOF) {
			s.disconnects.Add(1)
			s.badInput("ZMTP handshake failed; closing the connection", zap.String("peer", p.addr), zap.Error(err))
		}
		return
	}
	replies := make(chan [][]byte, s.cfg.MaxQueuedReplies)
	writerDone := make(chan struct{})
	go s.writer(p, zc, replies, writerDone)
	defer func() {
		close(replies)
		<-writerDone
	}()
	for {
		if s.cfg.IdleTimeout > 0 {
			_ = p.nc.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		}
		frames, err := zc.ReadMessage()
		if err != nil {
			s.readFailed(p, err)
			return
		}
		p.last.Store(time.Now().UnixNano())
		if !s.throttle(p) {
			return
		}
		reply, ok := s.answer(p, frames)
		if !ok {
			continue
		}
		// Take a queue slot first: a peer whose replies are not being written waits here, unread.
		select {
		case p.slots <- struct{}{}:
		case <-p.dead:
			return
		}
		s.queued.Add(1)
		if n := int64(len(p.slots)); n > s.highWater.Load() {
			for {
				hw := s.highWater.Load()
				if n <= hw || s.highWater.CompareAndSwap(hw, n) {
					break
				}
			}
		}
		replies <- reply // never blocks: the channel holds as many as there are slots
	}
}

func (s *Server) writer(p *peer, zc *zmtp.Conn, replies <-chan [][]byte, done chan<- struct{}) {
	defer close(done)
	failed := false
	for r := range replies {
		if !failed {
			if err := zc.WriteMessage(r); err != nil {
				failed = true
				if !p.killed() {
					if errors.Is(err, os.ErrDeadlineExceeded) {
						s.disconnects.Add(1)
						s.badInput("reply not written within the write timeout (a peer that does not read its replies); closing the connection",
							zap.String("peer", p.addr), zap.Duration("write_timeout", s.cfg.WriteTimeout))
					} else {
						s.log.Debug("reply not sent (peer gone?)", zap.String("peer", p.addr), zap.Error(err))
					}
				}
				p.kill()
			}
		}
		<-p.slots
		s.queued.Add(-1)
	}
}

func (s *Server) readFailed(p *peer, err error) {
	if p.killed() {
		return
	}
	switch {
	case errors.Is(err, io.EOF):
		// The peer closed its connection.
	case errors.Is(err, zmtp.ErrTooLarge):
		s.dropped.Add(1)
		s.disconnects.Add(1)
		s.badInput("message over the size limit; closing the connection (like libzmq's ZMQ_MAXMSGSIZE)",
			zap.String("peer", p.addr), zap.Int64("max_request_size", s.cfg.MaxRequestSize), zap.Error(err))
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.disconnects.Add(1)
		s.log.Debug("idle connection closed", zap.String("peer", p.addr), zap.Duration("idle_timeout", s.cfg.IdleTimeout))
	case errors.Is(err, zmtp.ErrProtocol), errors.Is(err, zmtp.ErrPeerError), errors.Is(err, io.ErrUnexpectedEOF):
		s.disconnects.Add(1)
		s.badInput("bad ZMTP from the peer; closing the connection", zap.String("peer", p.addr), zap.Error(err))
	default:
		s.log.Debug("connection failed", zap.String("peer", p.addr), zap.Error(err))
	}
}

// throttle waits for the peer's host's rate limit; false when the peer was killed meanwhile.
func (s *Server) throttle(p *peer) bool {
	if p.state.bucket == nil {
		return true
	}
	d := p.state.bucket.reserve(time.Now())
	if d <= 0 {
		return true
	}
	s.throttled.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.dead:
		return false
	}
}

// answer builds the reply to one message: [empty delimiter, reply frames...], or false to drop it.
func (s *Server) answer(p *peer, frames [][]byte) ([][]byte, bool) {
	// A REQ peer's message arrives as ["", request] (the ROUTER's identity frame is implicit: one connection).
	if len(frames) != 2 || len(frames[0]) != 0 {
		s.dropped.Add(1)
		s.badInput("dropping a message without a REQ envelope", zap.String("peer", p.addr), zap.Int("frames", len(frames)))
		return nil, false
	}
	body := frames[1]
	req, err := s.profile.DecodeRequest(body)
	var payload []byte
	if err != nil {
		s.rejected.Add(1)
		s.badInput("malformed metadata request; answering with an empty payload", zap.String("peer", p.addr),
			zap.Error(err), zap.Int("bytes", len(body)))
	} else {
		if req.UnexpectedTag {
			s.badInput("metadata request without the get_meta_msg tag; answering anyway", zap.String("peer", p.addr))
		}
		s.mu.RLock()
		pl, ok := s.payloads[req.Rank]
		s.mu.RUnlock()
		if !ok {
			s.rejected.Add(1)
			s.badInput("metadata request for a rank this server does not have; answering with an empty payload",
				zap.String("peer", p.addr), zap.Stringer("rank", req.Rank))
		} else {
			s.served.Add(1)
			payload = pl // shared, never modified (SetPayload copies)
		}
	}
	reply, err := s.profile.ReplyFrames(payload, s.cfg.Clock())
	if err != nil {
		s.log.Error("cannot build reply", zap.Error(err))
		return nil, false
	}
	return append([][]byte{{}}, reply...), true
}
