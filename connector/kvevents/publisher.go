package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config, vLLM's where it has one (KVEventsConfig).
const (
	DefaultBufferSteps      = 10_000  // KVEventsConfig.buffer_steps
	DefaultHWM              = 100_000 // KVEventsConfig.hwm: messages queued per subscriber
	DefaultMaxQueueBytes    = 64 << 20
	DefaultMaxSubscribers   = 64
	DefaultMaxReplayPeers   = 16
	DefaultMaxSubscriptions = 256
	DefaultWriteTimeout     = 10 * time.Second
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultLinger           = time.Second
	// maxRequestSize bounds a replay request or subscription message (vLLM's request is 1 + 8 bytes).
	maxRequestSize = 4 << 10
)

// Config configures a Publisher. The zero value of every field but Format has a default.
type Config struct {
	// Format is the vLLM release's KV-event format (FormatFor).
	Format Format
	// Addr is the PUB socket's TCP address ("127.0.0.1:5557"; ":0" picks a port, see Publisher.Addr), vLLM's
	// endpoint tcp://*:5557. Ignored when Listener is set.
	Addr string
	// Listener, when set, is the PUB socket's listener (the Publisher closes it).
	Listener net.Listener
	// ReplayAddr is the replay ROUTER socket's TCP address (vLLM's replay_endpoint); no replay socket when it and
	// ReplayListener are unset.
	ReplayAddr string
	// ReplayListener, when set, is the replay socket's listener (the Publisher closes it).
	ReplayListener net.Listener
	// Topic is the first frame of every message (vLLM's topic, "" by default).
	Topic string
	// DataParallelRank is written into batches that have none (vLLM's publisher does the same).
	DataParallelRank int64
	// BufferSteps is how many recent batches the replay socket can resend (DefaultBufferSteps when 0).
	BufferSteps int
	// HWM bounds the messages queued for one subscriber (DefaultHWM when 0); past it, or past MaxQueueBytes,
	// that subscriber misses messages (counted in Stats.Dropped) and can fetch them through replay.
	HWM int
	// MaxQueueBytes bounds the payload bytes queued for one subscriber (DefaultMaxQueueBytes when 0).
	MaxQueueBytes int64
	// MaxSubscribers and MaxReplayPeers bound the connections (more are closed at once; defaults above).
	MaxSubscribers, MaxReplayPeers int
	// MaxSubscriptions bounds one subscriber's topic subscriptions (DefaultMaxSubscriptions); a subscriber
	// that sends more is disconnected.
	MaxSubscriptions int
	// WriteTimeout bounds each write to a peer (DefaultWriteTimeout); a peer that does not read is dropped.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds a peer's ZMTP handshake (DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// Linger bounds how long Close waits for the messages already queued to reach their subscribers (as
	// ZMQ_LINGER does), so that a last batch (AllBlocksCleared at shutdown) is not lost: DefaultLinger when 0;
	// a negative value discards queued messages at once.
	Linger time.Duration
}

// Stats are the publisher's counters since it started.
type Stats struct {
	// Published: batches published (each got a sequence number and a place in the replay buffer).
	Published uint64
	// Dropped: messages a subscriber missed because its queue was full (HWM or MaxQueueBytes).
	Dropped uint64
	// Subscribers: subscribers connected now; Matching: those of them subscribed to the topic (they receive
	// what is published from now on).
	Subscribers, Matching int
	// ReplayRequests: replay requests answered; Replayed: batches they resent.
	ReplayRequests, Replayed uint64
	// BadRequests: replay requests that were not vLLM's two frames (ignored, as vLLM does).
	BadRequests uint64
	// RefusedPeers: connections closed for a failed handshake, a limit or a protocol error.
	RefusedPeers uint64
}

// Publisher is vLLM's ZmqEventPublisher in Go: a ZMQ PUB socket that sends each batch as the three frames
// [topic, sequence number (8 bytes, big-endian), msgpack KVEventBatch] to every subscriber whose
// subscriptions match the topic, with sequence numbers from 0 up, and an optional ROUTER socket that resends
// buffered batches from a requested sequence number, then an end marker. It is safe for concurrent use.
type Publisher struct {
	cfg   Config
	topic []byte
	pub   net.Listener
	rep   net.Listener

	mu     sync.Mutex
	closed bool
	next   uint64
	ring   []entry // the last BufferSteps batches, oldest at ring[head] once full
	head   int
	subs   map[*subscriber]struct{}
	conns  map[net.Conn]bool // every accepted connection; true for a replay peer
	nrep   int               // replay peers in conns
	wg     sync.WaitGroup

	published, dropped, replays, replayed, bad, refused atomic.Uint64
}

type entry struct {
	seq     uint64
	payload []byte
}

// New starts a publisher: it listens (or takes the listeners) and serves subscribers and replay requests until
// Close.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Format.Stored) == 0 {
		return nil, fmt.Errorf("%w: Config.Format is unset (FormatFor(version))", ErrInvalid)
	}
	if cfg.BufferSteps < 0 || cfg.HWM < 0 || cfg.MaxQueueBytes < 0 || cfg.MaxSubscribers < 0 || cfg.MaxReplayPeers < 0 ||
		cfg.MaxSubscriptions < 0 || cfg.WriteTimeout < 0 || cfg.HandshakeTimeout < 0 {
		return nil, fmt.Errorf("%w: negative limit in Config", ErrInvalid)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.BufferSteps, DefaultBufferSteps)
	def(&cfg.HWM, DefaultHWM)
	def(&cfg.MaxSubscribers, DefaultMaxSubscribers)
	def(&cfg.MaxReplayPeers, DefaultMaxReplayPeers)
	def(&cfg.MaxSubscriptions, DefaultMaxSubscriptions)
	if cfg.MaxQueueBytes == 0 {
		cfg.MaxQueueBytes = DefaultMaxQueueBytes
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), subs: map[*subscriber]struct{}{}, conns: map[net.Conn]bool{}}
	p.ring = make([]entry, 0, min(cfg.BufferSteps, 1024))
	var err error
	if p.pub = cfg.Listener; p.pub == nil {
		if p.pub, err = net.Listen("tcp", cfg.Addr); err != nil {
			if cfg.ReplayListener != nil {
				_ = cfg.ReplayListener.Close()
			}
			return nil, fmt.Errorf("kvevents: PUB socket: %w", err)
		}
	}
	if p.rep = cfg.ReplayListener; p.rep == nil && cfg.ReplayAddr != "" {
		if p.rep, err = net.Listen("tcp", cfg.ReplayAddr); err != nil {
			_ = p.pub.Close()
			return nil, fmt.Errorf("kvevents: replay socket: %w", err)
		}
	}
	p.wg.Add(1)
	go p.acceptSubscribers()
	if p.rep != nil {
		p.wg.Add(1)
		go p.acceptReplay()
	}
	return p, nil
}

// Addr is the PUB socket's address (with the port the system chose for ":0").
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's address, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.rep == nil {
		return nil
	}
	return p.rep.Addr()
}

// Format is the publisher's KV-event format.
func (p *Publisher) Format() Format { return p.cfg.Format }

// Publish encodes the batch, gives it the next sequence number, keeps it for replay and queues it for every
// subscriber whose subscriptions match the topic. It never blocks on the network: a subscriber whose queue is
// full misses the message (Stats.Dropped) and can fetch it through replay. A batch without a time gets now's,
// one without DataParallelRank gets Config.DataParallelRank. It returns the batch's sequence number.
func (p *Publisher) Publish(b Batch) (uint64, error) {
	if b.TS == 0 {
		b.TS = float64(time.Now().UnixNano()) / 1e9
	}
	if b.DataParallelRank == nil {
		b.DataParallelRank = &p.cfg.DataParallelRank
	}
	payload, err := p.cfg.Format.EncodeBatch(b)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	seq := p.next
	p.next++
	e := entry{seq: seq, payload: payload}
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, e)
	} else {
		p.ring[p.head] = e
		p.head = (p.head + 1) % len(p.ring)
	}
	p.published.Add(1)
	for s := range p.subs {
		if s.matches.Load() && !s.enqueue(e) {
			p.dropped.Add(1)
		}
	}
	return seq, nil
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	n, m := len(p.subs), 0
	for s := range p.subs {
		if s.matches.Load() {
			m++
		}
	}
	p.mu.Unlock()
	return Stats{Published: p.published.Load(), Dropped: p.dropped.Load(), Subscribers: n, Matching: m,
		ReplayRequests: p.replays.Load(), Replayed: p.replayed.Load(), BadRequests: p.bad.Load(), RefusedPeers: p.refused.Load()}
}

// Close stops serving: it refuses further batches and closes the listeners, waits up to Config.Linger for
// the messages already queued to be written to their subscribers, then closes every connection and waits
// for the publisher's goroutines. Messages still queued then are discarded. Close is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.pub.Close()
	if p.rep != nil {
		err = errors.Join(err, p.rep.Close())
	}
	p.mu.Unlock()
	p.linger()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// linger waits until no subscriber has a message queued or being written, at most Config.Linger.
func (p *Publisher) linger() {
	deadline := time.Now().Add(p.cfg.Linger)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		var pending int64
		for s := range p.subs {
			pending += s.pending.Load()
		}
		p.mu.Unlock()
		if pending == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// replaySince returns the buffered batches with a sequence number of at least start, oldest first.
func (p *Publisher) replaySince(start uint64) []entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []entry
	for i := range p.ring {
		e := p.ring[(p.head+i)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

func seqBytes(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }
