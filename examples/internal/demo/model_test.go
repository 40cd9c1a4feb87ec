package demo

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/layout"
)

// The demo tokenizer gives the Dynamo demo model's ids to its words and hashes of any other word above them.
func TestTokenIDs(t *testing.T) {
	ids := TokenIDs(" w0  w4095\tw7 w4096 w07 w-1 hello w ")
	require.Len(t, ids, 8)
	require.Equal(t, []int{FirstWordID, FirstWordID + 4095, FirstWordID + 7}, ids[:3])
	for i, id := range ids[3:] {
		require.GreaterOrEqual(t, id, FirstWordID+VocabWords, "word %d", i+3)
	}
	require.Equal(t, ids, TokenIDs("w0 w4095 w7 w4096 w07 w-1 hello w"))
	require.NotEqual(t, TokenIDs("hello")[0], TokenIDs("hellp")[0])
	require.Empty(t, TokenIDs(" "))
}

// A position's KV depends on the tokens up to it and on nothing after it: prompts that share a prefix have
// the same bytes there (a prefix block cached from one prompt serves the other) and differ from the first
// token where they part; and filling positions in pieces gives the same bytes as filling them at once.
func TestKVChainCausal(t *testing.T) {
	a := TokenIDs(prompt(40, "w1") + " w2 w3")
	b := append(append([]int(nil), a[:32]...), TokenIDs("w9 w2 w3 w4 w5")...)
	ca, cb := KVChain(a), KVChain(b)
	require.Equal(t, ca[:32], cb[:32])
	for p := 32; p < len(cb); p++ {
		require.NotEqual(t, ca[p], cb[p], "position %d", p)
	}
	require.Equal(t, KVChain(a[:10]), ca[:10])

	const rowBytes = 36 // not a multiple of 8: the tail of each row is filled too
	whole := make([]byte, len(ca)*rowBytes)
	FillHead(whole, rowBytes, ca, 3, layout.V, 5)
	pieces := make([]byte, len(whole))
	FillHead(pieces[:16*rowBytes], rowBytes, ca[:16], 3, layout.V, 5)
	FillHead(pieces[16*rowBytes:], rowBytes, ca[16:], 3, layout.V, 5)
	require.Equal(t, whole, pieces)
	other := make([]byte, len(whole))
	FillHead(other, rowBytes, ca, 3, layout.K, 5) // K and V, layers and heads differ
	require.NotEqual(t, whole[:rowBytes], other[:rowBytes])
	require.NotEqual(t, whole[:rowBytes], whole[rowBytes:2*rowBytes], "positions differ")
}
