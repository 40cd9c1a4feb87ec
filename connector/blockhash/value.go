package blockhash

// value is the subset of Python objects vLLM's block hash feeds its hash function: bytes (a parent hash), str
// (the NONE_HASH seed, a cache salt, a key's tag), a tuple of ints (a block's tokens), None (no extra keys) and
// tuples of these. Each value is a distinct Python object: pickle memoizes by identity, and vLLM never passes
// the same object twice in one hashed tuple, so the encoders never emit memo references.
type value struct {
	kind  kind
	bytes []byte  // kindBytes
	str   string  // kindStr
	ints  []int64 // kindInts
	items []value // kindTuple
}

type kind uint8

const (
	kindNone kind = iota
	kindBytes
	kindStr
	kindInts
	kindTuple
)

func bytesVal(b []byte) value   { return value{kind: kindBytes, bytes: b} }
func strVal(s string) value     { return value{kind: kindStr, str: s} }
func intsVal(v []int64) value   { return value{kind: kindInts, ints: v} }
func tupleVal(v ...value) value { return value{kind: kindTuple, items: v} }
