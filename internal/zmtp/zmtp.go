// Package zmtp is the small part of ZMTP 3.x (rfc.zeromq.org 23/ZMTP and 37/ZMTP) that vLLM's side channel and
// its KV-events publisher need, in pure Go: the greeting, the NULL security mechanism's READY command with
// Socket-Type and Identity metadata, short and long frames with the MORE flag, commands beside messages,
// PING/PONG, and a subscriber's SUBSCRIBE/CANCEL (3.1 commands or 3.0 messages, ParseSubscription). It speaks to
// libzmq 4.x peers (pyzmq) as ZMTP 3.1 by default, or as 3.0, and accepts 3.0 and 3.1 peers. Socket-type
// compatibility is checked as libzmq does (REQ↔REP|ROUTER, DEALER↔REP|DEALER|ROUTER, ROUTER↔REQ|DEALER|ROUTER,
// PUB|XPUB↔SUB|XSUB).
//
// It is a wire codec for one connection (Conn); the socket patterns on top (a ROUTER that answers each peer, a
// REQ that sends one request and waits) are the caller's. Nothing here trusts the peer: every size is checked
// before anything is allocated for it, commands have a small size limit, and every decoder returns an error
// wrapping ErrProtocol instead of panicking.
package zmtp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Errors. Every error caused by the peer's bytes wraps ErrProtocol, ErrTooLarge, ErrIncompatible or
// ErrPeerError.
var (
	// ErrProtocol: the peer's bytes are not ZMTP 3.x with the NULL mechanism.
	ErrProtocol = errors.New("zmtp: protocol error")
	// ErrTooLarge: a message (or command) over the configured limit; nothing was allocated for it.
	ErrTooLarge = errors.New("zmtp: message over the size limit")
	// ErrIncompatible: the peer's socket type cannot talk to ours (e.g. a PUB peer for a ROUTER).
	ErrIncompatible = errors.New("zmtp: incompatible socket type")
	// ErrPeerError: the peer sent an ERROR command (its reason is in the message).
	ErrPeerError = errors.New("zmtp: peer reported an error")
)

// Wire constants.
const (
	GreetingSize = 64
	// MajorVersion is ZMTP 3.
	MajorVersion = 3
	// Minor30 and Minor31 are the minor versions this package speaks.
	Minor30 = 0
	Minor31 = 1

	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xf8

	mechanismNull = "NULL"
	mechanismLen  = 20
)

// SocketType is a ZMQ socket type as written in the Socket-Type property.
type SocketType string

// The socket types this package knows (others may appear as a peer's type and are refused).
const (
	REQ    SocketType = "REQ"
	REP    SocketType = "REP"
	DEALER SocketType = "DEALER"
	ROUTER SocketType = "ROUTER"
	PUB    SocketType = "PUB"
	SUB    SocketType = "SUB"
	XPUB   SocketType = "XPUB"
	XSUB   SocketType = "XSUB"
)

// Compatible reports whether a local socket of type local may talk to a peer of type peer (libzmq's
// mechanism_t::check_socket_type for the request-reply and publish-subscribe types).
func Compatible(local, peer SocketType) bool {
	switch local {
	case REQ:
		return peer == REP || peer == ROUTER
	case REP:
		return peer == REQ || peer == DEALER
	case DEALER:
		return peer == REP || peer == DEALER || peer == ROUTER
	case ROUTER:
		return peer == REQ || peer == DEALER || peer == ROUTER
	case PUB, XPUB:
		return peer == SUB || peer == XSUB
	case SUB, XSUB:
		return peer == PUB || peer == XPUB
	}
	return false
}

// Greeting is the decoded 64-byte ZMTP 3 greeting.
type Greeting struct {
	Major, Minor byte
	Mechanism    string
	AsServer     bool
}

// AppendGreeting appends our greeting: signature (0xFF, padding, 0x7F, as libzmq writes it), version 3.minor,
// mechanism NULL, as-server 0 (NULL ignores it), filler.
func AppendGreeting(b []byte, minor byte) []byte {
	var g [GreetingSize]byte
	g[0] = 0xff
	g[8] = 0x01 // padding: libzmq writes identity length + 1 here, for ZMTP 1.0 peers; bit 0 must be set
	g[9] = 0x7f
	g[10] = MajorVersion
	g[11] = minor
	copy(g[12:12+mechanismLen], mechanismNull)
	return append(b, g[:]...)
}

// CheckSignature checks the first 11 bytes of a greeting (signature and major version), the part a peer sends
// before it sends the rest; a ZMTP 1.0/2.0 peer or a non-ZMTP client is refused here.
func CheckSignature(b []byte) error {
	if len(b) < 11 {
		return fmt.Errorf("%w: greeting too short (%d bytes)", ErrProtocol, len(b))
	}
	if b[0] != 0xff || b[9]&0x01 == 0 {
		return fmt.Errorf("%w: no ZMTP signature (first bytes % x): the peer is not a ZeroMQ socket", ErrProtocol, b[:min(len(b), 10)])
	}
	if b[10] < MajorVersion {
		return fmt.Errorf("%w: the peer speaks ZMTP %d.x (libzmq older than 4); ZMTP 3 is needed", ErrProtocol, b[10])
	}
	return nil
}

// ParseGreeting decodes a whole greeting (exactly GreetingSize bytes) and checks that it is ZMTP 3.x or later
// (later majors are answered as 3.x, as the RFC says) with the NULL mechanism.
func ParseGreeting(b []byte) (Greeting, error) {
	if len(b) != GreetingSize {
		return Greeting{}, fmt.Errorf("%w: greeting is %d bytes, want %d", ErrProtocol, len(b), GreetingSize)
	}
	if err := CheckSignature(b); err != nil {
		return Greeting{}, err
	}
	mech := b[12 : 12+mechanismLen]
	n := bytes.IndexByte(mech, 0)
	if n < 0 {
		n = len(mech)
	}
	for _, c := range mech[n:] {
		if c != 0 {
			return Greeting{}, fmt.Errorf("%w: mechanism name not zero-padded", ErrProtocol)
		}
	}
	g := Greeting{Major: b[10], Minor: b[11], Mechanism: string(mech[:n]), AsServer: b[32] == 1}
	if g.Mechanism != mechanismNull {
		return g, fmt.Errorf("%w: the peer wants security mechanism %q; only NULL is supported (no CURVE/PLAIN)", ErrProtocol, printable(g.Mechanism))
	}
	return g, nil
}

// Property is one metadata property of a READY command.
type Property struct {
	Name  string
	Value []byte
}

// Metadata is a READY command's property list, in wire order.
type Metadata []Property

// Get returns the value of a property (names are case-insensitive) and whether it was there.
func (m Metadata) Get(name string) ([]byte, bool) {
	for _, p := range m {
		if strings.EqualFold(p.Name, name) {
			return p.Value, true
		}
	}
	return nil, false
}

// AppendMetadata appends properties in the wire form: name-size (1 byte), name, value-size (4 bytes), value.
func AppendMetadata(b []byte, m Metadata) []byte {
	for _, p := range m {
		b = append(b, byte(len(p.Name)))
		b = append(b, p.Name...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(p.Value)))
		b = append(b, p.Value...)
	}
	return b
}

// ParseMetadata decodes a property list. Names are 1–255 bytes of [A-Za-z0-9.-_+]; a value may be empty.
// Values alias b.
func ParseMetadata(b []byte) (Metadata, error) {
	var m Metadata
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: truncated or empty property name in metadata", ErrProtocol)
		}
		name := b[1 : 1+n]
		for _, c := range name {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' || c == '+') {
				return nil, fmt.Errorf("%w: bad character in metadata property name", ErrProtocol)
			}
		}
		vlen := binary.BigEndian.Uint32(b[1+n:])
		rest := b[1+n+4:]
		if uint64(vlen) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: metadata property %q claims %d bytes, %d left", ErrProtocol, name, vlen, len(rest))
		}
		m = append(m, Property{Name: string(name), Value: rest[:vlen:vlen]})
		b = rest[vlen:]
	}
	return m, nil
}

// Command is a decoded command frame body.
type Command struct {
	Name string
	Data []byte
}

// AppendCommand appends a command body: name-size (1 byte), name, data.
func AppendCommand(b []byte, name string, data []byte) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	return append(b, data...)
}

// ParseCommand decodes a command frame's body. Data aliases body.
func ParseCommand(body []byte) (Command, error) {
	if len(body) == 0 || body[0] == 0 || int(body[0]) > len(body)-1 {
		return Command{}, fmt.Errorf("%w: command frame without a valid name", ErrProtocol)
	}
	n := int(body[0])
	name := body[1 : 1+n]
	for _, c := range name {
		if c < 0x20 || c > 0x7e {
			return Command{}, fmt.Errorf("%w: command name is not printable ASCII", ErrProtocol)
		}
	}
	return Command{Name: string(name), Data: body[1+n:]}, nil
}

// ParseReady decodes the data of a READY command: its metadata, the peer's socket type and identity.
func ParseReady(data []byte) (Metadata, SocketType, []byte, error) {
	md, err := ParseMetadata(data)
	if err != nil {
		return nil, "", nil, err
	}
	st, ok := md.Get("Socket-Type")
	if !ok {
		return md, "", nil, fmt.Errorf("%w: READY without a Socket-Type property", ErrProtocol)
	}
	id, _ := md.Get("Identity")
	if len(id) > 255 {
		return md, "", nil, fmt.Errorf("%w: identity of %d bytes (at most 255)", ErrProtocol, len(id))
	}
	return md, SocketType(printable(string(st))), id, nil
}

// ParseError decodes the data of an ERROR command (reason-size, reason).
func ParseError(data []byte) string {
	if len(data) == 0 {
		return ""
	}
	n := min(int(data[0]), len(data)-1)
	return printable(string(data[1 : 1+n]))
}

// AppendFrameHeader appends a frame header: flags and a 1-byte (short) or 8-byte (long) size, as libzmq
// chooses (long above 255 bytes).
func AppendFrameHeader(b []byte, flags byte, size int) []byte {
	if size > 255 {
		b = append(b, flags|flagLong)
		return binary.BigEndian.AppendUint64(b, uint64(size))
	}
	return append(b, flags, byte(size))
}

// Subscription is a subscriber's SUBSCRIBE or CANCEL: a topic prefix it wants (or no longer wants) messages for.
// An empty Topic matches every message.
type Subscription struct {
	Subscribe bool // false: CANCEL (unsubscribe)
	Topic     []byte
}

// ParseSubscription decodes a subscription as a PUB socket receives it: in ZMTP 3.0 a one-frame message whose
// first byte is 1 (subscribe) or 0 (cancel) followed by the topic; from 3.1 a SUBSCRIBE or CANCEL command, which
// Conn.ReadMessage hands to a PUB or XPUB socket in the same one-frame form. ok is false for any other message
// (a PUB socket drops those, as libzmq does). Topic aliases msg.
func ParseSubscription(msg [][]byte) (Subscription, bool) {
	if len(msg) != 1 || len(msg[0]) == 0 || msg[0][0] > 1 {
		return Subscription{}, false
	}
	return Subscription{Subscribe: msg[0][0] == 1, Topic: msg[0][1:]}, true
}

// AppendSubscription appends a subscription in the ZMTP 3.0 message form (what a SUB sends to a 3.0 peer).
func AppendSubscription(b []byte, s Subscription) []byte {
	if s.Subscribe {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return append(b, s.Topic...)
}

// printable keeps what a log line can show of peer-chosen text.
func printable(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}
