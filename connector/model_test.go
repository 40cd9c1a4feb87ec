package connector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

var qwen = Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}

func TestModelGeometry(t *testing.T) {
	for _, c := range []struct {
		version string
		plan    layout.RegionPlan
	}{{"0.16.0", layout.PlanSplitKV}, {"0.23.0", layout.PlanKVHalves}, {"0.33.0", layout.PlanPackedKV}} {
		p, err := protocol.ProfileFor(c.version)
		require.NoError(t, err)
		g, err := qwen.Geometry(p, 64, 1)
		require.NoError(t, err)
		assert.Equal(t, layout.Geometry{NumLayers: 28, NumBlocks: 64, BlockSize: 16, NumKVHeads: 8, HeadDim: 128,
			DType: layout.BF16, Order: layout.HND, Plan: c.plan}, g, c.version)
		require.NoError(t, checkPlan(p, fakeCache{g: g}))
	}
	p, _ := protocol.ProfileFor("0.16.0")
	// KV heads are the whole model's: each of 4 TP ranks holds 2; past 8 ranks vLLM replicates one per rank.
	g, err := qwen.Geometry(p, 8, 4)
	require.NoError(t, err)
	assert.Equal(t, 2, g.NumKVHeads)
	g, err = qwen.Geometry(p, 8, 16)
	require.NoError(t, err)
	assert.Equal(t, 1, g.NumKVHeads)
	_, err = qwen.Geometry(p, 8, 3)
	require.Error(t, err, "8 heads do not split over 3 ranks")
	// Explicit values win over the defaults; the cache dtype is the element type.
	m := qwen
	m.BlockSize, m.Order, m.CacheDType = 32, layout.NHD, layout.FP8E4M3
	g, err = m.Geometry(p, 8, 1)
	require.NoError(t, err)
	assert.Equal(t, 32, g.BlockSize)
	assert.Equal(t, layout.NHD, g.Order)
	assert.Equal(t, layout.FP8E4M3, g.DType)
	_, err = Model{Name: "empty"}.Geometry(p, 8, 1)
	require.Error(t, err)
}

func TestModelCompatInputs(t *testing.T) {
	for _, c := range []struct {
		version string
		hma     bool
	}{{"0.16.0", false}, {"0.21.0", false}, {"0.22.0", true}, {"0.33.0", true}} {
		p, err := protocol.ProfileFor(c.version)
		require.NoError(t, err)
		in, err := qwen.CompatInputs(p)
		require.NoError(t, err)
		assert.Equal(t, c.version, in.VLLMVersion, "the version ProfileFor was given")
		want := p.DefaultCompatInputs("")
		want.Model, want.Dtype, want.NumKVHeads, want.HeadSize, want.NumHiddenLayers = "Qwen/Qwen3-0.6B", "torch.bfloat16", 8, 128, 28
		assert.Equal(t, want, in, c.version)
		assert.Equal(t, c.hma, in.HMAEnabled, c.version)
		assert.Equal(t, "FLASH_ATTN", in.AttnBackendName)
		assert.Equal(t, "auto", in.CacheDtype)
		_, err = p.CompatHash(in)
		require.NoError(t, err, c.version)
	}
	p, _ := protocol.ProfileFor("0.33.0")
	m := qwen
	m.CacheDType, m.AttnBackend = layout.FP8E5M2, "CPU_ATTN"
	in, err := m.CompatInputs(p)
	require.NoError(t, err)
	assert.Equal(t, "fp8_e5m2", in.CacheDtype)
	assert.Equal(t, "CPU_ATTN", in.AttnBackendName)
	m.DType = layout.FP8E4M3
	_, err = m.CompatInputs(p)
	require.ErrorIs(t, err, layout.ErrInvalidGeometry, "fp8 is a cache dtype, not a model dtype")

	// A row by name has no version string to hash until one is set.
	byName, err := protocol.ProfileByName("0.20")
	require.NoError(t, err)
	_, err = qwen.CompatInputs(byName)
	require.ErrorContains(t, err, "has no Version")
	byName.Version = "0.20.2rc1.dev265+gdd6b3a5ef"
	in, err = qwen.CompatInputs(byName)
	require.NoError(t, err)
	assert.Equal(t, byName.Version, in.VLLMVersion)
}

func TestModelResolve(t *testing.T) {
	resolve := func(c RoleConfig, prof *protocol.Profile, compat *Compat, cache *Cache) (*DRAMCache, error) {
		c.Profile, c.Compat, c.Cache = *prof, *compat, *cache
		owned, err := c.resolveModel()
		*prof, *compat, *cache = c.Profile, c.Compat, c.Cache
		return owned, err
	}
	p16, _ := protocol.ProfileFor("0.16.0")
	p33, _ := protocol.ProfileFor("0.33.0")

	// The version picks the profile; the model gives the hash inputs and a cache.
	var prof protocol.Profile
	var compat Compat
	var cache Cache
	owned, err := resolve(RoleConfig{VLLMVersion: "0.33.0", Model: qwen, NumBlocks: 4, TPSize: 1}, &prof, &compat, &cache)
	require.NoError(t, err)
	require.NotNil(t, owned)
	defer owned.Close()
	assert.Equal(t, p33.Name, prof.Name)
	assert.Equal(t, "0.33.0", compat.VLLMVersion)
	assert.Equal(t, int64(8), compat.NumKVHeads)
	assert.Same(t, owned, cache)
	assert.Equal(t, layout.PlanPackedKV, cache.Geometry().Plan)

	// Compat given: kept as the override; a cache given: kept; no NumBlocks: no cache.
	prof, cache = protocol.Profile{}, nil
	compat = Compat{CompatInputs: protocol.CompatInputs{VLLMVersion: "0.16.0", Model: "other"}, SkipCheck: true}
	owned, err = resolve(RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 0, TPSize: 1}, &prof, &compat, &cache)
	require.NoError(t, err)
	assert.Nil(t, owned)
	assert.Nil(t, cache)
	assert.Equal(t, "other", compat.Model)

	// No model: only the profile is derived; the old way (Profile set, no version) is untouched.
	prof, compat = p16, Compat{}
	owned, err = resolve(RoleConfig{}, &prof, &compat, &cache)
	require.NoError(t, err)
	assert.Nil(t, owned)
	assert.Equal(t, p16.Name, prof.Name)
	assert.Empty(t, compat.VLLMVersion)

	// Conflicts and gaps are refused.
	prof = p16
	_, err = resolve(RoleConfig{VLLMVersion: "0.33.0"}, &prof, &compat, &cache)
	require.ErrorContains(t, err, "set one of them")
	prof = protocol.Profile{}
	_, err = resolve(RoleConfig{Model: qwen}, &prof, &compat, &cache)
	require.ErrorContains(t, err, "needs VLLMVersion")
	prof, _ = protocol.ProfileByName("0.16") // no Version: nothing to hash
	_, err = resolve(RoleConfig{Model: qwen}, &prof, &compat, &cache)
	require.ErrorContains(t, err, "needs VLLMVersion or Profile.Version")
	_, err = resolve(RoleConfig{VLLMVersion: "9.99.0"}, &prof, &compat, &cache)
	require.Error(t, err)

	// A Profile by name takes VLLMVersion as its Version; one from ProfileFor needs no VLLMVersion, and two
	// different version strings are refused.
	prof, compat = protocol.Profile{}, Compat{}
	prof, _ = protocol.ProfileByName("0.16")
	_, err = resolve(RoleConfig{VLLMVersion: "0.16.1", Model: qwen}, &prof, &compat, &cache)
	require.NoError(t, err)
	assert.Equal(t, "0.16.1", prof.Version)
	assert.Equal(t, "0.16.1", compat.VLLMVersion)
	prof, compat = p33, Compat{}
	_, err = resolve(RoleConfig{Model: qwen}, &prof, &compat, &cache)
	require.NoError(t, err)
	assert.Equal(t, "0.33.0", compat.VLLMVersion)
	prof, compat = p33, Compat{}
	_, err = resolve(RoleConfig{VLLMVersion: "0.33.1", Model: qwen}, &prof, &compat, &cache)
	require.ErrorContains(t, err, "set one of them")
}

// A role started from a Model creates its DRAM cache, serves it, and frees it after its agent on Close; the
// derived hash inputs are the release's defaults, so a Model-built decode role accepts a prefill role built
// the old way with the same values.
func TestModelRoles(t *testing.T) {
	lib := testLib(t)
	p, _ := protocol.ProfileFor("0.33.0")
	tiny := Model{Name: "example/tiny", Layers: 2, KVHeads: 2, HeadDim: 64, DType: layout.BF16}
	g, err := tiny.Geometry(p, 8, 1)
	require.NoError(t, err)
	in, err := tiny.CompatInputs(p)
	require.NoError(t, err)
	pcache := newCache(t, g)
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: lib, Cache: pcache, Compat: Compat{CompatInputs: in}}})
	require.NoError(t, err)
	defer pre.Close()
	dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: "0.33.0", Model: tiny, NumBlocks: 8, Library: lib}})
	require.NoError(t, err)
	own, ok := dec.Cache().(*DRAMCache)
	require.True(t, ok)
	assert.Equal(t, g, own.Geometry())
	assert.Equal(t, p.Name, dec.Profile().Name)
	assert.Regexp(t, "^gonixl-p-[0-9a-f]{16}$", pre.EngineID(), "a random engine id by default")
	assert.Regexp(t, "^gonixl-d-[0-9a-f]{16}$", dec.EngineID(), "a random engine id by default")

	ctx := testenv.Context(t, 10*time.Second)
	kv, err := pre.Hold(ctx, "r1", 2*g.BlockSize, nil)
	require.NoError(t, err)
	res, err := dec.Pull(ctx, "r1", kv, []int{1, 2})
	require.NoError(t, err)
	assert.Equal(t, 2, res.Blocks)

	require.NoError(t, dec.Close())
	assert.Nil(t, own.Bytes(), "the role frees the cache it created")
	require.NoError(t, dec.Close())

	// A role that does not start frees the cache it created at once (nothing is left to observe but errors).
	_, err = NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: "0.33.0", Model: tiny, NumBlocks: 8}})
	require.Error(t, err)
}
