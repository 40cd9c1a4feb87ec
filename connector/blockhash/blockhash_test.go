package blockhash

import (
	"bytes"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGoldenVectors checks the Go hashes against vLLM's, recorded by TestVLLMOracle from every release venv
// (testdata/vectors.json), without any venv.
func TestGoldenVectors(t *testing.T) {
	vectors := readVectors(t)
	require.NotEmpty(t, vectors)
	names := make([]string, 0, len(vectors))
	for name := range vectors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		out := vectors[name]
		t.Run(name, func(t *testing.T) { checkRelease(t, out.VLLMVersion, out) })
	}
}

// Every row's series was read in some venv the golden vectors come from.
func TestReleasesRecorded(t *testing.T) {
	seen := map[string]bool{}
	for _, out := range readVectors(t) {
		rel, err := ReleaseFor(out.VLLMVersion)
		require.NoError(t, err)
		seen[rel.Name] = true
	}
	for _, r := range Releases {
		assert.True(t, seen[r.Name], "row %s has no golden vectors", r.Name)
	}
}

func TestReleaseFor(t *testing.T) {
	for version, want := range map[string]string{
		"0.16.0": "0.16", "0.16.0.post1": "0.16", "0.20.1+cpu": "0.16", "0.26.0": "0.16",
		"0.18.0": "0.16", "0.29.0": "0.29", "0.31.0": "0.31", "0.32.0": "0.31", "0.33.1+cu129": "0.31",
	} {
		r, err := ReleaseFor(version)
		require.NoError(t, err, version)
		assert.Equal(t, want, r.Name, version)
	}
	for _, version := range []string{"0.17.0", "0.19.0", "0.30.0", "0.33.0rc1", "garbage", ""} {
		_, err := ReleaseFor(version)
		assert.ErrorIs(t, err, ErrUnknownVersion, version)
	}
	_, err := ReleaseByName("0.99")
	assert.ErrorIs(t, err, ErrUnknownVersion)
	r, err := ReleaseByName("0.29")
	require.NoError(t, err)
	assert.Equal(t, "vllm-none-hash", r.DefaultSeed)
}

func TestNewErrors(t *testing.T) {
	r016, _ := ReleaseByName("0.16")
	r032, _ := ReleaseByName("0.31")
	for _, c := range []struct {
		cfg  Config
		want error
	}{
		{Config{BlockSize: 16}, ErrInvalid},
		{Config{Release: r032}, ErrInvalid},
		{Config{Release: r032, BlockSize: 16, Algo: "md5"}, ErrInvalid},
		{Config{Release: r032, BlockSize: 16, Algo: XXHash}, ErrUnsupported},
		{Config{Release: r032, BlockSize: 16, Algo: XXHashCBOR, PythonHashSeed: ptr("0")}, ErrUnsupported},
		{Config{Release: r016, BlockSize: 16}, ErrNotReproducible},
		{Config{Release: r016, BlockSize: 16, Algo: SHA256CBOR}, ErrNotReproducible},
		{Config{Release: r016, BlockSize: 16, PythonHashSeed: ptr("\xff")}, ErrInvalid},
	} {
		_, err := New(c.cfg)
		assert.ErrorIs(t, err, c.want, "%+v", c.cfg)
	}
	h, err := New(Config{Release: r032, BlockSize: 16})
	require.NoError(t, err)
	assert.Equal(t, SHA256, h.Algo())
	assert.Equal(t, "vllm-none-hash", h.Seed())
	assert.Equal(t, 16, h.BlockSize())
}

// Append continues a chain as vLLM's hasher does when a request grows: the same hashes as hashing it whole.
func TestAppend(t *testing.T) {
	r, _ := ReleaseByName("0.31")
	h, err := New(Config{Release: r, BlockSize: 4})
	require.NoError(t, err)
	toks := tokens(23, 9, 151936)
	whole, err := h.Hashes(toks, "salt")
	require.NoError(t, err)
	require.Len(t, whole, 5)
	part, err := h.Hashes(toks[:9], "salt")
	require.NoError(t, err)
	require.Len(t, part, 2)
	all, err := h.Append(part, toks, "salt")
	require.NoError(t, err)
	assert.Equal(t, whole, all)
	// The salt only enters the first block: a chain continued without it is the same.
	all2, err := h.Append(part, toks, "")
	require.NoError(t, err)
	assert.Equal(t, whole, all2)
	unsalted, err := h.Hashes(toks, "")
	require.NoError(t, err)
	assert.NotEqual(t, whole[0], unsalted[0])

	_, err = h.Append(whole, toks[:10], "")
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = h.Hashes(toks, "\xff")
	assert.ErrorIs(t, err, ErrInvalid)
	none, err := h.Hashes(toks[:3], "")
	require.NoError(t, err)
	assert.Empty(t, none)
}

// The encoders' byte forms for a small value, as CPython 3.11's pickle and cbor2 6.3 write them.
func TestPayloads(t *testing.T) {
	parent := bytes.Repeat([]byte{'x'}, 32)
	v := tupleVal(bytesVal(parent), intsVal([]int64{1, 300, 70000, 1 << 31, -1}), value{})
	p, err := picklePayload(v)
	require.NoError(t, err)
	want := "80059540000000000000004320" + "7878787878787878787878787878787878787878787878787878787878787878" +
		"94284b014d2c014a701101008a0500000080004affffffff74944e87942e"
	assert.Equal(t, want, hexs(p))
	assert.Equal(t, "835820"+"7878787878787878787878787878787878787878787878787878787878787878"+
		"850119012c1a000111701a8000000020f6", hexs(cborPayload(v)))
	p, err = picklePayload(strVal("0"))
	require.NoError(t, err)
	assert.Equal(t, "80059505000000000000008c0130942e", hexs(p))
}
