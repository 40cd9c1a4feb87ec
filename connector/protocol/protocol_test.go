package protocol

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfileFor(t *testing.T) {
	for v, want := range map[string]string{
		"0.16.0": "0.16", "0.16.1": "0.16", "0.16.0.post1": "0.16", "0.16.0+cu129": "0.16", "v0.16.0": "0.16",
		"0.33.0": "0.33", "0.33.2+rocm": "0.33",
	} {
		p, err := ProfileFor(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, p.Name, v)
	}
	for _, v := range []string{"0.15.1", "0.15.0.post3", "0.34.0", "0.34.1", "1.0.0", "0.16.0rc1", "0.33.1.dev5+gabc",
		"0.20.2rc1.dev265+gdd6b3a5ef", "", "dev", "0.16.x", "0.16.0+", "0.16.0.post"} {
		_, err := ProfileFor(v)
		assert.ErrorIs(t, err, ErrUnknownVersion, v)
	}
	_, err := ProfileByName("0.99")
	assert.ErrorIs(t, err, ErrUnknownVersion)
	p, err := ProfileByName("0.33")
	require.NoError(t, err)
	assert.Contains(t, p.String(), "H4, connector v15")
}

// Every final release of vLLM 0.16–0.33 on PyPI (`pip index versions vllm`, 2026-11) and the row that speaks its
// protocol (read from each release's wheel; patch releases compared file by file with their series).
var pypiReleases = map[string]string{
	"0.16.0": "0.16", "0.17.0": "0.16", "0.17.1": "0.16",
	"0.18.0": "0.18", "0.18.1": "0.18", "0.19.0": "0.18", "0.19.1": "0.18",
	"0.20.0": "0.20", "0.20.1": "0.20", "0.20.2": "0.20",
	"0.21.0": "0.21",
	"0.22.0": "0.22", "0.22.1": "0.22",
	"0.23.0": "0.23", "0.24.0": "0.23", "0.25.0": "0.23", "0.25.1": "0.23",
	"0.26.0": "0.26", "0.27.0": "0.26", "0.27.1": "0.26",
	"0.28.0": "0.28", "0.29.0": "0.29", "0.30.0": "0.30", "0.31.0": "0.31", "0.32.0": "0.32", "0.33.0": "0.33",
}

func TestProfileForEveryRelease(t *testing.T) {
	covered := map[string]bool{}
	for v, want := range pypiReleases {
		for _, s := range []string{v, v + ".post1", v + "+cu129", "v" + v} {
			p, err := ProfileFor(s)
			require.NoError(t, err, s)
			assert.Equal(t, want, p.Name, s)
		}
		_, err := ProfileFor(v + "rc1")
		assert.ErrorIs(t, err, ErrUnknownVersion, "pre-releases are never guessed")
		covered[want] = true
	}
	for _, p := range Profiles {
		assert.True(t, covered[p.Name], "profile %s covers no listed release", p.Name)
	}
	// Rows are ordered and contiguous: no release between two rows falls through.
	for i := 1; i < len(Profiles); i++ {
		assert.Equal(t, Profiles[i-1].MaxVersion, Profiles[i].MinVersion, "%s → %s", Profiles[i-1].Name, Profiles[i].Name)
	}
}

func TestProfilesTableIsComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Profiles {
		assert.False(t, seen[p.Name], "duplicate profile %s", p.Name)
		seen[p.Name] = true
		assert.NotZero(t, p.Framing, p.Name)
		assert.NotEmpty(t, p.Schema.Fields(), p.Name)
		assert.Equal(t, p.Leases, p.LeaseDuration > 0, p.Name)
		assert.Equal(t, !p.Leases, p.AbortTimeout > 0, p.Name)
		for _, k := range p.ParamsKeys {
			_, ok := paramFields[k]
			assert.True(t, ok, "%s: params key %s", p.Name, k)
		}
		for _, k := range p.HashFactors {
			_, ok := hashFactor[k]
			assert.True(t, ok, "%s: hash factor %s", p.Name, k)
		}
		lo, err := parseVersion(p.MinVersion)
		require.NoError(t, err)
		hi, err := parseVersion(p.MaxVersion)
		require.NoError(t, err)
		assert.Negative(t, compareRelease(lo.release, hi.release))
	}
}

func TestOpenHandshakeChecks(t *testing.T) {
	for _, p := range Profiles {
		m := NewAgentMetadata()
		m.EngineID = "engine-a"
		m.AgentMetadata = []byte{1, 2, 3}
		b, err := p.EncodeHandshake("hash-a", m)
		require.NoError(t, err)

		got, err := p.OpenHandshake(b, HandshakeCheck{LocalHash: "hash-a", EnforceHash: true, ExpectedEngineID: "engine-a"})
		require.NoError(t, err)
		assert.Equal(t, m.EngineID, got.EngineID)

		_, err = p.OpenHandshake(b, HandshakeCheck{LocalHash: "hash-b", EnforceHash: true})
		assert.ErrorIs(t, err, ErrHashMismatch)
		assert.Contains(t, err.Error(), "EnforceHash=false")
		_, err = p.OpenHandshake(b, HandshakeCheck{LocalHash: "hash-b", EnforceHash: false})
		assert.NoError(t, err, "the enforce_handshake_compat=false opt-out")

		_, err = p.OpenHandshake(b, HandshakeCheck{ExpectedEngineID: "engine-b"})
		assert.ErrorIs(t, err, ErrEngineMismatch)

		_, err = p.OpenHandshake([]byte{0x80}, HandshakeCheck{})
		assert.ErrorIs(t, err, ErrMissingField)
	}
}

func TestCrossProfileMetadataFails(t *testing.T) {
	p16, _ := ProfileByName("0.16")
	p33, _ := ProfileByName("0.33")
	m := NewAgentMetadata()
	b16, err := p16.EncodeMetadata(m)
	require.NoError(t, err)
	_, err = p33.DecodeMetadata(b16)
	require.ErrorIs(t, err, ErrMissingField, "0.33 requires block_strides, which 0.16 lacks")
	assert.Contains(t, err.Error(), "block_strides")
	// 0.33 bytes carry every 0.16 field: an old decoder reads them (unknown keys skipped), like msgspec.
	b33, err := p33.EncodeMetadata(m)
	require.NoError(t, err)
	_, err = p16.DecodeMetadata(b33)
	require.NoError(t, err)
}

func TestEncodeRejectsInvalidUTF8(t *testing.T) {
	m := NewAgentMetadata()
	m.EngineID = "\xff"
	_, err := Profiles[0].EncodeMetadata(m)
	assert.ErrorIs(t, err, ErrInvalid)
	m = NewAgentMetadata()
	m.PackedMemberLayouts = []PackedMemberLayout{{Name: "a"}, {Name: "a"}}
	_, err = Profiles[len(Profiles)-1].EncodeMetadata(m)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = encodeHandshakePayload(HandshakePayload{CompatibilityHash: "\xfe"})
	assert.ErrorIs(t, err, ErrInvalid)
}

func TestRequestErrors(t *testing.T) {
	p16, _ := ProfileByName("0.16")
	p33, _ := ProfileByName("0.33")
	_, err := p16.EncodeRequest(Rank{PP: 1})
	assert.ErrorIs(t, err, ErrUnsupported)
	_, err = p33.EncodeRequest(Rank{TP: -1})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = p33.EncodeRequest(Rank{TP: MaxRank + 1})
	assert.ErrorIs(t, err, ErrInvalid)

	h2, err := p16.EncodeRequest(Rank{TP: 1})
	require.NoError(t, err)
	_, err = p33.DecodeRequest(h2)
	assert.ErrorIs(t, err, ErrMalformed, "an H2 request sent to an H4 server")
	_, err = p16.DecodeRequest([]byte(GetMetaMsg))
	assert.ErrorIs(t, err, ErrMalformed, "a raw get_meta_msg (a pre-0.16 H1 request) sent to an H2 server")
	_, err = p16.DecodeRequest(append(h2, 0))
	assert.ErrorIs(t, err, ErrMalformed)
	big := []byte{0x92, 0xc4, 0x0c}
	big = append(big, GetMetaMsg...)
	big = append(big, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	_, err = p16.DecodeRequest(big)
	assert.ErrorIs(t, err, ErrMalformed)

	_, err = p33.DecodeReply([][]byte{{0x80}})
	assert.ErrorIs(t, err, ErrMalformed, "vLLM 0.33 asserts two frames")
	_, err = p16.DecodeReply([][]byte{{0x80}, {0xcb}})
	assert.ErrorIs(t, err, ErrMalformed)
	_, err = encodeClock(math.NaN())
	assert.ErrorIs(t, err, ErrInvalid)
	c, err := decodeClock([]byte{0x05})
	require.NoError(t, err)
	assert.Equal(t, 5.0, c)
}

func TestNotifications(t *testing.T) {
	p16, _ := ProfileByName("0.16")
	p33, _ := ProfileByName("0.33")
	_, err := p16.EncodeHeartbeat([]string{"a"})
	assert.ErrorIs(t, err, ErrUnsupported, "no leases before 0.21")
	_, err = p33.EncodeHeartbeat([]string{"a,b"})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = p33.EncodeHeartbeat(nil)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = p33.EncodeNotification(Notification{RequestID: "HB:x", Count: 1})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = p33.EncodeNotification(Notification{RequestID: "r", Count: 0})
	assert.ErrorIs(t, err, ErrInvalid)

	// 0.16 reads "HB:a,b" as request "HB" with count "a,b": an error here, a logged error in vLLM.
	_, err = p16.DecodeNotification([]byte("HB:a,b"))
	assert.ErrorIs(t, err, ErrMalformed)
	for _, bad := range []string{"", "noColon", ":1", "r:", "r:x", "r:-1", "r:0", "r:1 ", "\xff:1"} {
		_, err := p33.DecodeNotification([]byte(bad))
		assert.ErrorIs(t, err, ErrMalformed, "%q", bad)
	}
	// The request id may itself contain ':'; the count is after the last one.
	n, err := p16.DecodeNotification([]byte("cmpl-a:b-0:4"))
	require.NoError(t, err)
	assert.Equal(t, Notification{RequestID: "cmpl-a:b-0", Count: 4}, n)

	// How many notifications P waits for.
	for _, c := range []struct {
		p               Profile
		count, pTP, exp int
	}{{p16, 1, 1, 1}, {p16, 4, 2, 2}, {p16, 2, 4, 1}, {p33, 3, 1, 3}, {p33, 1, 8, 1}} {
		got, err := c.p.ExpectedNotifications(Notification{RequestID: "r", Count: c.count}, c.pTP)
		require.NoError(t, err)
		assert.Equal(t, c.exp, got, "%s count %d pTP %d", c.p.Name, c.count, c.pTP)
	}
}

func TestParams(t *testing.T) {
	p16, _ := ProfileByName("0.16")
	p33, _ := ProfileByName("0.33")
	_, err := p16.DecodeParams([]byte(`{"remote_block_ids": [[1,2]]}`))
	assert.ErrorIs(t, err, ErrMalformed, "0.16 has flat block ids")
	_, err = p33.DecodeParams([]byte(`{"remote_block_ids": [1,2]}`))
	assert.ErrorIs(t, err, ErrMalformed, "0.33 has one list per KV-cache group")
	for _, bad := range []string{``, `[]`, `null`, `{"tp_size": 1.5}`, `{"remote_port": "5600"}`, `{} {}`, `{"do_remote_prefill": 1}`} {
		_, err := p33.DecodeParams([]byte(bad))
		assert.ErrorIs(t, err, ErrMalformed, bad)
	}

	k := KVTransferParams{DoRemotePrefill: true, RemoteBlockIDs: BlockIDs{{1, 2}, {3}}, RemoteEngineID: "e",
		RemoteRequestID: "r", RemoteHost: "h", RemotePort: 1, TPSize: 1}
	_, err = p16.EncodeParams(k)
	assert.ErrorIs(t, err, ErrInvalid, "two groups cannot be written flat")
	b, err := p33.EncodeParams(k)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(b), `{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1,2],[3]]`), string(b))
	assert.Contains(t, string(b), `"remote_blocks_expiry_time": null`)

	// A D's validation mirrors update_state_after_alloc.
	got, err := p16.DecodeParams([]byte(`{"do_remote_prefill": true, "remote_block_ids": [1], "remote_engine_id": "e", "remote_host": "h", "remote_port": 1}`))
	require.NoError(t, err)
	err = got.ValidateForDecode()
	assert.ErrorIs(t, err, ErrMissingField)
	assert.Contains(t, err.Error(), "remote_request_id")

	// Unknown keys survive a round trip.
	got, err = p16.DecodeParams([]byte(`{"do_remote_prefill": true, "remote_block_ids": [1], "x_custom": {"a": 1}}`))
	require.NoError(t, err)
	b, err = p16.EncodeParams(got)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"x_custom": {"a":1}`)
}

func TestFactorsNeedTheStrings(t *testing.T) {
	_, err := Profiles[0].CompatHash(CompatInputs{VLLMVersion: "0.16.0"})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = pyJSONDumps(map[string]any{"x": struct{}{}})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = pyJSONDumps("\xff")
	assert.ErrorIs(t, err, ErrInvalid)
}

// pyJSONDumps of the Go types the typed vectors (TestVectorsPyJSON) do not reach: every integer type, and
// []string, []int64 and []int, written as json.dumps writes ints and lists.
func TestPyJSONDumpsGoTypes(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{int(42), "42"}, {int8(-5), "-5"}, {int16(300), "300"}, {int32(-7), "-7"}, {int64(-1 << 62), "-4611686018427387904"},
		{uint(7), "7"}, {uint8(255), "255"}, {uint16(65535), "65535"}, {uint32(1 << 31), "2147483648"},
		{uint64(1 << 63), "9223372036854775808"},
		{[]string{"a", "\u00e9"}, `["a", "\u00e9"]`}, {[]string{}, "[]"}, {[]int64{1, -2}, "[1, -2]"}, {[]int{3}, "[3]"},
		{map[string]any{"b": []any{true, nil, []int{}}, "a": map[string]any{}}, `{"a": {}, "b": [true, null, []]}`},
	} {
		got, err := pyJSONDumps(c.v)
		require.NoError(t, err, "%#v", c.v)
		assert.Equal(t, c.want, got, "%#v", c.v)
	}
}

func TestDecodeNeverTrustsLengths(t *testing.T) {
	// Headers that claim huge lengths with no data behind them fail fast instead of allocating.
	for _, b := range [][]byte{
		{0xdf, 0xff, 0xff, 0xff, 0xff},
		{0x81, 0xa9, 'e', 'n', 'g', 'i', 'n', 'e', '_', 'i', 'd', 0xdb, 0xff, 0xff, 0xff, 0xff},
		{0x81, 0xae, 'a', 'g', 'e', 'n', 't', '_', 'm', 'e', 't', 'a', 'd', 'a', 't', 'a', 0xc6, 0xff, 0xff, 0xff, 0xff},
		{0x81, 0xb3, 'k', 'v', '_', 'c', 'a', 'c', 'h', 'e', 's', '_', 'b', 'a', 's', 'e', '_', 'a', 'd', 'd', 'r', 0xdd, 0xff, 0xff, 0xff, 0xff},
		append([]byte{0x81, 0xa1, 'z'}, []byte(strings.Repeat("\x91", 100))...),
	} {
		for _, p := range Profiles {
			_, err := p.DecodeMetadata(b)
			assert.ErrorIs(t, err, ErrMalformed, "%x", b)
		}
	}
}
