package kvevents

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gonixl/gonixl/internal/zmtp"
)

// fakeConn is a peer whose bytes are in; what we write is counted and dropped.
type fakeConn struct {
	r       *bytes.Reader
	written int
}

func (f *fakeConn) Read(b []byte) (int, error)       { return f.r.Read(b) }
func (f *fakeConn) Write(b []byte) (int, error)      { f.written += len(b); return len(b), nil }
func (f *fakeConn) Close() error                     { return nil }
func (f *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (f *fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (f *fakeConn) SetDeadline(time.Time) error      { return nil }
func (f *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// seeds adds the pyzmq captures in testdata/ (testdata/capture.py) whose names start with prefix.
func seeds(f *testing.F, prefix string) {
	files, err := filepath.Glob(filepath.Join("testdata", prefix+"*.bin"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no %s*.bin seeds in testdata/ (run testdata/capture.py): %v", prefix, err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// fuzzPublisher is a publisher without listeners holding n buffered batches, for serving fake connections.
func fuzzPublisher(f testing.TB, format string, n int) *Publisher {
	fm, err := FormatByName(format)
	if err != nil {
		f.Fatal(err)
	}
	p := &Publisher{cfg: Config{Format: fm, Topic: "kv@", BufferSteps: 8, HWM: 4, MaxQueueBytes: 1 << 20,
		MaxSubscriptions: 4}, topic: []byte("kv@"), subs: map[*subscriber]struct{}{}, conns: map[net.Conn]bool{}}
	for i := 0; i < n; i++ {
		if _, err := p.Publish(sampleBatch(i)); err != nil {
			f.Fatal(err)
		}
	}
	return p
}

// FuzzReplayStream: any bytes from a replay peer end the connection or get answered, never a panic or a hang;
// every message is either a request (answered with the end marker) or a bad one (counted).
func FuzzReplayStream(f *testing.F) {
	seeds(f, "replay_")
	f.Add([]byte{})
	ps := []*Publisher{fuzzPublisher(f, "0.16", 12), fuzzPublisher(f, "0.33", 12)}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, p := range ps {
			p.replays.Store(0)
			fc := &fakeConn{r: bytes.NewReader(in)}
			p.serveReplay(fc)
			if p.replays.Load() > 0 && fc.written == 0 {
				t.Fatal("a request got no answer")
			}
		}
	})
}

// FuzzSubscriberStream: any bytes from a subscriber leave its subscription count within the limit, consistent
// with its topics, and its match flag right.
func FuzzSubscriberStream(f *testing.F) {
	seeds(f, "sub_")
	p := fuzzPublisher(f, "0.33", 0)
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := zmtp.Handshake(&fakeConn{r: bytes.NewReader(in)}, zmtp.Options{Type: zmtp.PUB, MaxMessageSize: maxRequestSize, MaxFrames: 4})
		if err != nil {
			return
		}
		s := &subscriber{p: p, conn: c, topics: map[string]int{}}
		_ = s.read()
		sum, match := 0, false
		for topic, n := range s.topics {
			if n <= 0 {
				t.Fatalf("topic %q counted %d", topic, n)
			}
			sum += n
			match = match || strings.HasPrefix("kv@", topic)
		}
		if sum != s.nsubs || s.nsubs > p.cfg.MaxSubscriptions || match != s.matches.Load() {
			t.Fatalf("nsubs %d, sum %d, match %v/%v", s.nsubs, sum, match, s.matches.Load())
		}
	})
}

// FuzzParseReplayRequest: the start sequence number is vLLM's int.from_bytes(frame, "big"), capped at 2^64-1.
func FuzzParseReplayRequest(f *testing.F) {
	f.Add([]byte{}, binary.BigEndian.AppendUint64(nil, 5))
	f.Add([]byte{}, []byte{})
	f.Add([]byte("x"), bytes.Repeat([]byte{0xff}, 9))
	f.Add([]byte{}, append(make([]byte, 12), 1))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		got, err := parseReplayRequest([][]byte{a, b})
		if err != nil {
			t.Fatal(err)
		}
		want := new(big.Int).SetBytes(b)
		if want.IsUint64() {
			if got != want.Uint64() {
				t.Fatalf("% x: %d, want %d", b, got, want)
			}
		} else if got != math.MaxUint64 {
			t.Fatalf("% x: %d, want the cap", b, got)
		}
		if _, err := parseReplayRequest([][]byte{a}); err == nil {
			t.Fatal("one frame accepted")
		}
	})
}

// The captured pyzmq peers (the fuzz seeds) are served as vLLM's publisher serves them.
func TestCapturedPeers(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatalf("%v (run testdata/capture.py)", err)
		}
		return b
	}
	p := fuzzPublisher(t, "0.16", 12)
	// In a fixed order (a map's would change which file's counts are read last).
	for _, c := range []struct {
		name               string
		requests, replayed uint64
	}{{"replay_dealer.bin", 2, 15}, {"replay_req.bin", 1, 8}} {
		p.replays.Store(0)
		p.replayed.Store(0)
		p.serveReplay(&fakeConn{r: bytes.NewReader(read(c.name))})
		if p.replays.Load() != c.requests || p.bad.Load() != 0 {
			t.Errorf("%s: %d requests (%d bad), want %d", c.name, p.replays.Load(), p.bad.Load(), c.requests)
		}
		if got := p.replayed.Load(); got != c.replayed {
			t.Errorf("%s: %d batches replayed, want %d of the 8 buffered", c.name, got, c.replayed)
		}
	}
	c, err := zmtp.Handshake(&fakeConn{r: bytes.NewReader(read("sub_kv.bin"))}, zmtp.Options{Type: zmtp.PUB})
	if err != nil {
		t.Fatal(err)
	}
	s := &subscriber{p: p, conn: c, topics: map[string]int{}}
	if err := s.read(); err != nil {
		t.Fatal(err)
	}
	if len(s.topics) != 1 || s.topics[""] != 1 || !s.matches.Load() {
		t.Errorf("after subscribe kv@, subscribe \"\", cancel kv@: %v, match %v", s.topics, s.matches.Load())
	}
}
