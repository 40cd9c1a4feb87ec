package zmtp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeConn is a net.Conn whose peer's bytes are fixed in advance; what we write is kept.
type fakeConn struct {
	r   *bytes.Reader
	mu  sync.Mutex
	out bytes.Buffer
}

func newFake(in []byte) *fakeConn { return &fakeConn{r: bytes.NewReader(in)} }

func (f *fakeConn) Read(b []byte) (int, error) { return f.r.Read(b) }
func (f *fakeConn) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.Write(b)
}
func (f *fakeConn) written() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return bytes.Clone(f.out.Bytes())
}
func (f *fakeConn) Close() error                     { return nil }
func (f *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (f *fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (f *fakeConn) SetDeadline(time.Time) error      { return nil }
func (f *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fakeConn) SetWriteDeadline(time.Time) error { return nil }

func readSeed(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err, "seed captured from pyzmq: run testdata/capture.py")
	return b
}

// peerBytes builds what a peer of type st sends: greeting, READY, then the messages.
func peerBytes(st SocketType, minor byte, identity []byte, msgs ...[][]byte) []byte {
	b := AppendGreeting(nil, minor)
	body := AppendMetadata(AppendCommand(nil, "READY", nil), Metadata{{"Socket-Type", []byte(st)}, {"Identity", identity}})
	b = AppendFrameHeader(b, flagCommand, len(body))
	b = append(b, body...)
	for _, m := range msgs {
		for i, f := range m {
			var fl byte
			if i < len(m)-1 {
				fl = flagMore
			}
			b = AppendFrameHeader(b, fl, len(f))
			b = append(b, f...)
		}
	}
	return b
}

// The bytes libzmq 4.3.5 (pyzmq 27.3) writes, captured by testdata/capture.py, decode as what was sent.
func TestCapturedLibzmq(t *testing.T) {
	req := []byte("\x93\xc4\x0cget_meta_msg\x00\x01")
	for _, tc := range []struct {
		file     string
		local    SocketType
		peer     SocketType
		identity string
		msgs     [][][]byte
	}{
		{"req_zmtp31.bin", ROUTER, REQ, "", [][][]byte{{{}, req}}},
		{"req_to_zmtp30.bin", ROUTER, REQ, "", [][][]byte{{{}, req}}},
		{"dealer_multiframe.bin", ROUTER, DEALER, "dealer-1", [][][]byte{{[]byte("a"), {}, bytes.Repeat([]byte("x"), 300)}}},
		{"heartbeat_req.bin", ROUTER, REQ, "", nil},
		{"router_reply_h4.bin", REQ, ROUTER, "", [][][]byte{{{}, bytes.Repeat([]byte("\x81\xa1k\xa1v"), 100), []byte("\xcb\x40\x29\x00\x00\x00\x00\x00\x00")}}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			fc := newFake(readSeed(t, tc.file))
			c, err := Handshake(fc, Options{Type: tc.local})
			require.NoError(t, err)
			assert.Equal(t, Greeting{Major: 3, Minor: 1, Mechanism: "NULL"}, c.PeerGreeting(), "libzmq 4.3 speaks ZMTP 3.1")
			assert.Equal(t, tc.peer, c.PeerType())
			assert.Equal(t, tc.identity, string(c.PeerIdentity()))
			for _, want := range tc.msgs {
				got, err := c.ReadMessage()
				require.NoError(t, err)
				require.Len(t, got, len(want))
				for i := range want {
					assert.Equal(t, want[i], got[i], "frame %d", i)
				}
			}
			_, err = c.ReadMessage()
			require.ErrorIs(t, err, io.EOF)
			out := fc.written()
			if tc.file == "heartbeat_req.bin" {
				// Each of libzmq's PINGs (TTL, no context) was answered with a PONG.
				pongs := bytes.Count(out, []byte("\x04\x05\x04PONG"))
				pings := bytes.Count(readSeed(t, tc.file), []byte("\x04PING"))
				assert.Positive(t, pings)
				assert.Equal(t, pings, pongs)
			}
		})
	}
}

func TestGreeting(t *testing.T) {
	g := AppendGreeting(nil, Minor31)
	require.Len(t, g, GreetingSize)
	got, err := ParseGreeting(g)
	require.NoError(t, err)
	assert.Equal(t, Greeting{Major: 3, Minor: 1, Mechanism: "NULL"}, got)
	// A later major version is accepted (the RFC: answer as 3.x).
	g4 := bytes.Clone(g)
	g4[10] = 4
	_, err = ParseGreeting(g4)
	require.NoError(t, err)

	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(g)
		f(b)
		return b
	}
	for name, b := range map[string][]byte{
		"short":        g[:63],
		"no ff":        mutate(func(b []byte) { b[0] = 'G' }),
		"zmtp 1.0":     mutate(func(b []byte) { b[9] = 0x7e }),
		"zmtp 2.0":     mutate(func(b []byte) { b[10] = 1 }),
		"plain":        mutate(func(b []byte) { copy(b[12:32], "PLAIN\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00") }),
		"curve":        mutate(func(b []byte) { copy(b[12:], "CURVE") }),
		"bad padding":  mutate(func(b []byte) { b[20] = 'x' }),
		"no zero":      mutate(func(b []byte) { copy(b[12:32], strings.Repeat("N", 20)) }),
		"http request": []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat(" ", 64))[:64],
	} {
		_, err := ParseGreeting(b)
		assert.ErrorIs(t, err, ErrProtocol, name)
	}
}

func TestCompatible(t *testing.T) {
	ok := map[SocketType][]SocketType{REQ: {REP, ROUTER}, REP: {REQ, DEALER}, DEALER: {REP, DEALER, ROUTER}, ROUTER: {REQ, DEALER, ROUTER},
		PUB: {SUB, XSUB}, XPUB: {SUB, XSUB}, SUB: {PUB, XPUB}, XSUB: {PUB, XPUB}}
	all := []SocketType{REQ, REP, DEALER, ROUTER, PUB, SUB, "PAIR", "PUSH", "PULL", XPUB, XSUB, ""}
	for _, local := range all {
		for _, peer := range all {
			want := false
			for _, p := range ok[local] {
				want = want || p == peer
			}
			assert.Equal(t, want, Compatible(local, peer), "%s-%s", local, peer)
		}
	}
}

func TestHandshakeRefusals(t *testing.T) {
	ready := func(props Metadata) []byte {
		body := AppendMetadata(AppendCommand(nil, "READY", nil), props)
		return append(AppendFrameHeader(AppendGreeting(nil, 1), flagCommand, len(body)), body...)
	}
	cmd := func(name string, data []byte) []byte {
		body := AppendCommand(nil, name, data)
		return append(AppendFrameHeader(AppendGreeting(nil, 1), flagCommand, len(body)), body...)
	}
	g := AppendGreeting(nil, 1)
	for name, tc := range map[string]struct {
		in   []byte
		want error
	}{
		"pub peer":        {ready(Metadata{{"Socket-Type", []byte("PUB")}}), ErrIncompatible},
		"rep peer":        {ready(Metadata{{"Socket-Type", []byte("REP")}}), ErrIncompatible},
		"no socket type":  {ready(Metadata{{"Identity", nil}}), ErrProtocol},
		"bad prop name":   {ready(Metadata{{"Socket Type", []byte("REQ")}}), ErrProtocol},
		"error command":   {cmd("ERROR", []byte("\x06denied")), ErrPeerError},
		"other command":   {cmd("HELLO", nil), ErrProtocol},
		"message first":   {append(bytes.Clone(g), 0x00, 0x01, 'x'), ErrProtocol},
		"huge ready":      {append(bytes.Clone(g), 0x06, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff), ErrTooLarge},
		"reserved flags":  {append(bytes.Clone(g), 0x84, 0x01, 0x00), ErrProtocol},
		"long identity":   {ready(Metadata{{"Socket-Type", []byte("REQ")}, {"Identity", bytes.Repeat([]byte("i"), 256)}}), ErrProtocol},
		"truncated props": {append(AppendFrameHeader(bytes.Clone(g), flagCommand, 11), "\x05READY\x0bSock"...), ErrProtocol},
		"garbage":         {[]byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), ErrProtocol},
		"truncated":       {g[:30], io.ErrUnexpectedEOF},
		"empty":           {nil, io.EOF},
	} {
		_, err := Handshake(newFake(tc.in), Options{Type: ROUTER})
		assert.ErrorIs(t, err, tc.want, "%s: %v", name, err)
	}
	// Case-insensitive property names (the RFC), as libzmq writes them or not.
	c, err := Handshake(newFake(ready(Metadata{{"socket-type", []byte("REQ")}})), Options{Type: ROUTER})
	require.NoError(t, err)
	assert.Equal(t, REQ, c.PeerType())
}

func TestReadMessageLimits(t *testing.T) {
	open := func(after []byte, opts Options) *Conn {
		opts.Type = ROUTER
		c, err := Handshake(newFake(append(peerBytes(REQ, 1, nil), after...)), opts)
		require.NoError(t, err)
		return c
	}
	long := func(flags byte, n uint64) []byte {
		return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, n)
	}
	// A 100 MB claim (and a 2^63 one) is refused from the header alone: nothing is allocated for it.
	for _, n := range []uint64{100 << 20, 1 << 63, 1<<64 - 1} {
		c := open(long(0, n), Options{MaxMessageSize: 4096})
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := c.ReadMessage()
		runtime.ReadMemStats(&after)
		require.ErrorIs(t, err, ErrTooLarge)
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "allocated for a %d-byte claim", n)
	}
	// Under the limit but never sent: at most readChunk is allocated ahead of the bytes received.
	c := open(append(long(0, 60<<20), "only this"...), Options{})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := c.ReadMessage()
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20))

	// The total of a message's frames counts, and the number of frames.
	_, err = open([]byte("\x01\x03abc\x01\x03abc\x00\x03abc"), Options{MaxMessageSize: 8}).ReadMessage()
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = open(bytes.Repeat([]byte("\x01\x00"), 100), Options{MaxFrames: 16}).ReadMessage()
	require.ErrorIs(t, err, ErrTooLarge)

	for name, tc := range map[string]struct {
		in   []byte
		want error
	}{
		"truncated body":      {[]byte("\x00\x10abc"), io.ErrUnexpectedEOF},
		"truncated size":      {[]byte("\x02\x00\x00"), io.ErrUnexpectedEOF},
		"truncated message":   {[]byte("\x01\x01a"), io.ErrUnexpectedEOF},
		"no size":             {[]byte("\x00"), io.ErrUnexpectedEOF},
		"reserved bits":       {[]byte("\x10\x00"), ErrProtocol},
		"command in message":  {[]byte("\x01\x01a\x04\x06\x04PING"), ErrProtocol},
		"command with more":   {[]byte("\x05\x06\x04PING"), ErrProtocol},
		"huge command":        {long(flagCommand, 1<<20), ErrTooLarge},
		"second ready":        {[]byte("\x04\x06\x05READY"), ErrProtocol},
		"error":               {[]byte("\x04\x09\x05ERROR\x02no"), ErrPeerError},
		"empty command":       {[]byte("\x04\x00"), ErrProtocol},
		"bad command name":    {[]byte("\x04\x03\x05ab"), ErrProtocol},
		"ping without ttl":    {[]byte("\x04\x05\x04PING"), ErrProtocol},
		"ping big context":    {append([]byte("\x04\x1a\x04PING\x00\x01"), bytes.Repeat([]byte("c"), 19)...), ErrProtocol},
		"clean end":           {nil, io.EOF},
		"unknown then end":    {[]byte("\x04\x07\x05HELLOx"), io.EOF},
		"subscribe then end":  {[]byte("\x04\x0a\x09SUBSCRIBE"), io.EOF},
		"pong then end":       {[]byte("\x04\x05\x04PONG"), io.EOF},
		"long small then end": {append(long(0, 1), 'x'), nil},
	} {
		msg, err := open(tc.in, Options{}).ReadMessage()
		if tc.want == nil {
			require.NoError(t, err, name)
			assert.Equal(t, [][]byte{[]byte("x")}, msg, name)
			continue
		}
		assert.ErrorIs(t, err, tc.want, "%s: %v", name, err)
	}
}

func TestPingPong(t *testing.T) {
	fc := newFake(append(peerBytes(DEALER, 1, []byte("d")), "\x04\x0a\x04PING\x00\x0actx\x00\x05hello"...))
	c, err := Handshake(fc, Options{Type: ROUTER})
	require.NoError(t, err)
	msg, err := c.ReadMessage()
	require.NoError(t, err)
	assert.Equal(t, [][]byte{[]byte("hello")}, msg)
	assert.True(t, bytes.HasSuffix(fc.written(), []byte("\x04\x08\x04PONGctx")), "% x", fc.written())
}

// Our side of the handshake, byte for byte: greeting then READY with Socket-Type and Identity (REQ), or
// Socket-Type only (REP).
func TestWeWrite(t *testing.T) {
	fc := newFake(peerBytes(ROUTER, 0, nil))
	c, err := Handshake(fc, Options{Type: REQ, ZMTP30: true})
	require.NoError(t, err)
	assert.Equal(t, byte(0), c.PeerGreeting().Minor)
	require.NoError(t, c.WriteMessage([][]byte{{}, bytes.Repeat([]byte("y"), 300)}))
	out := fc.written()
	want := AppendGreeting(nil, 0)
	want = append(want, "\x04\x26\x05READY\x0bSocket-Type\x00\x00\x00\x03REQ\x08Identity\x00\x00\x00\x00"...)
	want = append(want, "\x01\x00\x02\x00\x00\x00\x00\x00\x00\x01\x2c"...)
	want = append(want, bytes.Repeat([]byte("y"), 300)...)
	assert.Equal(t, want, out)
	assert.Equal(t, []byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0}, out[:12])

	fc = newFake(peerBytes(REQ, 1, nil))
	_, err = Handshake(fc, Options{Type: REP})
	require.NoError(t, err)
	assert.Equal(t, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03REP", string(fc.written()[GreetingSize:]))

	require.Error(t, c.WriteMessage(nil))
	_, err = Handshake(newFake(nil), Options{Type: "PUB"})
	require.Error(t, err)
	_, err = Handshake(newFake(nil), Options{Type: REQ, Identity: make([]byte, 256)})
	require.Error(t, err)
}

// Two of our own ends over a real TCP connection, both ways, with a multi-frame message of several MB.
func TestLoopback(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16)
	errc := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer nc.Close()
		c, err := Handshake(nc, Options{Type: ROUTER, HandshakeTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
		if err != nil {
			errc <- err
			return
		}
		msg, err := c.ReadMessage()
		if err != nil {
			errc <- err
			return
		}
		if len(msg) != 2 || len(msg[0]) != 0 {
			errc <- errors.New("not a REQ envelope")
			return
		}
		errc <- c.WriteMessage([][]byte{{}, big, []byte("clock")})
	}()
	nc, err := net.Dial("tcp4", ln.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(30*time.Second)))
	c, err := Handshake(nc, Options{Type: REQ})
	require.NoError(t, err)
	assert.Equal(t, ROUTER, c.PeerType())
	require.NoError(t, c.WriteMessage([][]byte{{}, []byte("req")}))
	rep, err := c.ReadMessage()
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Len(t, rep, 3)
	assert.True(t, bytes.Equal(big, rep[1]))
	assert.Equal(t, "clock", string(rep[2]))
}

func TestParsers(t *testing.T) {
	md := Metadata{{"Socket-Type", []byte("DEALER")}, {"Identity", []byte("id")}, {"X-Custom", nil}}
	got, err := ParseMetadata(AppendMetadata(nil, md))
	require.NoError(t, err)
	assert.Equal(t, "DEALER", string(must(got.Get("socket-TYPE"))))
	_, ok := got.Get("nope")
	assert.False(t, ok)
	for _, b := range [][]byte{{0}, {3, 'a'}, {1, 'a', 0, 0, 0, 5, 'x'}, {1, 'a', 0xff, 0xff, 0xff, 0xff}} {
		_, err := ParseMetadata(b)
		assert.ErrorIs(t, err, ErrProtocol, "% x", b)
	}
	assert.Equal(t, "no", ParseError([]byte("\x02no")))
	assert.Equal(t, "n", ParseError([]byte("\x05n")))
	assert.Equal(t, "", ParseError(nil))
	assert.Equal(t, "a?b", ParseError([]byte("\x03a\x00b")))
}

func must(b []byte, ok bool) []byte {
	if !ok {
		panic("missing")
	}
	return b
}

// What a pyzmq SUB sends (testdata/capture.py): SUBSCRIBE/CANCEL commands to a ZMTP 3.1 PUB, 3.0 subscription
// messages to a 3.0 one; a PUB socket reads both as the same subscriptions, other socket types never see them.
func TestSubscriptionsCaptured(t *testing.T) {
	want := []Subscription{{true, []byte("kv")}, {true, []byte{}}, {false, []byte("kv")}}
	for _, name := range []string{"sub_zmtp31.bin", "sub_to_zmtp30.bin"} {
		c, err := Handshake(newFake(readSeed(t, name)), Options{Type: PUB})
		require.NoError(t, err, name)
		assert.Equal(t, SUB, c.PeerType())
		var got []Subscription
		for {
			msg, err := c.ReadMessage()
			if err != nil {
				require.ErrorIs(t, err, io.EOF, name)
				break
			}
			s, ok := ParseSubscription(msg)
			require.True(t, ok, "%s: %q is not a subscription", name, msg)
			got = append(got, s)
		}
		assert.Equal(t, want, got, name)
	}
	// A ROUTER ignores SUBSCRIBE commands (they are not messages).
	in := append(peerBytes(DEALER, 1, nil), "\x04\x0c\x09SUBSCRIBEkv"...)
	c, err := Handshake(newFake(in), Options{Type: ROUTER})
	require.NoError(t, err)
	_, err = c.ReadMessage()
	require.ErrorIs(t, err, io.EOF)
}

func TestParseSubscription(t *testing.T) {
	for _, tc := range []struct {
		msg  [][]byte
		want Subscription
		ok   bool
	}{
		{[][]byte{{1}}, Subscription{true, []byte{}}, true},
		{[][]byte{[]byte("\x00abc")}, Subscription{false, []byte("abc")}, true},
		{[][]byte{[]byte("\x02abc")}, Subscription{}, false},
		{[][]byte{{}}, Subscription{}, false},
		{[][]byte{{1}, {2}}, Subscription{}, false},
		{nil, Subscription{}, false},
	} {
		s, ok := ParseSubscription(tc.msg)
		assert.Equal(t, tc.ok, ok, "%q", tc.msg)
		assert.Equal(t, tc.want, s, "%q", tc.msg)
		if ok {
			assert.Equal(t, tc.msg[0], AppendSubscription(nil, s))
		}
	}
}
