package blockhash

// cborPayload is what cbor2.dumps(v, canonical=True) writes for the values of value.go (RFC 8949): a tuple is
// an array, bytes a byte string, str a text string, an int an unsigned or negative integer with its argument
// in the fewest bytes, None the simple value null. Canonical mode only orders map keys and shortens floats,
// which these values do not have.
func cborPayload(v value) []byte {
	return appendCBOR(nil, v)
}

const (
	cborUint   = 0 << 5
	cborNeg    = 1 << 5
	cborBytes  = 2 << 5
	cborText   = 3 << 5
	cborArray  = 4 << 5
	cborNull   = 0xf6
	cborArgMax = 23 // the largest argument held in the initial byte
)

func appendCBOR(out []byte, v value) []byte {
	switch v.kind {
	case kindNone:
		return append(out, cborNull)
	case kindBytes:
		return append(cborHead(out, cborBytes, uint64(len(v.bytes))), v.bytes...)
	case kindStr:
		return append(cborHead(out, cborText, uint64(len(v.str))), v.str...)
	case kindInts:
		out = cborHead(out, cborArray, uint64(len(v.ints)))
		for _, x := range v.ints {
			if x >= 0 {
				out = cborHead(out, cborUint, uint64(x))
			} else {
				out = cborHead(out, cborNeg, uint64(-(x + 1)))
			}
		}
		return out
	case kindTuple:
		out = cborHead(out, cborArray, uint64(len(v.items)))
		for _, it := range v.items {
			out = appendCBOR(out, it)
		}
	}
	return out
}

// cborHead appends a data item's head: major type and argument, the argument in the initial byte up to 23,
// else in 1, 2, 4 or 8 bytes (additional information 24–27), the fewest that hold it.
func cborHead(out []byte, major byte, arg uint64) []byte {
	switch {
	case arg <= cborArgMax:
		return append(out, major|byte(arg))
	case arg <= 0xff:
		return append(out, major|24, byte(arg))
	case arg <= 0xffff:
		return append(out, major|25, byte(arg>>8), byte(arg))
	case arg <= 0xffffffff:
		return append(out, major|26, byte(arg>>24), byte(arg>>16), byte(arg>>8), byte(arg))
	}
	out = append(out, major|27)
	for s := 56; s >= 0; s -= 8 {
		out = append(out, byte(arg>>s))
	}
	return out
}
