package kvevents

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/zmtp"
)

// Subscribers get [topic, seq, payload] with sequence numbers from 0 up, only for matching subscriptions;
// a CANCEL stops them.
func TestPublishLive(t *testing.T) {
	ctx := ctxT(t)
	f := mustFormat(t, "0.33")
	p := startPublisher(t, Config{Format: f, Topic: "kv@w1", DataParallelRank: 2})
	all := subscribe(t, ctx, p, "")
	pre := subscribe(t, ctx, p, "kv@")
	_ = subscribe(t, ctx, p, "other") // never matches: gets nothing (its reads would block)

	for i := 0; i < 5; i++ {
		seq, err := p.Publish(sampleBatch(i))
		require.NoError(t, err)
		assert.Equal(t, uint64(i), seq)
	}
	for _, c := range []*zmtp.Conn{all, pre} {
		for i := 0; i < 5; i++ {
			topic, seq, payload := recvPub(t, c)
			assert.Equal(t, "kv@w1", topic)
			assert.Equal(t, uint64(i), seq)
			b := sampleBatch(i)
			b.DataParallelRank = Ptr(int64(2))
			want, err := f.EncodeBatch(b)
			require.NoError(t, err)
			assert.Equal(t, want, payload)
		}
	}
	// CANCEL: the "" subscriber stops receiving; the other keeps going.
	require.NoError(t, all.WriteMessage([][]byte{zmtp.AppendSubscription(nil, zmtp.Subscription{Topic: []byte("")})}))
	require.NoError(t, slow.Until(ctx, func() bool { return matched(p) == 1 }))
	_, err := p.Publish(sampleBatch(5))
	require.NoError(t, err)
	_, seq, _ := recvPub(t, pre)
	assert.Equal(t, uint64(5), seq)
	st := p.Stats()
	assert.Equal(t, uint64(6), st.Published)
	assert.Equal(t, 3, st.Subscribers)
	assert.Zero(t, st.Dropped)
}

// A subscriber whose queue is full misses messages (counted) and gets them back through replay, framed as the
// format says; a late subscriber replays what was published before it came.
func TestReplayRecovers(t *testing.T) {
	for _, name := range []string{"0.16", "0.33"} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			f := mustFormat(t, name)
			p := startPublisher(t, Config{Format: f, Topic: "t", HWM: 100, BufferSteps: 100})
			for i := 0; i < 3; i++ { // before anyone subscribed
				_, err := p.Publish(sampleBatch(i))
				require.NoError(t, err)
			}
			sub := subscribe(t, ctx, p, "t")
			// A subscriber that never writes (no connection), 2 short of its HWM: it takes 2 and misses 5.
			stuck := &subscriber{p: p, notify: make(chan struct{}, 1), queue: make([]entry, 98)}
			stuck.matches.Store(true)
			p.mu.Lock()
			p.subs[stuck] = struct{}{}
			p.mu.Unlock()
			for i := 3; i < 10; i++ {
				_, err := p.Publish(sampleBatch(i))
				require.NoError(t, err)
			}
			p.mu.Lock()
			delete(p.subs, stuck)
			p.mu.Unlock()
			assert.Len(t, stuck.queue, 100)
			got := map[uint64][]byte{}
			for len(got) < 7 {
				_, seq, payload := recvPub(t, sub)
				got[seq] = payload
			}
			st := p.Stats()
			assert.Equal(t, uint64(10), st.Published)
			assert.Equal(t, uint64(5), st.Dropped, "7 published to a queue with room for 2")

			d := dial(t, ctx, p.ReplayAddr(), zmtp.DEALER)
			msgs := requestReplay(t, d, 0)
			require.Len(t, msgs, 11)
			for i, m := range msgs[:10] {
				b := sampleBatch(i)
				b.DataParallelRank = Ptr(int64(0)) // the publisher's rank
				want, err := f.EncodeBatch(b)
				require.NoError(t, err)
				wantSeq := binary.BigEndian.AppendUint64(nil, uint64(i))
				if f.ReplayTopic {
					assert.Equal(t, [][]byte{{}, []byte("t"), wantSeq, want}, m)
				} else {
					assert.Equal(t, [][]byte{{}, wantSeq, want}, m)
				}
				if live, ok := got[uint64(i)]; ok {
					assert.Equal(t, want, live)
				}
			}
			if f.ReplayTopic {
				assert.Equal(t, [][]byte{{}, {}, endSeq, {}}, msgs[10])
			} else {
				assert.Equal(t, [][]byte{{}, endSeq, {}}, msgs[10])
			}
			assert.Len(t, requestReplay(t, d, 8), 3)
			assert.Len(t, requestReplay(t, d, 1<<40), 1, "past the last: only the end marker")
			// A malformed request is ignored (vLLM logs and drops it); the connection keeps working.
			require.NoError(t, d.WriteMessage([][]byte{{1, 2, 3}}))
			assert.Len(t, requestReplay(t, d, 9), 2)
			st = p.Stats()
			assert.Equal(t, uint64(4), st.ReplayRequests)
			assert.Equal(t, uint64(1), st.BadRequests)
			assert.Equal(t, uint64(10+2+1), st.Replayed)
		})
	}
}

// The replay buffer keeps the last BufferSteps batches.
func TestReplayBufferBounded(t *testing.T) {
	ctx := ctxT(t)
	p := startPublisher(t, Config{Format: mustFormat(t, "0.16"), BufferSteps: 4})
	for i := 0; i < 10; i++ {
		_, err := p.Publish(sampleBatch(i))
		require.NoError(t, err)
	}
	msgs := requestReplay(t, dial(t, ctx, p.ReplayAddr(), zmtp.REQ), 0)
	require.Len(t, msgs, 5)
	for i, m := range msgs[:4] {
		assert.Equal(t, uint64(6+i), binary.BigEndian.Uint64(m[1]))
	}
	assert.Len(t, p.ring, 4)
}

// Limits: subscribers past MaxSubscribers and peers that are not ZMTP are closed and counted; a subscriber
// that subscribes past MaxSubscriptions is dropped.
func TestLimits(t *testing.T) {
	ctx := ctxT(t)
	p := startPublisher(t, Config{Format: mustFormat(t, "0.16"), MaxSubscribers: 1, MaxSubscriptions: 2, Topic: "x"})
	c := subscribe(t, ctx, p, "x")
	nc, err := net.Dial("tcp", p.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = nc.Read(make([]byte, 1))
	assert.Error(t, err, "second subscriber closed")
	for _, topic := range []string{"a", "b", "c"} {
		require.NoError(t, c.WriteMessage([][]byte{zmtp.AppendSubscription(nil, zmtp.Subscription{Subscribe: true, Topic: []byte(topic)})}))
	}
	_, err = c.ReadMessage()
	assert.Error(t, err, "dropped after a third subscription")
	require.NoError(t, slow.Until(ctx, func() bool { return p.Stats().Subscribers == 0 }))
	assert.Equal(t, uint64(2), p.Stats().RefusedPeers)

	// Not ZMTP at all.
	nc2, err := net.Dial("tcp", p.ReplayAddr().String())
	require.NoError(t, err)
	defer nc2.Close()
	_, _ = nc2.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, slow.Until(ctx, func() bool { return p.Stats().RefusedPeers == 3 }))
}

func TestCloseAndConfig(t *testing.T) {
	_, err := New(Config{})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(Config{Format: mustFormat(t, "0.16"), HWM: -1})
	assert.ErrorIs(t, err, ErrInvalid)
	p, err := New(Config{Format: mustFormat(t, "0.16"), Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	assert.Nil(t, p.ReplayAddr())
	ctx := ctxT(t)
	c := subscribe(t, ctx, p, "")
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	_, err = p.Publish(sampleBatch(0))
	assert.ErrorIs(t, err, ErrClosed)
	_, err = c.ReadMessage()
	assert.Error(t, err)
	_, err = p.Publish(Batch{Events: []Event{&BlockStored{}}})
	assert.ErrorIs(t, err, ErrInvalid)
}

// A subscriber that never reads cannot block Publish: its queue fills to MaxQueueBytes and further messages are
// dropped for it (until its write timeout disconnects it); a reading subscriber gets messages in order.
func TestSlowSubscriberNeverBlocks(t *testing.T) {
	ctx := ctxT(t)
	p := startPublisher(t, Config{Format: mustFormat(t, "0.33"), MaxQueueBytes: 256 << 10, WriteTimeout: time.Second})
	_ = subscribe(t, ctx, p, "") // never reads
	fast := subscribe(t, ctx, p, "")
	big := sampleBatch(0)
	big.Events[0].(*BlockStored).TokenIDs = make([]int64, 16<<10) // ~16 KiB per batch
	const n = 2000                                                // ~32 MiB in all: far past the socket buffers
	got := make(chan uint64, n)
	go func() {
		defer close(got)
		for {
			msg, err := fast.ReadMessage()
			if err != nil {
				return // the publisher closed
			}
			got <- binary.BigEndian.Uint64(msg[1])
		}
	}()
	start := time.Now()
	for i := 0; i < n; i++ {
		_, err := p.Publish(big)
		require.NoError(t, err)
	}
	elapsed := time.Since(start)
	st := p.Stats()
	require.NoError(t, p.Close())
	count, last := 0, int64(-1)
	for seq := range got {
		require.Greater(t, int64(seq), last, "out of order")
		last, count = int64(seq), count+1
	}
	t.Logf("%d batches published in %v; the reader got %d (last %d); %d dropped", n, elapsed, count, last, st.Dropped)
	assert.Positive(t, count)
	// Once the socket buffers are full the stuck subscriber's queue holds 16 batches at most; past its write
	// timeout it is disconnected.
	assert.Positive(t, st.Dropped, "the stuck subscriber missed nothing")
	assert.Equal(t, uint64(n), st.Published)
}

// Concurrent publishers, subscribers coming and going, replays and Close: no race, no leak (goleak), no
// deadlock.
func TestConcurrentClose(t *testing.T) {
	ctx := ctxT(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p, err := New(Config{Format: mustFormat(t, "0.16"), Listener: l, ReplayListener: rl, BufferSteps: 50, HWM: 10})
	require.NoError(t, err)
	done := make(chan struct{})
	var workers []chan struct{}
	for w := 0; w < 4; w++ {
		fin := make(chan struct{})
		workers = append(workers, fin)
		go func() {
			defer close(fin)
			for i := 0; ; i++ {
				if _, err := p.Publish(sampleBatch(i)); err != nil {
					return // ErrClosed
				}
				select {
				case <-done:
					return
				default:
				}
			}
		}()
	}
	for i := 0; i < 3; i++ {
		c := dial(t, ctx, p.Addr(), zmtp.SUB)
		require.NoError(t, c.WriteMessage([][]byte{{1}})) // subscribe to everything
		_, _, _ = recvPub(t, c)
		d := dial(t, ctx, p.ReplayAddr(), zmtp.DEALER)
		require.NoError(t, d.WriteMessage([][]byte{{}, make([]byte, 8)}))
		require.NoError(t, c.Close())
	}
	require.NoError(t, p.Close())
	close(done)
	for _, fin := range workers {
		<-fin
	}
	_, err = p.Publish(sampleBatch(0))
	assert.ErrorIs(t, err, ErrClosed)
}

// TestCloseLingers: batches published just before Close still reach a subscriber that reads (Config.Linger),
// and a subscriber that does not read delays Close by Linger at most.
func TestCloseLingers(t *testing.T) {
	ctx := ctxT(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p, err := New(Config{Format: mustFormat(t, "0.33"), Listener: l, Linger: 2 * time.Second})
	require.NoError(t, err)
	reader := subscribe(t, ctx, p, "")
	stalled := subscribe(t, ctx, p, "") // never reads: its queue stays pending once its socket is full
	_ = stalled
	const n = 50
	big := sampleBatch(0)
	ids := make([]int64, 64<<10) // 9 bytes each in msgpack: about 576 KiB a batch, 28 MiB in all, more than
	for i := range ids {         // loopback's socket buffers hold
		ids[i] = 1 << 40
	}
	big.Events[0].(*BlockStored).TokenIDs = ids
	for i := 0; i < n; i++ {
		_, err := p.Publish(big)
		require.NoError(t, err)
	}
	got := make(chan int, 1)
	go func() {
		k := 0
		for ; k < n; k++ {
			if _, err := reader.ReadMessage(); err != nil {
				break
			}
		}
		got <- k
	}()
	start := time.Now()
	require.NoError(t, p.Close())
	took := time.Since(start)
	require.Equal(t, n, <-got, "every batch queued before Close reached the reading subscriber")
	require.Less(t, took, 10*time.Second, "Close waits for the stalled subscriber only as long as Linger")
	require.GreaterOrEqual(t, took, 2*time.Second, "the stalled subscriber's queue kept Close lingering")
}
