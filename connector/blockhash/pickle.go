package blockhash

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// Pickle opcodes (Lib/pickletools.py) that pickle.dumps(obj, protocol=5) writes for the values of value.go.
const (
	opProto          = 0x80
	opFrame          = 0x95
	opStop           = '.'
	opNone           = 'N'
	opMark           = '('
	opTuple          = 't'
	opEmptyTuple     = ')'
	opTuple1         = 0x85
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opBinInt         = 'J'
	opLong1          = 0x8a
	opShortBinBytes  = 'C'
	opBinBytes       = 'B'
	opShortBinUnicod = 0x8c
	opBinUnicode     = 'X'
	opMemoize        = 0x94

	frameHeader = 9         // FRAME and its 8-byte length
	frameTarget = 64 * 1024 // CPython's _FRAME_SIZE_TARGET: a frame ends at the first save() past it
	frameMin    = 4         // CPython's _FRAME_SIZE_MIN: a shorter frame loses its header
)

// pickler writes what CPython's C pickler (Modules/_pickle.c) writes for pickle.dumps(v, protocol=5): PROTO 5,
// then the opcodes in frames. A frame is closed at the start of a save() once it holds frameTarget bytes or
// more, and before a bytes or str payload of frameTarget bytes or more, which is written outside any frame
// together with its opcode.
type pickler struct {
	out   []byte
	frame int // offset of the open frame's header in out, -1 when none is open
}

func picklePayload(v value) ([]byte, error) {
	p := &pickler{out: []byte{opProto, 5}, frame: -1}
	if err := p.save(v); err != nil {
		return nil, err
	}
	p.write(opStop)
	p.commit()
	return p.out, nil
}

// write appends to the open frame, opening one first if none is.
func (p *pickler) write(b ...byte) {
	if p.frame < 0 {
		p.frame = len(p.out)
		p.out = append(p.out, make([]byte, frameHeader)...)
	}
	p.out = append(p.out, b...)
}

// commit closes the open frame: its header gets its length, or is dropped for a frame under frameMin bytes.
func (p *pickler) commit() {
	if p.frame < 0 {
		return
	}
	n := len(p.out) - p.frame - frameHeader
	if n >= frameMin {
		p.out[p.frame] = opFrame
		binary.LittleEndian.PutUint64(p.out[p.frame+1:], uint64(n))
	} else {
		p.out = append(p.out[:p.frame], p.out[p.frame+frameHeader:]...)
	}
	p.frame = -1
}

func (p *pickler) save(v value) error {
	p.boundary()
	switch v.kind {
	case kindNone:
		p.write(opNone)
	case kindBytes:
		return p.sized(v.bytes, opShortBinBytes, opBinBytes)
	case kindStr:
		return p.sized([]byte(v.str), opShortBinUnicod, opBinUnicode)
	case kindInts:
		return p.tuple(len(v.ints), func(i int) error { p.boundary(); p.int(v.ints[i]); return nil })
	case kindTuple:
		return p.tuple(len(v.items), func(i int) error { return p.save(v.items[i]) })
	}
	return nil
}

// boundary is the start of a save(): the open frame is closed once it holds frameTarget bytes or more.
func (p *pickler) boundary() {
	if p.frame >= 0 && len(p.out)-p.frame-frameHeader >= frameTarget {
		p.commit()
	}
}

// tuple writes a tuple of n items, each saved by item: EMPTY_TUPLE; or the items and TUPLE1/2/3 (up to 3
// items); or MARK, the items, TUPLE; then MEMOIZE (an empty tuple is not memoized).
func (p *pickler) tuple(n int, item func(i int) error) error {
	if n == 0 {
		p.write(opEmptyTuple)
		return nil
	}
	if n > 3 {
		p.write(opMark)
	}
	for i := range n {
		if err := item(i); err != nil {
			return err
		}
	}
	if n > 3 {
		p.write(opTuple)
	} else {
		p.write(opTuple1 + byte(n-1))
	}
	p.write(opMemoize)
	return nil
}

// int writes BININT1, BININT2, BININT or LONG1: little-endian two's complement in (x.bit_length() >> 3) + 1
// bytes, less a redundant last 0xff of a negative number (CPython's encode_long).
func (p *pickler) int(x int64) {
	switch {
	case x >= 0 && x < 1<<8:
		p.write(opBinInt1, byte(x))
	case x >= 0 && x < 1<<16:
		p.write(opBinInt2, byte(x), byte(x>>8))
	case x >= math.MinInt32 && x <= math.MaxInt32:
		p.write(opBinInt, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	default:
		n := bits.Len64(absInt(x))>>3 + 1
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(x >> min(8*i, 63)) // sign-extends past the 8th byte
		}
		if x < 0 && n > 1 && b[n-1] == 0xff && b[n-2]&0x80 != 0 {
			b = b[:n-1]
		}
		p.write(opLong1, byte(len(b)))
		p.write(b...)
	}
}

// absInt is |x| as a uint64 (|MinInt64| included).
func absInt(x int64) uint64 {
	if x < 0 {
		return uint64(-(x + 1)) + 1
	}
	return uint64(x)
}

// sized writes a bytes or str payload: the short opcode with a 1-byte length under 256 bytes, else the 4-byte
// one; a payload of frameTarget bytes or more goes outside the frames with its opcode. Then MEMOIZE.
func (p *pickler) sized(b []byte, short, long byte) error {
	var head []byte
	switch {
	case len(b) < 256:
		head = []byte{short, byte(len(b))}
	case uint64(len(b)) <= math.MaxUint32:
		head = binary.LittleEndian.AppendUint32([]byte{long}, uint32(len(b)))
	default:
		return fmt.Errorf("%w: a pickled payload of %d bytes (4 GiB or more)", ErrUnsupported, len(b))
	}
	if len(b) >= frameTarget {
		p.commit()
		p.out = append(p.out, head...)
		p.out = append(p.out, b...)
	} else {
		p.write(head...)
		p.write(b...)
	}
	p.write(opMemoize)
	return nil
}
