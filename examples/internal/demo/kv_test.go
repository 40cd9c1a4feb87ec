package demo

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

// A prefill worker with PrefillConfig.KV (the engine demo's): the model's KV is written to the device,
// staged into CPU_ATTN blocks, read back and compared byte for byte (Timing.VerifiedBytes); KV of the wrong
// size is refused; and the read-back check catches a byte that differs.
func TestPrefillModelKV(t *testing.T) {
	l := nixltest.Lib(t)
	ctx := testenv.Context(t, 3*time.Minute)
	m := connector.Model{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 64, DType: layout.FP32, BlockSize: 32, AttnBackend: protocol.AttnBackendCPU}
	const tokens = 40 // one full block and part of a second
	n := m.KVHeads * tokens * m.HeadDim * 4
	r := rand.New(rand.NewPCG(1, 2))
	kv := PromptKV{Tokens: tokens}
	for range m.Layers {
		k, v := make([]byte, n), make([]byte, n)
		for i := range k {
			k[i], v[i] = byte(r.Uint32()), byte(r.Uint32())
		}
		kv.K, kv.V = append(kv.K, k), append(kv.V, v)
	}
	pre, err := NewPrefillServer(ctx, PrefillConfig{VLLMVersion: "0.32.0", Model: m, NumBlocks: 8, BatchRows: 1, MaxSeq: 64,
		HoldTimeout: 10 * time.Minute, Library: l, CUDAContext: "off",
		KV: func(req CompletionRequest) (PromptKV, error) {
			if strings.HasPrefix(req.Prompt, "short") {
				return PromptKV{Tokens: tokens, K: kv.K[:1], V: kv.V[:1]}, nil
			}
			return kv, nil
		}})
	require.NoError(t, err)
	defer pre.Close()
	ps := httptest.NewServer(pre.Handler())
	defer ps.Close()

	code, _, body := post(t, ps.URL, "ok", CompletionRequest{Model: m.Name, Prompt: prompt(tokens, "w1"), KVTransferParams: json.RawMessage(prefillParams)})
	require.Equal(t, http.StatusOK, code, string(body))
	var resp CompletionResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	require.NotNil(t, resp.Gonixl)
	assert.True(t, resp.Gonixl.Verified)
	assert.Equal(t, int64(2*m.Layers*n), resp.Gonixl.VerifiedBytes)
	assert.Equal(t, 2, resp.Gonixl.Blocks)

	p, err := protocol.ProfileFor("0.32.0")
	require.NoError(t, err)
	params, err := p.DecodeParams(resp.KVTransferParams)
	require.NoError(t, err)
	var blocks []int
	for _, b := range params.RemoteBlockIDs[0] {
		blocks = append(blocks, int(b))
	}
	got, err := pre.checkStaged(kv, blocks)
	require.NoError(t, err)
	assert.Equal(t, int64(2*m.Layers*n), got)
	bad := PromptKV{Tokens: tokens, K: append([][]byte(nil), kv.K...), V: kv.V}
	bad.K[1] = append([]byte(nil), kv.K[1]...)
	bad.K[1][n-1] ^= 1 // the last token's last element of the last head
	_, err = pre.checkStaged(bad, blocks)
	assert.ErrorContains(t, err, "layer 1 K: the staged blocks read back differ")

	code, _, body = post(t, ps.URL, "short", CompletionRequest{Model: m.Name, Prompt: prompt(tokens, "short"), KVTransferParams: json.RawMessage(prefillParams)})
	assert.Equal(t, http.StatusInternalServerError, code, string(body))
	assert.Contains(t, string(body), "1/1 layers")
}
