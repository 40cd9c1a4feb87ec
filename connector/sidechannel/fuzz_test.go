package sidechannel

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// FuzzServerStream writes arbitrary bytes to a live Server as one peer's whole stream: the server never
// panics, answers or closes within its deadlines, and keeps serving. Seeds: testdata/ (what pyzmq's REQ and
// DEALER sockets wrote, captured by internal/zmtp/testdata/capture.py) and hand-made streams.
func FuzzServerStream(f *testing.F) {
	p, err := protocol.ProfileByName("0.33")
	if err != nil {
		f.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "*.bin"))
	if len(files) == 0 {
		f.Fatal("no seeds in testdata/")
	}
	for _, fn := range files {
		b, err := os.ReadFile(fn)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	req, _ := p.EncodeRequest(protocol.Rank{})
	stream := readyBytes("REQ")
	for _, body := range [][]byte{req, []byte("garbage"), {}} {
		stream = zmtp.AppendFrameHeader(stream, 0x01, 0)
		stream = zmtp.AppendFrameHeader(stream, 0x00, len(body))
		stream = append(stream, body...)
	}
	f.Add(stream)
	f.Add(append(readyBytes("DEALER"), "\x04\x0a\x04PING\x00\x0actx\x00\x05hello"...))

	payload, err := p.EncodeHandshake("h", testMeta("e", 0))
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(context.Background(), p, ServerConfig{
		Payloads:         map[protocol.Rank][]byte{{}: payload},
		RequestRate:      -1,
		HandshakeTimeout: 2 * time.Second, IdleTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := nc.Write(in); err != nil {
			return // closed by the server already
		}
		_ = nc.(*net.TCPConn).CloseWrite()
		buf := make([]byte, 64<<10)
		for {
			if _, err := nc.Read(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("the server neither answered nor closed the connection")
				}
				break
			}
		}
		select {
		case <-srv.Done():
			t.Fatal("the server stopped")
		default:
		}
	})
}
