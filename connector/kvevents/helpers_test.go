package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/poll"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/internal/zmtp"
)

var slow = poll.Backoff{Min: time.Millisecond, Max: 20 * time.Millisecond}

// startPublisher starts a publisher on loopback listeners bound here, closed at the end of the test.
func startPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	var err error
	cfg.Listener, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	if cfg.ReplayListener == nil {
		cfg.ReplayListener, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
	}
	p, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// dial connects a Go ZMTP peer of type st to addr.
func dial(t *testing.T, ctx context.Context, addr net.Addr, st zmtp.SocketType) *zmtp.Conn {
	t.Helper()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr.String())
	require.NoError(t, err)
	if dl, ok := ctx.Deadline(); ok {
		require.NoError(t, nc.SetDeadline(dl))
	}
	c, err := zmtp.Handshake(nc, zmtp.Options{Type: st})
	if err != nil {
		_ = nc.Close()
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// subscribe connects a SUB peer, subscribes to topic and waits until the publisher matches it.
func subscribe(t *testing.T, ctx context.Context, p *Publisher, topic string) *zmtp.Conn {
	t.Helper()
	before := matched(p)
	c := dial(t, ctx, p.Addr(), zmtp.SUB)
	require.NoError(t, c.WriteMessage([][]byte{zmtp.AppendSubscription(nil, zmtp.Subscription{Subscribe: true, Topic: []byte(topic)})}))
	if len(topic) <= len(p.cfg.Topic) && p.cfg.Topic[:len(topic)] == topic {
		require.NoError(t, slow.Until(ctx, func() bool { return matched(p) > before }), "the publisher never matched the subscription")
	}
	return c
}

// matched counts the subscribers whose subscriptions match the topic.
func matched(p *Publisher) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.subs {
		if s.matches.Load() {
			n++
		}
	}
	return n
}

// recvPub reads one published message: [topic, seq, payload].
func recvPub(t *testing.T, c *zmtp.Conn) (string, uint64, []byte) {
	t.Helper()
	msg, err := c.ReadMessage()
	require.NoError(t, err)
	require.Len(t, msg, 3)
	require.Len(t, msg[1], 8)
	return string(msg[0]), binary.BigEndian.Uint64(msg[1]), msg[2]
}

// requestReplay sends a replay request over a DEALER and returns the reply messages up to and with the end
// marker.
func requestReplay(t *testing.T, c *zmtp.Conn, start uint64) [][][]byte {
	t.Helper()
	require.NoError(t, c.WriteMessage([][]byte{{}, binary.BigEndian.AppendUint64(nil, start)}))
	var out [][][]byte
	for {
		msg, err := c.ReadMessage()
		require.NoError(t, err)
		out = append(out, msg)
		if len(msg) >= 3 && string(msg[len(msg)-2]) == string(endSeq) {
			return out
		}
	}
}

func ctxT(t *testing.T) context.Context { return testenv.Context(t, 30*time.Second) }

func mustFormat(t testing.TB, name string) Format {
	f, err := FormatByName(name)
	require.NoError(t, err)
	return f
}

// sampleBatch is a batch with one event of each kind, valid in every format.
func sampleBatch(i int) Batch {
	parent := IntHash(uint64(i))
	return Batch{TS: 1_700_000_000.25 + float64(i), Events: []Event{
		&BlockStored{BlockHashes: []BlockHash{IntHash(uint64(1000 + i)), IntHash(1<<64 - 1)}, ParentBlockHash: &parent,
			TokenIDs: []int64{1, 2, 3, 4, int64(i)}, BlockSize: 16, Medium: Ptr("GPU")},
		&BlockRemoved{BlockHashes: []BlockHash{BytesHash([]byte{0xde, 0xad, byte(i)})}},
		&AllBlocksCleared{},
	}}
}
