package zmtp

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// seeds adds every captured libzmq stream in testdata/ (see testdata/capture.py) and a few hand-made ones.
func seeds(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.bin"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds in testdata/ (%v)", err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(peerBytes(REQ, 0, nil, [][]byte{{}, []byte("req")}))
	f.Add(peerBytes(DEALER, 1, []byte("id"), [][]byte{{}, make([]byte, 300)}, [][]byte{[]byte("x")}))
	f.Add(append(peerBytes(REQ, 1, nil), "\x04\x0a\x04PING\x00\x0actx\x00\x05hello"...))
	f.Add(append(peerBytes(REQ, 1, nil), "\x02\x00\x00\x00\x00\x06\x40\x00\x00"...))
	f.Add(AppendGreeting(nil, 1))
	f.Add(append(peerBytes(SUB, 1, nil), "\x04\x0c\x09SUBSCRIBEkv\x04\x09\x06CANCELkv"...))
	f.Add(peerBytes(SUB, 0, nil, [][]byte{[]byte("\x01kv")}, [][]byte{{0}}))
}

// FuzzParseSubscription: a subscription frame a PUB socket reads decodes without panicking and round-trips.
func FuzzParseSubscription(f *testing.F) {
	f.Add([]byte("\x01kv"))
	f.Add([]byte("\x00"))
	f.Add([]byte("\x02"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		s, ok := ParseSubscription([][]byte{in})
		if !ok {
			if len(in) > 0 && in[0] <= 1 {
				t.Fatalf("refused % x", in)
			}
			return
		}
		if !bytes.Equal(AppendSubscription(nil, s), in) {
			t.Fatalf("round trip % x", in)
		}
	})
}

// FuzzConn: any bytes from a peer end in an error or messages within the limits, never a panic, a hang or an
// allocation beyond the limits.
func FuzzConn(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, st := range []SocketType{ROUTER, REQ, PUB} {
			c, err := Handshake(newFake(in), Options{Type: st, MaxMessageSize: 1 << 16, MaxFrames: 8})
			if err != nil {
				if c != nil {
					t.Fatal("conn with error")
				}
				continue
			}
			if !Compatible(st, c.PeerType()) {
				t.Fatalf("accepted a %s peer for %s", c.PeerType(), st)
			}
			for i := 0; i < len(in)+1; i++ {
				msg, err := c.ReadMessage()
				if err != nil {
					if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrProtocol) ||
						errors.Is(err, ErrTooLarge) || errors.Is(err, ErrPeerError) {
						break
					}
					t.Fatalf("unexpected error kind: %v", err)
				}
				if sub, ok := ParseSubscription(msg); ok && st == PUB {
					if !bytes.Equal(AppendSubscription(nil, sub), msg[0]) {
						t.Fatalf("subscription %q does not round-trip", msg[0])
					}
				}
				if len(msg) == 0 || len(msg) > 8 {
					t.Fatalf("%d frames", len(msg))
				}
				total := 0
				for _, fr := range msg {
					total += len(fr)
				}
				if total > 1<<16 {
					t.Fatalf("message of %d bytes over the limit", total)
				}
			}
		}
	})
}

// FuzzGreeting: ParseGreeting accepts only 64-byte ZMTP 3+ NULL greetings.
func FuzzGreeting(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		g, err := ParseGreeting(in)
		if err != nil {
			return
		}
		if len(in) != GreetingSize || in[0] != 0xff || g.Major < 3 || g.Mechanism != "NULL" {
			t.Fatalf("accepted % x as %+v", in, g)
		}
		if CheckSignature(in) != nil {
			t.Fatal("signature check disagrees")
		}
	})
}

// FuzzCommand: command and READY metadata decoding round-trips what it accepts.
func FuzzCommand(f *testing.F) {
	f.Add([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03REQ\x08Identity\x00\x00\x00\x00"))
	f.Add([]byte("\x04PING\x00\x0actx"))
	f.Add([]byte("\x05ERROR\x06denied"))
	f.Add([]byte("\x05READY\x0bSocket-Type\xff\xff\xff\xffREQ"))
	f.Fuzz(func(t *testing.T, in []byte) {
		cmd, err := ParseCommand(in)
		if err != nil {
			return
		}
		if got := AppendCommand(nil, cmd.Name, cmd.Data); string(got) != string(in) {
			t.Fatalf("command round trip: % x -> % x", in, got)
		}
		_ = ParseError(cmd.Data)
		md, st, id, err := ParseReady(cmd.Data)
		if err != nil {
			return
		}
		if len(id) > 255 || st == "" && len(md) == 0 {
			t.Fatalf("bad READY accepted: %q %q", st, id)
		}
		if got := AppendMetadata(nil, md); string(got) != string(cmd.Data) {
			t.Fatalf("metadata round trip: % x -> % x", cmd.Data, got)
		}
	})
}
