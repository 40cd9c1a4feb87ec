package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gonixl/gonixl/connector/protocol"
)

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(b))
	d.UseLooseInterfaceDecoding(true)
	v, err := d.DecodeInterface()
	require.NoError(t, err)
	return v
}

// The shapes msgspec gives vLLM's structs: 0.16 events are arrays with the tag first, 0.33 events are maps with
// "type" first and omit_defaults; the batch is [ts, events, dp_rank] in both, dp_rank None when unset.
func TestEncodeShapes(t *testing.T) {
	ev := &BlockStored{BlockHashes: []BlockHash{IntHash(7)}, TokenIDs: []int64{1, 2}, BlockSize: 2}
	b016, err := mustFormat(t, "0.16").EncodeBatch(Batch{TS: 1.5, Events: []Event{ev, &AllBlocksCleared{}}})
	require.NoError(t, err)
	assert.Equal(t, []any{1.5, []any{
		[]any{"BlockStored", []any{int64(7)}, nil, []any{int64(1), int64(2)}, int64(2), nil, nil, nil},
		[]any{"AllBlocksCleared"},
	}, nil}, decodeAny(t, b016))
	// 0.20's default fields are written as None in its arrays (msgspec: omit_defaults is for maps only).
	b020, err := mustFormat(t, "0.20").EncodeBatch(Batch{TS: 1.5, Events: []Event{&BlockRemoved{}}})
	require.NoError(t, err)
	assert.Equal(t, []any{1.5, []any{[]any{"BlockRemoved", []any{}, nil, nil}}, nil}, decodeAny(t, b020))

	rank := int64(3)
	b033, err := mustFormat(t, "0.33").EncodeBatch(Batch{TS: 1.5, Events: []Event{ev, &BlockRemoved{}}, DataParallelRank: &rank})
	require.NoError(t, err)
	assert.Equal(t, []any{1.5, []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{int64(7)}, "parent_block_hash": nil,
			"token_ids": []any{int64(1), int64(2)}, "block_size": int64(2), "lora_id": nil, "medium": nil, "lora_name": nil},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{}, "medium": nil},
	}, int64(3)}, decodeAny(t, b033))
	// "type" is the map's first key, as msgspec writes a tag.
	i := bytes.Index(b033, []byte("\xa4type"))
	require.Positive(t, i)
	assert.Equal(t, []byte{0xde, 0, 8}, b033[i-3:i], "BlockStored: 8 entries, type first, under a map16 header (16 fields at most)")
	j := bytes.Index(b033, []byte("\xa4type\xacBlockRemoved"))
	require.Positive(t, j)
	assert.Equal(t, byte(0x83), b033[j-1], "BlockRemoved: a fixmap (6 fields at most)")
}

// Byte for byte what vLLM 0.16's msgspec encoder writes for KVEventBatch(ts=1.5, events=[BlockStored(
// block_hashes=[7, 2**64-1, b"\x01"], parent_block_hash=5, token_ids=[1, -1, 300], block_size=16, lora_id=None,
// medium="GPU", lora_name=None)], data_parallel_rank=0) (taken from that venv, python -c).
func TestEncodeGolden016(t *testing.T) {
	b, err := mustFormat(t, "0.16").EncodeBatch(Batch{TS: 1.5, DataParallelRank: Ptr(int64(0)), Events: []Event{
		&BlockStored{BlockHashes: []BlockHash{IntHash(7), IntHash(1<<64 - 1), BytesHash([]byte{1})}, ParentBlockHash: Ptr(IntHash(5)),
			TokenIDs: []int64{1, -1, 300}, BlockSize: 16, Medium: Ptr("GPU")}}})
	require.NoError(t, err)
	assert.Equal(t, golden016, hex.EncodeToString(b))
}

func TestEncodeRefusals(t *testing.T) {
	f016, f033 := mustFormat(t, "0.16"), mustFormat(t, "0.33")
	for _, tc := range []struct {
		f  Format
		ev Event
	}{
		{f016, &BlockStored{BlockSize: 16, GroupIdx: Ptr(int64(0))}},
		{f016, &BlockStored{BlockSize: 16, LookaheadTokenIDs: [][]int64{}}},
		{f016, &BlockRemoved{Locality: Ptr("LOCAL")}},
		{f033, &BlockStored{BlockSize: 0}},
		{f033, (*BlockStored)(nil)},
		{f033, nil},
		{f033, &BlockStored{BlockSize: 1, ExtraKeys: [][]any{{struct{}{}}}}},
	} {
		_, err := tc.f.EncodeBatch(Batch{TS: 1, Events: []Event{tc.ev}})
		assert.ErrorIs(t, err, ErrInvalid, "%s %#v", tc.f.Name, tc.ev)
	}
	_, err := f033.EncodeBatch(Batch{TS: 1, Events: []Event{&BlockStored{BlockSize: 1, GroupIdx: Ptr(int64(2)), ExtraKeys: [][]any{{"lora", []any{"mm", 3}}, nil}}}})
	assert.NoError(t, err)
}

// A default field set after unset ones: a map carries only the set one.
func TestEncodeOmitDefaults(t *testing.T) {
	b, err := mustFormat(t, "0.33").EncodeBatch(Batch{TS: 1, Events: []Event{&BlockRemoved{Ownership: Ptr("t1")}}})
	require.NoError(t, err)
	ev := decodeAny(t, b).([]any)[1].([]any)[0].(map[string]any)
	assert.Equal(t, map[string]any{"type": "BlockRemoved", "block_hashes": []any{}, "medium": nil, "ownership": "t1"}, ev)
}

func TestFormatFor(t *testing.T) {
	for v, want := range map[string]string{"0.16.0": "0.16", "0.16.1.post1": "0.16", "0.20.2": "0.20", "0.26.0": "0.26", "0.29.1": "0.29", "0.31.0": "0.32", "0.32.0": "0.32", "0.33.0": "0.33", "0.33.2+cu129": "0.33", "v0.33.0": "0.33"} {
		f, err := FormatFor(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, f.Name, v)
	}
	for _, v := range []string{"0.17.0", "0.25.0", "0.15.0", "0.33.0rc1", "x"} {
		_, err := FormatFor(v)
		assert.ErrorIs(t, err, ErrUnknownVersion, v)
	}
	_, err := FormatFor("0.15.0")
	assert.True(t, errors.Is(err, protocol.ErrUnknownVersion))
	_, err = FormatByName("0.17")
	assert.ErrorIs(t, err, ErrUnknownVersion)
}

const golden016 = "93cb3ff80000000000009198ab426c6f636b53746f7265649307cfffffffffffffffffc40101059301ffcd012c10c0a3475055c000"

// Byte for byte what vLLM 0.33's msgspec encoder writes for KVEventBatch(ts=1.5, events=[BlockStored(
// block_hashes=[7, 2**64-1, b"\x01"], parent_block_hash=5, token_ids=[1, -1, 300], block_size=16, lora_id=None,
// medium="GPU", lora_name=None, group_idx=0, extra_keys=[("lora", ("mm", 3)), None]), BlockRemoved(
// block_hashes=[1], medium=None, ownership="o"), AllBlocksCleared()], data_parallel_rank=0) (that venv, python -c).
func TestEncodeGolden033(t *testing.T) {
	b, err := mustFormat(t, "0.33").EncodeBatch(Batch{TS: 1.5, DataParallelRank: Ptr(int64(0)), Events: []Event{
		&BlockStored{BlockHashes: []BlockHash{IntHash(7), IntHash(1<<64 - 1), BytesHash([]byte{1})}, ParentBlockHash: Ptr(IntHash(5)),
			TokenIDs: []int64{1, -1, 300}, BlockSize: 16, Medium: Ptr("GPU"), GroupIdx: Ptr(int64(0)),
			ExtraKeys: [][]any{{"lora", []any{"mm", 3}}, nil}},
		&BlockRemoved{BlockHashes: []BlockHash{IntHash(1)}, Ownership: Ptr("o")},
		&AllBlocksCleared{}}})
	require.NoError(t, err)
	assert.Equal(t, golden033, hex.EncodeToString(b))
}

const golden033 = "93cb3ff800000000000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739307cfffffffffffffffffc40101b1706172656e745f626c6f636b5f6861736805a9746f6b656e5f6964739301ffcd012caa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739292a46c6f726192a26d6d03c0a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739101a66d656469756dc0a96f776e657273686970a16f81a474797065b0416c6c426c6f636b73436c656172656400"
