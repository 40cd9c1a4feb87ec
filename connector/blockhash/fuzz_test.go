package blockhash

import (
	"encoding/binary"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// FuzzHashes: any tokens, salt and block size hash without panicking; one hash per full block; a chain
// continued with Append equals the whole; hashes of a prefix are a prefix of the hashes.
func FuzzHashes(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, "salt", uint8(1), false)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0x80}, "", uint8(2), true)
	f.Fuzz(func(t *testing.T, raw []byte, salt string, bs uint8, cbor bool) {
		blockSize := int(bs%8) + 1
		toks := make([]int64, len(raw)/8)
		for i := range toks {
			toks[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
		}
		algo := SHA256
		if cbor {
			algo = SHA256CBOR
		}
		r, _ := ReleaseByName("0.31")
		h, err := New(Config{Release: r, Algo: algo, BlockSize: blockSize})
		require.NoError(t, err)
		whole, err := h.Hashes(toks, salt)
		if !utf8.ValidString(salt) {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		require.NoError(t, err)
		require.Len(t, whole, len(toks)/blockSize)
		half := len(toks) / 2
		part, err := h.Hashes(toks[:half], salt)
		require.NoError(t, err)
		require.Equal(t, append([]Hash{}, whole[:len(part)]...), append([]Hash{}, part...))
		all, err := h.Append(part, toks, salt)
		require.NoError(t, err)
		require.Equal(t, append([]Hash{}, whole...), append([]Hash{}, all...))
	})
}
