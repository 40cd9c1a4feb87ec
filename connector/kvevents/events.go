package kvevents

import (
	"bytes"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// BlockHash is vLLM's ExternalBlockHash (bytes | int). vLLM publishes ints by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1: the low 64 bits of the block's hash, big-endian) and the hash's bytes
// when that variable is 0. Make one with IntHash or BytesHash.
type BlockHash struct {
	bytes   []byte
	n       uint64
	isBytes bool
}

// IntHash is an int block hash (vLLM's default).
func IntHash(n uint64) BlockHash { return BlockHash{n: n} }

// BytesHash is a bytes block hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0). b is copied.
func BytesHash(b []byte) BlockHash { return BlockHash{bytes: append([]byte{}, b...), isBytes: true} }

// Int returns the int hash and true, or 0 and false for a bytes hash.
func (h BlockHash) Int() (uint64, bool) { return h.n, !h.isBytes }

// Bytes returns the bytes hash and true, or nil and false for an int hash.
func (h BlockHash) Bytes() ([]byte, bool) { return h.bytes, h.isBytes }

// String is the hash as Python prints it: 123 or b'...' in hex.
func (h BlockHash) String() string {
	if h.isBytes {
		return fmt.Sprintf("bytes(%x)", h.bytes)
	}
	return fmt.Sprint(h.n)
}

// Event is one KV-cache event: *BlockStored, *BlockRemoved or *AllBlocksCleared.
type Event interface {
	// Tag is the event's msgspec tag (its vLLM class name).
	Tag() string
	fields() []value
}

// BlockStored: blocks whose KV the publisher now holds, under vLLM's block hashes (a chain: each block's hash
// covers its parent's). Pointer and slice fields are None on the wire when nil. The fields after LoraName exist
// in later releases only (Format.Stored); encoding one that is set for a release without it is ErrInvalid.
type BlockStored struct {
	BlockHashes     []BlockHash
	ParentBlockHash *BlockHash // the hash of the block before the first one, nil for a prompt's first block
	TokenIDs        []int64    // the tokens of the blocks, len(BlockHashes)·BlockSize for full blocks
	BlockSize       int
	LoraID          *int64
	Medium          *string // "GPU", "CPU", ...
	LoraName        *string

	ExtraKeys                [][]any // one tuple per block (nil: None), or nil for None; values: string, int, []any
	GroupIdx                 *int64
	KVCacheSpecKind          *string
	KVCacheSpecSlidingWindow *int64
	Locality                 *string
	Ownership                *string
	SessionID                *string
	LookaheadTokenIDs        [][]int64
}

// BlockRemoved: blocks the publisher no longer holds (evicted).
type BlockRemoved struct {
	BlockHashes []BlockHash
	Medium      *string

	GroupIdx  *int64
	Locality  *string
	Ownership *string
}

// AllBlocksCleared: the publisher dropped every block (a cache reset).
type AllBlocksCleared struct{}

// Tag implements Event.
func (*BlockStored) Tag() string { return "BlockStored" }

// Tag implements Event.
func (*BlockRemoved) Tag() string { return "BlockRemoved" }

// Tag implements Event.
func (*AllBlocksCleared) Tag() string { return "AllBlocksCleared" }

// Batch is vLLM's KVEventBatch: one message on the wire.
type Batch struct {
	// TS is the batch's time as Python's time.time(): seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DataParallelRank is None on the wire when nil; the Publisher sets its own rank there, as vLLM's does.
	DataParallelRank *int64
}

// Ptr returns a pointer to v, for the optional fields.
func Ptr[T any](v T) *T { return &v }

// value is one field: its wire name, whether it holds None (the default of a Default field), and its encoder.
type value struct {
	name   string
	isNone bool
	enc    func(e *msgpack.Encoder) error
}

func hashes(hs []BlockHash) func(e *msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if err := e.EncodeArrayLen(len(hs)); err != nil {
			return err
		}
		for _, h := range hs {
			if err := encodeHash(e, h); err != nil {
				return err
			}
		}
		return nil
	}
}

func encodeHash(e *msgpack.Encoder, h BlockHash) error {
	if h.isBytes {
		return e.EncodeBytes(h.bytes)
	}
	return e.EncodeUint(h.n)
}

func ints(v []int64) func(e *msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if err := e.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for _, n := range v {
			if err := e.EncodeInt(n); err != nil {
				return err
			}
		}
		return nil
	}
}

func optInt(name string, p *int64) value {
	if p == nil {
		return value{name: name, isNone: true}
	}
	return value{name: name, enc: func(e *msgpack.Encoder) error { return e.EncodeInt(*p) }}
}

func optStr(name string, p *string) value {
	if p == nil {
		return value{name: name, isNone: true}
	}
	return value{name: name, enc: func(e *msgpack.Encoder) error { return e.EncodeString(*p) }}
}

func (b *BlockStored) fields() []value {
	parent := value{name: "parent_block_hash", isNone: b.ParentBlockHash == nil}
	if b.ParentBlockHash != nil {
		h := *b.ParentBlockHash
		parent.enc = func(e *msgpack.Encoder) error { return encodeHash(e, h) }
	}
	extra := value{name: "extra_keys", isNone: b.ExtraKeys == nil}
	if b.ExtraKeys != nil {
		keys := b.ExtraKeys
		extra.enc = func(e *msgpack.Encoder) error {
			if err := e.EncodeArrayLen(len(keys)); err != nil {
				return err
			}
			for _, k := range keys {
				if err := encodeAny(e, k, 0); err != nil {
					return err
				}
			}
			return nil
		}
	}
	look := value{name: "lookahead_token_ids", isNone: b.LookaheadTokenIDs == nil}
	if b.LookaheadTokenIDs != nil {
		ls := b.LookaheadTokenIDs
		look.enc = func(e *msgpack.Encoder) error {
			if err := e.EncodeArrayLen(len(ls)); err != nil {
				return err
			}
			for _, l := range ls {
				if err := ints(l)(e); err != nil {
					return err
				}
			}
			return nil
		}
	}
	bs := int64(b.BlockSize)
	return []value{
		{name: "block_hashes", enc: hashes(b.BlockHashes)},
		parent,
		{name: "token_ids", enc: ints(b.TokenIDs)},
		{name: "block_size", enc: func(e *msgpack.Encoder) error { return e.EncodeInt(bs) }},
		optInt("lora_id", b.LoraID),
		optStr("medium", b.Medium),
		optStr("lora_name", b.LoraName),
		extra,
		optInt("group_idx", b.GroupIdx),
		optStr("kv_cache_spec_kind", b.KVCacheSpecKind),
		optInt("kv_cache_spec_sliding_window", b.KVCacheSpecSlidingWindow),
		optStr("locality", b.Locality),
		optStr("ownership", b.Ownership),
		optStr("session_id", b.SessionID),
		look,
	}
}

func (b *BlockRemoved) fields() []value {
	return []value{
		{name: "block_hashes", enc: hashes(b.BlockHashes)},
		optStr("medium", b.Medium),
		optInt("group_idx", b.GroupIdx),
		optStr("locality", b.Locality),
		optStr("ownership", b.Ownership),
	}
}

func (*AllBlocksCleared) fields() []value { return nil }

// maxAnyDepth bounds the nesting of ExtraKeys values.
const maxAnyDepth = 8

// encodeAny encodes an ExtraKeys value as msgspec encodes the Python value: nil → None, a []any → an array
// (a tuple), strings, []byte, bools, integers and floats.
func encodeAny(e *msgpack.Encoder, v any, depth int) error {
	if depth > maxAnyDepth {
		return fmt.Errorf("%w: extra_keys nested deeper than %d", ErrInvalid, maxAnyDepth)
	}
	switch x := v.(type) {
	case nil:
		return e.EncodeNil()
	case []any:
		if x == nil {
			return e.EncodeNil()
		}
		if err := e.EncodeArrayLen(len(x)); err != nil {
			return err
		}
		for _, y := range x {
			if err := encodeAny(e, y, depth+1); err != nil {
				return err
			}
		}
		return nil
	case string:
		return e.EncodeString(x)
	case []byte:
		if x == nil {
			x = []byte{} // Python bytes: never None
		}
		return e.EncodeBytes(x)
	case bool:
		return e.EncodeBool(x)
	case int:
		return e.EncodeInt(int64(x))
	case int64:
		return e.EncodeInt(x)
	case uint64:
		return e.EncodeUint(x)
	case float64:
		return e.EncodeFloat64(x)
	}
	return fmt.Errorf("%w: extra_keys value of type %T (want nil, []any, string, []byte, bool, int, int64, uint64, float64)", ErrInvalid, v)
}

// check refuses what the format cannot carry.
func (f Format) check(ev Event) ([]Field, error) {
	var fields []Field
	switch x := ev.(type) {
	case *BlockStored:
		if x == nil {
			return nil, fmt.Errorf("%w: nil *BlockStored", ErrInvalid)
		}
		if x.BlockSize <= 0 {
			return nil, fmt.Errorf("%w: BlockStored.BlockSize %d (vLLM's block size is positive)", ErrInvalid, x.BlockSize)
		}
		fields = f.Stored
	case *BlockRemoved:
		if x == nil {
			return nil, fmt.Errorf("%w: nil *BlockRemoved", ErrInvalid)
		}
		fields = f.Removed
	case *AllBlocksCleared:
	case nil:
		return nil, fmt.Errorf("%w: nil event", ErrInvalid)
	default:
		return nil, fmt.Errorf("%w: event type %T (want *BlockStored, *BlockRemoved or *AllBlocksCleared)", ErrInvalid, ev)
	}
	for _, v := range ev.fields() {
		if !v.isNone && !has(fields, v.name) {
			return nil, fmt.Errorf("%w: vLLM %s's %s has no field %s: leave it unset", ErrInvalid, f.Name, ev.Tag(), v.name)
		}
	}
	return fields, nil
}

// EncodeBatch returns the batch's msgpack bytes exactly as vLLM's msgspec encoder writes its KVEventBatch for
// this format (the third frame of a published message).
func (f Format) EncodeBatch(b Batch) ([]byte, error) {
	if math.IsNaN(b.TS) || math.IsInf(b.TS, 0) {
		return nil, fmt.Errorf("%w: batch time %v", ErrInvalid, b.TS)
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	// array_like structs are written whole: msgspec's omit_defaults applies to map encodings only.
	if err := e.EncodeArrayLen(3); err != nil {
		return nil, err
	}
	if err := e.EncodeFloat64(b.TS); err != nil {
		return nil, err
	}
	if err := e.EncodeArrayLen(len(b.Events)); err != nil {
		return nil, err
	}
	for _, ev := range b.Events {
		if err := f.encodeEvent(e, ev); err != nil {
			return nil, err
		}
	}
	if b.DataParallelRank == nil {
		if err := e.EncodeNil(); err != nil {
			return nil, err
		}
	} else if err := e.EncodeInt(*b.DataParallelRank); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (f Format) encodeEvent(e *msgpack.Encoder, ev Event) error {
	decl, err := f.check(ev)
	if err != nil {
		return err
	}
	byName := map[string]value{}
	for _, v := range ev.fields() {
		byName[v.name] = v
	}
	// The fields on the wire: in a map every field without a default and a default field only when set
	// (omit_defaults); in an array every field, None or not (msgspec ignores omit_defaults for array_like).
	var out []value
	for _, fd := range decl {
		v := byName[fd.Name]
		if f.EventsAsMaps && fd.Default && v.isNone {
			continue
		}
		out = append(out, v)
	}
	if err := header(e, f.EventsAsMaps, len(out)+1, len(decl)+1); err != nil {
		return err
	}
	if f.EventsAsMaps {
		if err := e.EncodeString("type"); err != nil {
			return err
		}
	}
	if err := e.EncodeString(ev.Tag()); err != nil {
		return err
	}
	for _, v := range out {
		if f.EventsAsMaps {
			if err := e.EncodeString(v.name); err != nil {
				return err
			}
		}
		if v.isNone {
			if err := e.EncodeNil(); err != nil {
				return err
			}
			continue
		}
		if err := v.enc(e); err != nil {
			return err
		}
	}
	return nil
}

// header writes a struct's map or array header of n entries as msgspec does for a struct of at most max
// (fields and tag): msgspec sizes the header by max, not by n, when it omits defaults — a struct of more than
// 15 fields gets a 16-bit header (0xde/0xdc) even for fewer entries (vLLM 0.33's BlockStored: 16).
func header(e *msgpack.Encoder, isMap bool, n, max int) error {
	if max <= 15 {
		if isMap {
			return e.EncodeMapLen(n)
		}
		return e.EncodeArrayLen(n)
	}
	code := byte(0xdc) // array16
	if isMap {
		code = 0xde // map16
	}
	if max > math.MaxUint16 {
		return fmt.Errorf("%w: a struct of %d fields", ErrInvalid, max)
	}
	_, err := e.Writer().Write([]byte{code, byte(n >> 8), byte(n)})
	return err
}
