package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/layout"
)

func TestLayoutNamesPerRow(t *testing.T) {
	for _, p := range Profiles {
		t.Run(p.Name, func(t *testing.T) {
			require.NotEmpty(t, p.Labels)
			hnd, err := p.LayoutName(layout.HND)
			require.NoError(t, err)
			nhd, err := p.LayoutName(layout.NHD)
			require.NoError(t, err)
			_, err = p.LayoutName(0)
			require.ErrorIs(t, err, layout.ErrInvalidGeometry)
			legacy := p.Layout != LayoutC || p.Schema.byName["block_strides"] == nil // 0.16–0.28
			if legacy {
				assert.Equal(t, [2]string{"HND", "NHD"}, [2]string{hnd, nhd})
				_, err = p.ParseLayoutName("LBHNC")
				require.ErrorIs(t, err, layout.ErrInvalidGeometry)
				assert.ErrorContains(t, err, `"HND" (HND), "NHD" (NHD)`, "the error lists the row's names")
			} else {
				assert.Equal(t, [2]string{"LBHNC", "LBNHC"}, [2]string{hnd, nhd})
				_, err = p.ParseLayoutName("HND")
				require.ErrorIs(t, err, layout.ErrInvalidGeometry)
				assert.ErrorContains(t, err, `"LBHNC" (HND)`)
				_, err = p.ParseLayoutName("BLHNC")
				require.ErrorIs(t, err, layout.ErrInvalidGeometry)
				assert.ErrorContains(t, err, "does not model")
			}
			// Names are exact, like vLLM's string comparison.
			_, err = p.ParseLayoutName(" " + hnd)
			require.Error(t, err)
			o, err := p.ParseLayoutName(nhd)
			require.NoError(t, err)
			assert.Equal(t, layout.NHD, o)
			for _, q := range p.LabelQuirks {
				assert.NotEqual(t, mustParse(t, p, q.Label), q.Bytes, "a quirk is a label over other bytes: %+v", q)
			}
		})
	}
}

func mustParse(t *testing.T, p Profile, name string) layout.BlockOrder {
	t.Helper()
	o, err := p.ParseLayoutName(name)
	require.NoError(t, err)
	return o
}

func TestDefaultCompatInputs(t *testing.T) {
	model := func(in CompatInputs) CompatInputs {
		in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = "Qwen/Qwen3-0.6B", "torch.bfloat16", 8, 128, 28
		return in
	}
	p33, err := ProfileFor("0.33.0")
	require.NoError(t, err)
	in := p33.DefaultCompatInputs("")
	assert.Equal(t, "0.33.0", in.VLLMVersion, "the version ProfileFor was given")
	assert.Equal(t, PlatformCUDA, in.Platform)
	assert.Equal(t, "FLASH_ATTN", in.AttnBackendName)
	assert.True(t, in.HMAEnabled, "vLLM 0.33 keeps HMA on with NixlConnector")
	assert.Equal(t, "auto", in.CacheDtype)
	assert.Equal(t, "pull", in.TransferMode)
	assert.Equal(t, "CPU_ATTN", p33.DefaultCompatInputs(PlatformCPU).AttnBackendName)

	p18, err := ProfileFor("0.18.0")
	require.NoError(t, err)
	assert.False(t, p18.DefaultCompatInputs(PlatformCUDA).HMAEnabled, "0.18 turns HMA off with a connector")

	// A literal on the CPU platform with the backend left empty hashes CPU_ATTN.
	lit := model(CompatInputs{VLLMVersion: "0.33.0", Platform: PlatformCPU, HMAEnabled: true})
	f, err := p33.Factors(lit)
	require.NoError(t, err)
	assert.Equal(t, "CPU_ATTN", f["attn_backend_name"])
	assert.Equal(t, "auto", f["cache_dtype"])
	_, err = p33.Factors(model(CompatInputs{VLLMVersion: "0.33.0", Platform: "tpu"}))
	require.ErrorIs(t, err, ErrInvalid, "no default backend for an unknown platform")
	assert.ErrorContains(t, err, "AttnBackendName")

	// The version is stated once: a literal without VLLMVersion hashes the profile's, and a row by name has
	// none until its Version is set.
	f, err = p33.Factors(model(CompatInputs{HMAEnabled: true}))
	require.NoError(t, err)
	assert.Equal(t, "0.33.0", f["vllm_version"])
	byName, err := ProfileByName("0.33")
	require.NoError(t, err)
	assert.Empty(t, byName.Version)
	_, err = byName.Factors(model(byName.DefaultCompatInputs("")))
	require.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "Profile.Version")
	byName.Version = "0.33.0"
	h, err := byName.CompatHash(model(byName.DefaultCompatInputs("")))
	require.NoError(t, err)
	want, err := p33.CompatHash(model(p33.DefaultCompatInputs("")))
	require.NoError(t, err)
	assert.Equal(t, want, h)
}

// A decode side that left HMAEnabled false against a vLLM 0.33 prefill (HMA on) gets an error that shows its
// hash inputs and names the one that differs.
func TestHashMismatchExplained(t *testing.T) {
	p, err := ProfileFor("0.33.0")
	require.NoError(t, err)
	remote := p.DefaultCompatInputs(PlatformCPU)
	remote.Model, remote.Dtype, remote.NumKVHeads, remote.HeadSize, remote.NumHiddenLayers = "m", "torch.bfloat16", 2, 64, 2
	rh, err := p.CompatHash(remote)
	require.NoError(t, err)
	m := NewAgentMetadata()
	m.EngineID, m.KVCacheLayout = "e", "LBHNC"
	payload, err := p.EncodeHandshake(rh, m)
	require.NoError(t, err)

	local := remote
	local.HMAEnabled = false
	lh, err := p.CompatHash(local)
	require.NoError(t, err)
	_, err = p.OpenHandshake(payload, HandshakeCheck{LocalHash: lh, EnforceHash: true, LocalInputs: &local})
	require.ErrorIs(t, err, ErrHashMismatch)
	js, jerr := p.FactorsJSON(local)
	require.NoError(t, jerr)
	assert.ErrorContains(t, err, js)
	assert.ErrorContains(t, err, "the remote hash equals ours with is_hma_enabled=true")

	local = remote
	local.AttnBackendName = "FLASH_ATTN" // a CUDA default against a CPU peer
	lh, err = p.CompatHash(local)
	require.NoError(t, err)
	_, err = p.OpenHandshake(payload, HandshakeCheck{LocalHash: lh, EnforceHash: true, LocalInputs: &local})
	require.ErrorIs(t, err, ErrHashMismatch)
	assert.ErrorContains(t, err, `attn_backend_name="CPU_ATTN"`)

	// Without inputs the message stays as before.
	_, err = p.OpenHandshake(payload, HandshakeCheck{LocalHash: lh, EnforceHash: true})
	require.ErrorIs(t, err, ErrHashMismatch)
	assert.NotContains(t, err.Error(), "our hash inputs")
}

func TestParamsCachedTokensAndGeneration(t *testing.T) {
	p, err := ProfileFor("0.33.0")
	require.NoError(t, err)
	b, err := p.EncodeParams(KVTransferParams{DoRemotePrefill: true, RemoteBlockIDs: BlockIDs{{1}}, RemoteEngineID: "e",
		RemoteRequestID: "r", RemoteHost: "h", RemotePort: 1, TPSize: 1, DCPSize: 1, PPSize: 1,
		RemoteRegistrationGeneration: 1, TransferMode: "pull", RemotePrefillCachedTokens: 16})
	require.NoError(t, err)
	assert.Contains(t, string(b), `"remote_registration_generation": 1, "transfer_mode": "pull", "remote_prefill_cached_tokens": 16}`)
	k, err := p.DecodeParams(b)
	require.NoError(t, err)
	assert.EqualValues(t, 16, k.RemotePrefillCachedTokens)
	assert.EqualValues(t, 1, k.RemoteRegistrationGeneration)

	p30, err := ProfileFor("0.30.0")
	require.NoError(t, err)
	assert.NotContains(t, p30.ParamsKeys, "remote_prefill_cached_tokens")
	p31, err := ProfileFor("0.31.0")
	require.NoError(t, err)
	assert.Equal(t, "remote_prefill_cached_tokens", p31.ParamsKeys[len(p31.ParamsKeys)-1])
}
