package protocol

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxSkipDepth bounds the nesting of unknown values we skip, so hostile input cannot exhaust the stack.
const maxSkipDepth = 64

// reader is a strict msgpack reader with msgspec's typing rules: a str field needs msgpack str, a bytes field
// needs bin, an int field needs an integer (not bool, not float), and nothing may follow the top-level value.
type reader struct {
	buf *bytes.Reader
	d   *msgpack.Decoder
	obj string // object being decoded, for error messages
}

func newReader(b []byte, obj string) *reader {
	br := bytes.NewReader(b)
	return &reader{buf: br, d: msgpack.NewDecoder(br), obj: obj}
}

func (r *reader) peek(field string) (byte, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, malformed(r.obj, field, "truncated input")
	}
	return c, nil
}

func (r *reader) fail(field, want string, c byte) error {
	return malformed(r.obj, field, "expected %s, got %s", want, codeName(c))
}

// container describes a msgpack map or array header.
type container struct {
	kind, items    string // "map", "entries"
	isFixed        func(c byte) bool
	code16, code32 byte
	decodeLen      func(d *msgpack.Decoder) (int, error)
	minItemSize    int // bytes an item takes at least: the bound of a length claim
}

var (
	mapHeader = container{"map", "entries", msgpcode.IsFixedMap, msgpcode.Map16, msgpcode.Map32,
		(*msgpack.Decoder).DecodeMapLen, 2}
	arrayHeader = container{"array", "elements", msgpcode.IsFixedArray, msgpcode.Array16, msgpcode.Array32,
		(*msgpack.Decoder).DecodeArrayLen, 1}
)

// is says whether c starts a value of this kind.
func (h container) is(c byte) bool { return h.isFixed(c) || c == h.code16 || c == h.code32 }

// header reads a map or array header, refusing a length that the bytes left cannot hold.
func (r *reader) header(field string, h container) (int, error) {
	c, err := r.peek(field)
	if err != nil {
		return 0, err
	}
	if !h.is(c) {
		return 0, r.fail(field, h.kind, c)
	}
	n, err := h.decodeLen(r.d)
	if err != nil {
		return 0, malformed(r.obj, field, "bad %s header: %v", h.kind, err)
	}
	if n > r.buf.Len()/h.minItemSize {
		return 0, malformed(r.obj, field, "%s claims %d %s with %d bytes left", h.kind, n, h.items, r.buf.Len())
	}
	return n, nil
}

func (r *reader) mapLen(field string) (int, error)   { return r.header(field, mapHeader) }
func (r *reader) arrayLen(field string) (int, error) { return r.header(field, arrayHeader) }

func (r *reader) str(field string) (string, error) {
	c, err := r.peek(field)
	if err != nil {
		return "", err
	}
	if !msgpcode.IsFixedString(c) && c != msgpcode.Str8 && c != msgpcode.Str16 && c != msgpcode.Str32 {
		return "", r.fail(field, "str", c)
	}
	b, err := r.raw(field)
	if err != nil {
		return "", err
	}
	s := string(b)
	if !utf8.ValidString(s) {
		return "", malformed(r.obj, field, "str is not valid UTF-8")
	}
	return s, nil
}

func (r *reader) bin(field string) ([]byte, error) {
	c, err := r.peek(field)
	if err != nil {
		return nil, err
	}
	if c != msgpcode.Bin8 && c != msgpcode.Bin16 && c != msgpcode.Bin32 {
		return nil, r.fail(field, "bin (Python bytes)", c)
	}
	b, err := r.raw(field)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, nil // empty bytes decode as nil, like every empty list here
	}
	return b, nil
}

// rawLen reads the header of a str, bin or ext value and returns the length of its payload (for ext, the type
// byte included), refusing a length larger than what is left: a hostile 4 GiB claim in a 100-byte message
// must fail here, not make a decoder allocate it.
func (r *reader) rawLen(field string) (int, error) {
	c, err := r.buf.ReadByte()
	if err != nil {
		return 0, malformed(r.obj, field, "truncated input")
	}
	size := 0 // bytes of the length field
	n := 0
	switch {
	case msgpcode.IsFixedString(c):
		n = int(c & 0x1f)
	case c == msgpcode.Str8 || c == msgpcode.Bin8:
		size = 1
	case c == msgpcode.Str16 || c == msgpcode.Bin16:
		size = 2
	case c == msgpcode.Str32 || c == msgpcode.Bin32:
		size = 4
	case c == msgpcode.FixExt1 || c == msgpcode.FixExt2 || c == msgpcode.FixExt4 || c == msgpcode.FixExt8 || c == msgpcode.FixExt16:
		n = 1 + map[byte]int{msgpcode.FixExt1: 1, msgpcode.FixExt2: 2, msgpcode.FixExt4: 4, msgpcode.FixExt8: 8, msgpcode.FixExt16: 16}[c]
	case c == msgpcode.Ext8:
		size = 1
	case c == msgpcode.Ext16:
		size = 2
	case c == msgpcode.Ext32:
		size = 4
	default:
		return 0, r.fail(field, "str, bin or ext", c)
	}
	if size > 0 {
		var hdr [4]byte
		if _, err := io.ReadFull(r.buf, hdr[:size]); err != nil {
			return 0, malformed(r.obj, field, "truncated length")
		}
		switch size {
		case 1:
			n = int(hdr[0])
		case 2:
			n = int(binary.BigEndian.Uint16(hdr[:2]))
		case 4:
			n = int(binary.BigEndian.Uint32(hdr[:4]))
		}
		if c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32 {
			n++ // the ext type byte
		}
	}
	if n > r.buf.Len() {
		return 0, malformed(r.obj, field, "%s claims %d bytes with %d left", codeName(c), n, r.buf.Len())
	}
	return n, nil
}

// raw reads a str or bin value's bytes (length-checked by rawLen).
func (r *reader) raw(field string) ([]byte, error) {
	n, err := r.rawLen(field)
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.buf, b); err != nil {
		return nil, malformed(r.obj, field, "truncated value")
	}
	return b, nil
}

func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) ||
		(c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

// intCode peeks at the next value's code and fails unless it is an integer.
func (r *reader) intCode(field string) (byte, error) {
	c, err := r.peek(field)
	if err != nil {
		return 0, err
	}
	if !isIntCode(c) {
		return 0, r.fail(field, "int", c)
	}
	return c, nil
}

func (r *reader) int64(field string) (int64, error) {
	c, err := r.intCode(field)
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Uint64 {
		u, err := r.d.DecodeUint64()
		if err != nil {
			return 0, malformed(r.obj, field, "bad int: %v", err)
		}
		if u > math.MaxInt64 {
			return 0, malformed(r.obj, field, "int %d does not fit int64", u)
		}
		return int64(u), nil
	}
	n, err := r.d.DecodeInt64()
	if err != nil {
		return 0, malformed(r.obj, field, "bad int: %v", err)
	}
	return n, nil
}

func (r *reader) uint64(field string) (uint64, error) {
	c, err := r.intCode(field)
	if err != nil {
		return 0, err
	}
	if msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) {
		u, err := r.d.DecodeUint64()
		if err != nil {
			return 0, malformed(r.obj, field, "bad int: %v", err)
		}
		return u, nil
	}
	n, err := r.d.DecodeInt64()
	if err != nil {
		return 0, malformed(r.obj, field, "bad int: %v", err)
	}
	if n < 0 {
		return 0, malformed(r.obj, field, "negative value %d where an address or size is expected", n)
	}
	return uint64(n), nil
}

// number reads an int or a float as float64 (the clock frame is an untyped msgspec decode).
func (r *reader) number(field string) (float64, error) {
	c, err := r.peek(field)
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := r.d.DecodeFloat64()
		if err != nil {
			return 0, malformed(r.obj, field, "bad float: %v", err)
		}
		return f, nil
	case isIntCode(c):
		n, err := r.int64(field)
		return float64(n), err
	}
	return 0, r.fail(field, "float", c)
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	c, err := r.d.PeekCode()
	if err != nil || c != msgpcode.Nil {
		return false
	}
	_ = r.d.DecodeNil()
	return true
}

// skip consumes one value of any type, with bounded nesting.
func (r *reader) skip(field string, depth int) error {
	if depth > maxSkipDepth {
		return malformed(r.obj, field, "nesting deeper than %d", maxSkipDepth)
	}
	c, err := r.peek(field)
	if err != nil {
		return err
	}
	switch {
	case mapHeader.is(c):
		n, err := r.mapLen(field)
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := r.skip(field, depth+1); err != nil {
				return err
			}
		}
		return nil
	case arrayHeader.is(c):
		n, err := r.arrayLen(field)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := r.skip(field, depth+1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32 ||
		c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 ||
		c == msgpcode.FixExt1 || c == msgpcode.FixExt2 || c == msgpcode.FixExt4 || c == msgpcode.FixExt8 || c == msgpcode.FixExt16 ||
		c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32:
		n, err := r.rawLen(field)
		if err != nil {
			return err
		}
		_, err = r.buf.Seek(int64(n), io.SeekCurrent)
		return err
	}
	if err := r.d.Skip(); err != nil {
		return malformed(r.obj, field, "bad value: %v", err)
	}
	return nil
}

// end fails if bytes follow the top-level value (msgspec: "trailing characters").
func (r *reader) end() error {
	if n := r.buf.Len(); n != 0 {
		return malformed(r.obj, "", "%d trailing bytes after the message", n)
	}
	return nil
}

func codeName(c byte) string {
	switch {
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) || (c >= msgpcode.Int8 && c <= msgpcode.Int64):
		return "int"
	case mapHeader.is(c):
		return "map"
	case arrayHeader.is(c):
		return "array"
	case msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32:
		return "str"
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32:
		return "bin"
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	}
	return "ext/unknown type"
}

// writer wraps the msgpack encoder; vmihailenco's encoder already picks msgspec's smallest forms
// (fixint/uint8…, fixstr/str8…, bin8…, fixarray/fixmap…), so encoding is a matter of field order and types.
type writer struct {
	buf bytes.Buffer
	e   *msgpack.Encoder
	err error
}

func newWriter() *writer {
	w := &writer{}
	w.e = msgpack.NewEncoder(&w.buf)
	return w
}

func (w *writer) do(err error) {
	if w.err == nil && err != nil {
		w.err = err
	}
}

func (w *writer) mapLen(n int)   { w.do(w.e.EncodeMapLen(n)) }
func (w *writer) arrayLen(n int) { w.do(w.e.EncodeArrayLen(n)) }
func (w *writer) str(s string)   { w.do(w.e.EncodeString(s)) }
func (w *writer) bin(b []byte)   { w.do(w.e.EncodeBytesLen(len(b))); _, err := w.buf.Write(b); w.do(err) }
func (w *writer) int(n int64)    { w.do(w.e.EncodeInt(n)) }
func (w *writer) uint(n uint64)  { w.do(w.e.EncodeUint(n)) }
func (w *writer) float(f float64) {
	w.do(w.e.EncodeFloat64(f))
}
func (w *writer) nil() { w.do(w.e.EncodeNil()) }

func (w *writer) bytes() ([]byte, error) {
	if w.err != nil {
		return nil, w.err
	}
	return w.buf.Bytes(), nil
}
