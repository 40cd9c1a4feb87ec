package zmtp

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// Limits with no option.
const (
	// maxHandshakeCommand bounds the peer's READY (or ERROR) command.
	maxHandshakeCommand = 8 << 10
	// maxCommand bounds a command after the handshake (PING is at most 1+4+2+16 bytes).
	maxCommand = 1 << 10
	// readChunk is how much a frame body is allocated ahead of the bytes actually received.
	readChunk = 1 << 20
)

// Options configure one side of a connection.
type Options struct {
	// Type is our socket type, sent as Socket-Type and checked against the peer's.
	Type SocketType
	// Identity is sent as the Identity property (REQ, DEALER and ROUTER send one, maybe empty, as libzmq does).
	Identity []byte
	// ZMTP30 announces version 3.0 instead of 3.1 (for tests against libzmq's 3.0 code path).
	ZMTP30 bool
	// MaxMessageSize bounds the bytes of all frames of one message; 64 MiB when 0 (libzmq's ZMQ_MAXMSGSIZE: the
	// connection is dropped). A frame claiming more is refused before anything is allocated for it.
	MaxMessageSize int64
	// MaxFrames bounds the frames of one message; 16 when 0.
	MaxFrames int
	// HandshakeTimeout bounds the greeting and READY exchange; none when 0 (the caller's deadline holds).
	HandshakeTimeout time.Duration
	// WriteTimeout bounds each write (a message, or a PONG); none when 0.
	WriteTimeout time.Duration
	// ReadBufferSize is the buffered reader's size; 4096 when 0.
	ReadBufferSize int
}

// Conn is one ZMTP connection after a successful handshake. ReadMessage must be called from one goroutine at a
// time; WriteMessage is safe for concurrent use (and with ReadMessage, which may answer a PING).
type Conn struct {
	nc   net.Conn
	r    *bufio.Reader
	opts Options

	peer         Greeting
	peerType     SocketType
	peerIdentity []byte

	wmu sync.Mutex
}

// Handshake exchanges greetings and READY commands over nc (NULL mechanism) and checks the peer's socket
// type. On error the caller closes nc.
func Handshake(nc net.Conn, opts Options) (*Conn, error) {
	if opts.MaxMessageSize <= 0 {
		opts.MaxMessageSize = 64 << 20
	}
	if opts.MaxFrames <= 0 {
		opts.MaxFrames = 16
	}
	if opts.ReadBufferSize <= 0 {
		opts.ReadBufferSize = 4096
	}
	switch opts.Type {
	case REQ, REP, DEALER, ROUTER, PUB, SUB, XPUB, XSUB:
	default:
		return nil, fmt.Errorf("zmtp: socket type %q is not supported here", opts.Type)
	}
	if len(opts.Identity) > 255 {
		return nil, fmt.Errorf("zmtp: identity of %d bytes (at most 255)", len(opts.Identity))
	}
	c := &Conn{nc: nc, r: bufio.NewReaderSize(nc, opts.ReadBufferSize), opts: opts}
	if opts.HandshakeTimeout > 0 {
		if err := nc.SetDeadline(time.Now().Add(opts.HandshakeTimeout)); err != nil {
			return nil, err
		}
	}
	if err := c.handshake(); err != nil {
		return nil, err
	}
	if opts.HandshakeTimeout > 0 {
		if err := nc.SetDeadline(time.Time{}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Conn) handshake() error {
	minor := byte(Minor31)
	if c.opts.ZMTP30 {
		minor = Minor30
	}
	if _, err := c.nc.Write(AppendGreeting(nil, minor)); err != nil {
		return fmt.Errorf("zmtp: send greeting: %w", err)
	}
	// Read the greeting in the steps a peer sends it, refusing a non-ZMTP peer as early as possible.
	var g [GreetingSize]byte
	if _, err := io.ReadFull(c.r, g[:1]); err != nil {
		return fmt.Errorf("zmtp: read greeting: %w", err)
	}
	if g[0] != 0xff {
		return fmt.Errorf("%w: no ZMTP signature (first byte %#02x): the peer is not a ZeroMQ socket", ErrProtocol, g[0])
	}
	if _, err := io.ReadFull(c.r, g[1:11]); err != nil {
		return fmt.Errorf("zmtp: read greeting: %w", err)
	}
	if err := CheckSignature(g[:11]); err != nil {
		return err
	}
	if _, err := io.ReadFull(c.r, g[11:]); err != nil {
		return fmt.Errorf("zmtp: read greeting: %w", err)
	}
	peer, err := ParseGreeting(g[:])
	if err != nil {
		return err
	}
	c.peer = peer

	md := Metadata{{Name: "Socket-Type", Value: []byte(c.opts.Type)}}
	if c.opts.Type == REQ || c.opts.Type == DEALER || c.opts.Type == ROUTER {
		md = append(md, Property{Name: "Identity", Value: c.opts.Identity})
	}
	body := AppendMetadata(AppendCommand(nil, "READY", nil), md)
	if err := c.writeFrames(flagCommand, [][]byte{body}); err != nil {
		return fmt.Errorf("zmtp: send READY: %w", err)
	}

	flags, size, err := c.readHeader()
	if err != nil {
		return fmt.Errorf("zmtp: read READY: %w", err)
	}
	if flags&flagCommand == 0 || flags&flagMore != 0 {
		return fmt.Errorf("%w: the peer sent a message before its READY command", ErrProtocol)
	}
	if size > maxHandshakeCommand {
		return fmt.Errorf("%w: handshake command of %d bytes (at most %d)", ErrTooLarge, size, maxHandshakeCommand)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(c.r, buf); err != nil {
		return fmt.Errorf("zmtp: read READY: %w", err)
	}
	cmd, err := ParseCommand(buf)
	if err != nil {
		return err
	}
	switch cmd.Name {
	case "READY":
	case "ERROR":
		return fmt.Errorf("%w: %q", ErrPeerError, ParseError(cmd.Data))
	default:
		return fmt.Errorf("%w: the peer sent %q instead of READY", ErrProtocol, printable(cmd.Name))
	}
	_, st, id, err := ParseReady(cmd.Data)
	if err != nil {
		return err
	}
	if !Compatible(c.opts.Type, st) {
		return fmt.Errorf("%w: a %s socket cannot talk to a %s peer", ErrIncompatible, c.opts.Type, st)
	}
	c.peerType, c.peerIdentity = st, slices.Clone(id)
	return nil
}

// PeerGreeting returns the peer's greeting (its ZMTP version).
func (c *Conn) PeerGreeting() Greeting { return c.peer }

// PeerType returns the peer's socket type.
func (c *Conn) PeerType() SocketType { return c.peerType }

// PeerIdentity returns the Identity the peer sent (often empty).
func (c *Conn) PeerIdentity() []byte { return c.peerIdentity }

// NetConn returns the underlying connection (for deadlines and addresses).
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the underlying connection.
func (c *Conn) Close() error { return c.nc.Close() }

// readHeader reads a frame's flags and size.
func (c *Conn) readHeader() (byte, uint64, error) {
	flags, err := c.r.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	if flags&flagReserved != 0 {
		return 0, 0, fmt.Errorf("%w: reserved frame flag bits set (%#02x)", ErrProtocol, flags)
	}
	if flags&flagLong == 0 {
		n, err := c.r.ReadByte()
		if err != nil {
			return 0, 0, unexpected(err)
		}
		return flags, uint64(n), nil
	}
	var b [8]byte
	if _, err := io.ReadFull(c.r, b[:]); err != nil {
		return 0, 0, unexpected(err)
	}
	return flags, binary.BigEndian.Uint64(b[:]), nil
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readBody reads n bytes, allocating at most readChunk ahead of what has arrived, so that a frame that claims
// a large size and then stops costs little.
func (c *Conn) readBody(n uint64) ([]byte, error) {
	if n <= readChunk {
		b := make([]byte, n)
		_, err := io.ReadFull(c.r, b)
		return b, unexpected(err)
	}
	b := make([]byte, 0, readChunk)
	for uint64(len(b)) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, int(min(n-uint64(len(b)), uint64(cap(b)))))
		}
		end := int(min(n, uint64(cap(b))))
		if _, err := io.ReadFull(c.r, b[len(b):end]); err != nil {
			return nil, unexpected(err)
		}
		b = b[:end]
	}
	return b, nil
}

// ReadMessage reads the next message's frames. Commands between messages are handled: PING is answered with
// PONG; on a PUB or XPUB socket a SUBSCRIBE or CANCEL command (ZMTP 3.1) is returned as a one-frame message in
// the ZMTP 3.0 form ParseSubscription reads; PONG and other commands (SUBSCRIBE and CANCEL elsewhere, JOIN,
// LEAVE, unknown ones) are ignored, ERROR ends the connection with ErrPeerError. A message over MaxMessageSize or MaxFrames returns ErrTooLarge before its
// oversized frame is read: the caller should drop the connection, as libzmq does. Errors from the connection
// (io.EOF, deadlines) are returned as they are, io.ErrUnexpectedEOF inside a frame.
func (c *Conn) ReadMessage() ([][]byte, error) {
	var frames [][]byte
	var total uint64
	for {
		flags, size, err := c.readHeader()
		if err != nil {
			if len(frames) > 0 {
				err = unexpected(err)
			}
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(frames) > 0 {
				return nil, fmt.Errorf("%w: command inside a multi-frame message", ErrProtocol)
			}
			if flags&flagMore != 0 {
				return nil, fmt.Errorf("%w: command frame with the MORE flag", ErrProtocol)
			}
			if size > maxCommand {
				return nil, fmt.Errorf("%w: command of %d bytes (at most %d)", ErrTooLarge, size, maxCommand)
			}
			body, err := c.readBody(size)
			if err != nil {
				return nil, err
			}
			sub, err := c.command(body)
			if err != nil {
				return nil, err
			}
			if sub != nil {
				return [][]byte{sub}, nil
			}
			continue
		}
		if len(frames) >= c.opts.MaxFrames {
			return nil, fmt.Errorf("%w: more than %d frames in one message", ErrTooLarge, c.opts.MaxFrames)
		}
		if size > uint64(c.opts.MaxMessageSize) || total+size > uint64(c.opts.MaxMessageSize) {
			return nil, fmt.Errorf("%w: a message of more than %d bytes (a frame claims %d)", ErrTooLarge, c.opts.MaxMessageSize, size)
		}
		total += size
		body, err := c.readBody(size)
		if err != nil {
			return nil, err
		}
		frames = append(frames, body)
		if flags&flagMore == 0 {
			return frames, nil
		}
	}
}

// command handles a command frame; for a subscription on a PUB or XPUB socket it returns the subscription in
// its ZMTP 3.0 message form.
func (c *Conn) command(body []byte) ([]byte, error) {
	cmd, err := ParseCommand(body)
	if err != nil {
		return nil, err
	}
	switch cmd.Name {
	case "SUBSCRIBE", "CANCEL":
		if c.opts.Type == PUB || c.opts.Type == XPUB {
			return AppendSubscription(make([]byte, 0, 1+len(cmd.Data)), Subscription{Subscribe: cmd.Name == "SUBSCRIBE", Topic: cmd.Data}), nil
		}
	case "PING":
		// ping = command-size "PING" ping-ttl(2) ping-context(0..16); pong echoes the context.
		if len(cmd.Data) < 2 || len(cmd.Data) > 2+16 {
			return nil, fmt.Errorf("%w: PING with %d bytes of data", ErrProtocol, len(cmd.Data))
		}
		if err := c.writeFrames(flagCommand, [][]byte{AppendCommand(nil, "PONG", cmd.Data[2:])}); err != nil {
			return nil, fmt.Errorf("zmtp: send PONG: %w", err)
		}
	case "ERROR":
		return nil, fmt.Errorf("%w: %q", ErrPeerError, ParseError(cmd.Data))
	case "READY":
		return nil, fmt.Errorf("%w: a second READY command", ErrProtocol)
	}
	return nil, nil
}

// WriteMessage sends one message (every frame but the last with MORE) in one write, within WriteTimeout.
func (c *Conn) WriteMessage(frames [][]byte) error {
	if len(frames) == 0 {
		return fmt.Errorf("zmtp: a message needs at least one frame")
	}
	return c.writeFrames(0, frames)
}

func (c *Conn) writeFrames(flags byte, frames [][]byte) error {
	hdr := make([]byte, 0, 9*len(frames))
	bufs := make(net.Buffers, 0, 2*len(frames))
	for i, f := range frames {
		fl := flags
		if i < len(frames)-1 {
			fl |= flagMore
		}
		start := len(hdr)
		hdr = AppendFrameHeader(hdr, fl, len(f))
		bufs = append(bufs, hdr[start:len(hdr):len(hdr)])
		if len(f) > 0 {
			bufs = append(bufs, f)
		}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.opts.WriteTimeout > 0 {
		if err := c.nc.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout)); err != nil {
			return err
		}
	}
	_, err := bufs.WriteTo(c.nc)
	return err
}
