package demo

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCompletionPrompt checks that a prompt arrives as text or as token ids (as vLLM's API takes it, and as
// Dynamo's frontend sends it), that it goes back on the wire the same way, and which token ids its KV derives from.
func TestCompletionPrompt(t *testing.T) {
	var ids CompletionRequest
	require.NoError(t, json.Unmarshal([]byte(`{"model":"m","prompt":[4,5,6],"max_tokens":3,"kv_transfer_params":{"do_remote_decode":true}}`), &ids))
	require.Equal(t, []int{4, 5, 6}, ids.PromptTokenIDs)
	require.Equal(t, 3, ids.NumTokens())
	require.Equal(t, 3, ids.MaxTokens)
	require.JSONEq(t, `{"do_remote_decode":true}`, string(ids.KVTransferParams))
	raw, err := json.Marshal(ids)
	require.NoError(t, err)
	require.JSONEq(t, `{"model":"m","prompt":[4,5,6],"max_tokens":3,"stream":false,"kv_transfer_params":{"do_remote_decode":true}}`, string(raw))

	var text CompletionRequest
	require.NoError(t, json.Unmarshal([]byte(`{"model":"m","prompt":"a b c","stream":true}`), &text))
	require.Nil(t, text.PromptTokenIDs)
	require.Equal(t, 3, text.NumTokens())
	raw, err = json.Marshal(text)
	require.NoError(t, err)
	require.JSONEq(t, `{"model":"m","prompt":"a b c","stream":true}`, string(raw))

	require.Equal(t, []int{4, 5, 6}, ids.TokenIDs())
	require.Equal(t, TokenIDs("a b c"), text.TokenIDs())

	for _, bad := range []string{`{"prompt":[1,"x"]}`, `{"prompt":7}`, `{"prompt":[1.5]}`} {
		var r CompletionRequest
		require.Error(t, json.Unmarshal([]byte(bad), &r), bad)
	}
}
