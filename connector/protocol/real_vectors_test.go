package protocol

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

// realVectors is testdata/vllm/<release>/real.json: what vLLM's own NixlConnector emitted on the CPU platform
// (python/gen_vectors_real.py).
type realVectors struct {
	VLLMVersion string `json:"vllm_version"`
	Platform    string `json:"platform"`
	Model       struct {
		Model           string `json:"model"`
		Dtype           string `json:"dtype"`
		NumKVHeads      int64  `json:"num_kv_heads"`
		HeadSize        int64  `json:"head_size"`
		NumHiddenLayers int64  `json:"num_hidden_layers"`
		BlockSize       int64  `json:"block_size"`
	} `json:"model"`
	EngineID        string `json:"engine_id"`
	CompatHash      string `json:"compat_hash"`
	AttnBackendName string `json:"attn_backend_name"`
	KVCacheLayout   string `json:"kv_cache_layout"`
	NumRegions      int    `json:"num_regions"`
	BlockLen        int64  `json:"block_len"`
	Handshake       struct {
		Framing    string `json:"framing"`
		Frames     int    `json:"frames"`
		PayloadHex string `json:"payload_hex"`
	} `json:"handshake"`
	KVTransferParams string `json:"kv_transfer_params"`
	Tokens           int64  `json:"tokens"`
	// Notification is what vLLM's decode worker (TP 1) sent after reading one request.
	Notification *struct {
		Text      string `json:"text"`
		Hex       string `json:"hex"`
		RequestID string `json:"request_id"`
	} `json:"notification"`
}

// The real thing agrees with the profile rows: the handshake decodes with the row's schema, its hash is the one
// DefaultCompatInputs gives for the release on the CPU platform (nothing but the model named), its
// kv_cache_layout is the row's name for HND blocks, and request_finished's kv_transfer_params carry the row's
// keys in the row's order with vLLM's values (registration generation 1).
func loadRealVectors(tb testing.TB) []realVectors {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "testdata", "vllm", "*", "real.json"))
	require.NoError(tb, err)
	require.NotEmpty(tb, files, "no real vectors: run python/gen_vectors_real.py (make vectors-real)")
	out := make([]realVectors, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(tb, err)
		var rv realVectors
		require.NoError(tb, json.Unmarshal(b, &rv), f)
		out = append(out, rv)
	}
	return out
}

func TestRealVectors(t *testing.T) {
	for _, rv := range loadRealVectors(t) {
		t.Run(rv.VLLMVersion, func(t *testing.T) {
			p, err := ProfileFor(rv.VLLMVersion)
			require.NoError(t, err)
			assert.Equal(t, rv.Handshake.Framing, p.Framing.String())
			assert.Equal(t, p.Framing == FramingH4, rv.Handshake.Frames == 2, "H4 sends the clock frame")

			in := p.DefaultCompatInputs(Platform(rv.Platform))
			in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = rv.Model.Model, rv.Model.Dtype,
				rv.Model.NumKVHeads, rv.Model.HeadSize, rv.Model.NumHiddenLayers
			assert.Equal(t, rv.AttnBackendName, in.AttnBackendName, "the platform's default backend")
			h, err := p.CompatHash(in)
			require.NoError(t, err)
			assert.Equal(t, rv.CompatHash, h, "vLLM's defaults reproduced from the version, platform and model")

			md, err := p.OpenHandshake(unhex(t, rv.Handshake.PayloadHex), HandshakeCheck{LocalHash: h, EnforceHash: true,
				ExpectedEngineID: rv.EngineID, LocalInputs: &in})
			require.NoError(t, err)
			assert.Equal(t, rv.KVCacheLayout, md.KVCacheLayout)
			o, err := p.ParseLayoutName(md.KVCacheLayout)
			require.NoError(t, err)
			assert.Equal(t, layout.HND, o, "NixlConnector's layout is heads-major")
			name, err := p.LayoutName(layout.HND)
			require.NoError(t, err)
			assert.Equal(t, md.KVCacheLayout, name, "gonixl publishes what vLLM publishes")
			assert.Equal(t, rv.Model.BlockSize, md.BlockSize)
			assert.Len(t, md.KVCachesBaseAddr, rv.NumRegions)
			if p.Schema.byName["attn_backend_name"] != nil {
				assert.Equal(t, rv.AttnBackendName, md.AttnBackendName)
			}
			for _, bl := range md.BlockLens {
				assert.Equal(t, rv.BlockLen, bl)
			}
			// Re-encoding the decoded metadata gives vLLM's bytes back.
			hp, err := DecodeHandshakePayload(unhex(t, rv.Handshake.PayloadHex))
			require.NoError(t, err)
			enc, err := p.EncodeMetadata(md)
			require.NoError(t, err)
			assert.Equal(t, hp.AgentMetadataBytes, enc)

			// kv_transfer_params: request_finished's keys are the row's, in order (the scheduler appends its own
			// afterwards), and they decode to vLLM's values.
			keys := jsonKeys(t, rv.KVTransferParams)
			require.LessOrEqual(t, len(keys), len(p.ParamsKeys))
			assert.Equal(t, p.ParamsKeys[:len(keys)], keys)
			kv, err := p.DecodeParams([]byte(rv.KVTransferParams))
			require.NoError(t, err)
			assert.Equal(t, rv.EngineID, kv.RemoteEngineID)
			if kv.Has["remote_num_tokens"] { // 0.21+
				assert.Equal(t, rv.Tokens, kv.RemoteNumTokens)
			}
			if kv.Has["remote_registration_generation"] {
				assert.EqualValues(t, 1, kv.RemoteRegistrationGeneration, "vLLM's first registration")
			}
			// vLLM's decode notification: "<remote_request_id>:1" for a TP-1 decode reading a TP-1 prefill (D's
			// TP size up to 0.28, the expected consumers from 0.29), and gonixl's decode role sends the same bytes.
			if n := rv.Notification; assert.NotNil(t, n, "run gen_vectors_real.py with notifications") {
				got, err := p.DecodeNotification(unhex(t, n.Hex))
				require.NoError(t, err)
				assert.Equal(t, n.RequestID, got.RequestID)
				assert.Equal(t, 1, got.Count)
				ours, err := p.EncodeNotification(Notification{RequestID: n.RequestID, Count: 1})
				require.NoError(t, err)
				assert.Equal(t, n.Text, string(ours))
			}
			// What gonixl's prefill role writes for the same request has vLLM's bytes, key for key.
			ours, err := p.EncodeParams(kv)
			require.NoError(t, err)
			assert.Equal(t, keys, jsonKeys(t, string(ours))[:len(keys)])
		})
	}
}
