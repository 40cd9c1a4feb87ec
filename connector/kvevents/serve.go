package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gonixl/gonixl/internal/zmtp"
)

// accept runs an accept loop, handing each connection to serve on its own goroutine.
func (p *Publisher) accept(l net.Listener, replay bool, serve func(net.Conn)) {
	defer p.wg.Done()
	for {
		nc, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors: try again
			continue
		}
		if !p.track(nc, replay) {
			p.refused.Add(1)
			_ = nc.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(nc)
			serve(nc)
		}()
	}
}

// track registers a connection unless the publisher is closed or at its limit.
func (p *Publisher) track(nc net.Conn, replay bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if replay {
		if p.nrep >= p.cfg.MaxReplayPeers {
			return false
		}
		p.nrep++
	} else if len(p.conns)-p.nrep >= p.cfg.MaxSubscribers {
		return false
	}
	p.conns[nc] = replay
	return true
}

func (p *Publisher) untrack(nc net.Conn) {
	_ = nc.Close()
	p.mu.Lock()
	if p.conns[nc] {
		p.nrep--
	}
	delete(p.conns, nc)
	p.mu.Unlock()
}

func (p *Publisher) acceptSubscribers() {
	p.accept(p.pub, false, p.serveSubscriber)
}

func (p *Publisher) acceptReplay() {
	p.accept(p.rep, true, p.serveReplay)
}

func (p *Publisher) handshake(nc net.Conn, t zmtp.SocketType) (*zmtp.Conn, bool) {
	c, err := zmtp.Handshake(nc, zmtp.Options{Type: t, MaxMessageSize: maxRequestSize, MaxFrames: 4,
		HandshakeTimeout: p.cfg.HandshakeTimeout, WriteTimeout: p.cfg.WriteTimeout})
	if err != nil {
		p.refused.Add(1)
		return nil, false
	}
	return c, true
}

// subscriber is one SUB peer: its subscriptions and its bounded queue of messages to write.
type subscriber struct {
	p       *Publisher
	conn    *zmtp.Conn
	matches atomic.Bool // some subscription is a prefix of the topic

	topics map[string]int // read goroutine only
	nsubs  int

	mu    sync.Mutex
	queue []entry
	bytes int64
	// pending counts messages queued or being written (Close lingers until it is 0 everywhere).
	pending atomic.Int64
	notify  chan struct{} // capacity 1: the queue has something
	done    chan struct{}
}

// enqueue adds e to the queue unless that would pass HWM or MaxQueueBytes; called with p.mu held.
func (s *subscriber) enqueue(e entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) >= s.p.cfg.HWM || s.bytes+int64(len(e.payload)) > s.p.cfg.MaxQueueBytes {
		return false
	}
	s.queue = append(s.queue, e)
	s.bytes += int64(len(e.payload))
	s.pending.Add(1)
	select {
	case s.notify <- struct{}{}:
	default:
	}
	return true
}

func (p *Publisher) serveSubscriber(nc net.Conn) {
	c, ok := p.handshake(nc, zmtp.PUB)
	if !ok {
		return
	}
	s := &subscriber{p: p, conn: c, topics: map[string]int{}, notify: make(chan struct{}, 1), done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
	}()

	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.write()
	}()
	err := s.read()
	close(s.done)
	_ = nc.Close()
	<-writerDone
	if err != nil {
		p.refused.Add(1)
	}
}

// read applies the peer's subscriptions until the connection ends; it returns an error for a protocol
// violation or a limit (not for the peer going away).
func (s *subscriber) read() error {
	for {
		msg, err := s.conn.ReadMessage()
		if err != nil {
			if errors.Is(err, zmtp.ErrProtocol) || errors.Is(err, zmtp.ErrTooLarge) {
				return err
			}
			return nil
		}
		sub, ok := zmtp.ParseSubscription(msg)
		if !ok {
			continue // a PUB socket drops a subscriber's other messages, as libzmq does
		}
		if err := s.apply(sub); err != nil {
			return err
		}
	}
}

// apply counts a SUBSCRIBE or CANCEL and recomputes whether the topic matches.
func (s *subscriber) apply(sub zmtp.Subscription) error {
	t := string(sub.Topic)
	if sub.Subscribe {
		if s.nsubs >= s.p.cfg.MaxSubscriptions {
			return fmt.Errorf("%w: more than %d subscriptions", ErrBadRequest, s.p.cfg.MaxSubscriptions)
		}
		s.topics[t]++
		s.nsubs++
	} else if s.topics[t] > 0 {
		s.topics[t]--
		s.nsubs--
		if s.topics[t] == 0 {
			delete(s.topics, t)
		}
	}
	match := false
	for t := range s.topics {
		match = match || strings.HasPrefix(s.p.cfg.Topic, t)
	}
	s.matches.Store(match)
	return nil
}

// write sends queued messages until the connection ends.
func (s *subscriber) write() {
	for {
		select {
		case <-s.done:
			return
		case <-s.notify:
		}
		if testHookWrite != nil {
			testHookWrite()
		}
		s.mu.Lock()
		q := s.queue
		s.queue, s.bytes = nil, 0
		s.mu.Unlock()
		for i, e := range q {
			if err := s.conn.WriteMessage([][]byte{s.p.topic, seqBytes(int64(e.seq)), e.payload}); err != nil {
				s.pending.Add(-int64(len(q) - i)) // never written: nothing to linger for
				_ = s.conn.Close()                // the read goroutine sees it and ends the subscriber
				return
			}
			s.pending.Add(-1)
		}
	}
}

// testHookWrite, when a test sets it (before starting a publisher), runs before a subscriber's writer takes its
// queue: a test holds it to make a subscriber fall behind deterministically.
var testHookWrite func()

// endSeq is vLLM's end-of-replay marker, (-1).to_bytes(8, "big", signed=True).
var endSeq = seqBytes(-1)

// parseReplayRequest reads a replay request as vLLM's ROUTER receives it after the routing identity: two
// frames, the second the start sequence number as a big-endian unsigned integer of any length (vLLM's
// int.from_bytes; 8 bytes from its clients). A number past 64 bits is past every sequence number.
func parseReplayRequest(msg [][]byte) (uint64, error) {
	if len(msg) != 2 {
		return 0, fmt.Errorf("%w: %d frames, want [empty, start sequence]", ErrBadRequest, len(msg))
	}
	b := msg[1]
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	if len(b) > 8 {
		return math.MaxUint64, nil
	}
	var n [8]byte
	copy(n[8-len(b):], b)
	return binary.BigEndian.Uint64(n[:]), nil
}

// serveReplay answers replay requests: every buffered batch from the requested sequence number on, then the
// end marker, each as a message of its own.
func (p *Publisher) serveReplay(nc net.Conn) {
	c, ok := p.handshake(nc, zmtp.ROUTER)
	if !ok {
		return
	}
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			if errors.Is(err, zmtp.ErrProtocol) || errors.Is(err, zmtp.ErrTooLarge) {
				p.refused.Add(1)
			}
			return
		}
		start, err := parseReplayRequest(msg)
		if err != nil {
			p.bad.Add(1)
			continue
		}
		p.replays.Add(1)
		for _, e := range p.replaySince(start) {
			if err := c.WriteMessage(p.replayFrames(seqBytes(int64(e.seq)), e.payload)); err != nil {
				return
			}
			p.replayed.Add(1)
		}
		if err := c.WriteMessage(p.replayEnd()); err != nil {
			return
		}
	}
}

// replayFrames is a replayed batch after the ROUTER's routing identity: [b"", seq, payload], with the topic
// before seq where the format has it.
func (p *Publisher) replayFrames(seq, payload []byte) [][]byte {
	if p.cfg.Format.ReplayTopic {
		return [][]byte{{}, p.topic, seq, payload}
	}
	return [][]byte{{}, seq, payload}
}

// replayEnd is the end marker after the routing identity: [b"", -1, b""], [b"", b"", -1, b""] with topics.
func (p *Publisher) replayEnd() [][]byte {
	if p.cfg.Format.ReplayTopic {
		return [][]byte{{}, {}, endSeq, {}}
	}
	return [][]byte{{}, endSeq, {}}
}
