package protocol

import (
	"encoding/hex"
	"math"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every decoder of network input has a fuzz target, seeded from testdata/vllm. The property besides "never
// panics" is that whatever decodes re-encodes, and the re-encoding decodes to the same value.

func seedHex(f *testing.F, add func(b []byte)) {
	for _, v := range loadVectors(f) {
		seedCases(v.Metadata, add)
		seedCases(v.MetadataDecode, add)
		seedCases(v.Payload, add)
		seedCases(v.Requests, add)
		seedCases(v.Clock, add)
	}
	for _, rv := range loadRealVectors(f) { // what vLLM's own connector sent
		b, _ := hex.DecodeString(rv.Handshake.PayloadHex)
		add(b)
		if hp, err := DecodeHandshakePayload(b); err == nil {
			add(hp.AgentMetadataBytes)
		}
	}
}

func seedCases[C interface{ bytes() []byte }](cases []C, add func(b []byte)) {
	for _, c := range cases {
		add(c.bytes())
	}
}

// seedEveryProfile adds b once per profile (the targets' second argument picks the profile).
func seedEveryProfile(f *testing.F, b []byte) {
	for i := range Profiles {
		f.Add(b, uint8(i))
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	seedHex(f, func(b []byte) { seedEveryProfile(f, b) })
	f.Fuzz(func(t *testing.T, b []byte, which uint8) {
		p := Profiles[int(which)%len(Profiles)]
		m, err := p.DecodeMetadata(b)
		if err != nil {
			return
		}
		requireRoundTrip(t, m, p.EncodeMetadata, p.DecodeMetadata)
	})
}

func FuzzDecodeHandshakePayload(f *testing.F) {
	seedHex(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, b []byte) {
		hp, err := DecodeHandshakePayload(b)
		if err != nil {
			return
		}
		requireRoundTrip(t, hp, encodeHandshakePayload, DecodeHandshakePayload)
		for _, p := range Profiles {
			_, _ = p.OpenHandshake(b, HandshakeCheck{LocalHash: hp.CompatibilityHash, EnforceHash: true})
		}
	})
}

func FuzzDecodeRequest(f *testing.F) {
	seedHex(f, func(b []byte) { seedEveryProfile(f, b) })
	f.Add([]byte("get_meta_msg"), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, which uint8) {
		p := Profiles[int(which)%len(Profiles)]
		req, err := p.DecodeRequest(b)
		if err != nil {
			return
		}
		enc, err := p.EncodeRequest(req.Rank)
		require.NoError(t, err)
		req2, err := p.DecodeRequest(enc)
		require.NoError(t, err)
		require.Equal(t, req.Rank, req2.Rank)
		require.False(t, req2.UnexpectedTag)
	})
}

func FuzzDecodeClock(f *testing.F) {
	seedHex(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeClock(b)
		if err != nil || math.IsNaN(c) || math.IsInf(c, 0) {
			return
		}
		requireRoundTrip(t, c, encodeClock, decodeClock)
	})
}

func FuzzDecodeParams(f *testing.F) {
	for _, v := range loadVectors(f) {
		for _, c := range v.Params {
			seedEveryProfile(f, []byte(c.JSON))
		}
	}
	for _, rv := range loadRealVectors(f) {
		seedEveryProfile(f, []byte(rv.KVTransferParams))
	}
	f.Add([]byte(PrefillRequestParams), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, which uint8) {
		p := Profiles[int(which)%len(Profiles)]
		k, err := p.DecodeParams(b)
		if err != nil {
			return
		}
		_ = k.ValidateForDecode()
		enc, err := p.EncodeParams(k)
		if err != nil {
			return // e.g. Extra holding a key the profile also writes
		}
		k2, err := p.DecodeParams(enc)
		require.NoError(t, err, "%s", enc)
		k.Has, k2.Has = nil, nil
		require.Equal(t, k.RemoteBlockIDs, k2.RemoteBlockIDs)
		require.Equal(t, k.RemoteRequestID, k2.RemoteRequestID)
		require.Equal(t, k.RemotePort, k2.RemotePort)
	})
}

func FuzzDecodeNotification(f *testing.F) {
	for _, v := range loadVectors(f) {
		for _, c := range v.Notifications {
			seedEveryProfile(f, []byte(c.Text))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, which uint8) {
		p := Profiles[int(which)%len(Profiles)]
		n, err := p.DecodeNotification(b)
		if err != nil {
			return
		}
		enc, err := p.EncodeNotification(n)
		if err != nil {
			require.True(t, n.IsHeartbeat(), "a decoded transfer notification must re-encode: %q", b)
			return
		}
		n2, err := p.DecodeNotification(enc)
		require.NoError(t, err)
		require.Equal(t, n, n2)
	})
}

// pyFloatRepr must always round-trip and use Python's notation switch points.
func FuzzPyFloatRepr(f *testing.F) {
	for _, x := range []float64{0, 1, 0.1, 1e16, 1e-5, 1e-4, 5e-324, math.MaxFloat64, -2.5e-7} {
		f.Add(x)
	}
	f.Fuzz(func(t *testing.T, x float64) {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		s := pyFloatRepr(x)
		y, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err, s)
		require.Equal(t, math.Float64bits(x), math.Float64bits(y), s)
	})
}

// A length claim far beyond the message (here a 3.5 GB bin in a short payload, found by FuzzInspect) must be
// refused from the header, without allocating what it claims.
func TestHostileLengthClaimsDoNotAllocate(t *testing.T) {
	for _, p := range Profiles {
		for name, msg := range map[string][]byte{
			"bin32":   append([]byte("\x81\xaeagent_metadata\xc6\xd0\x77\x00\x13"), make([]byte, 64)...),
			"str32":   append([]byte("\x81\xa9engine_id\xdb\xd0\x77\x00\x13"), make([]byte, 64)...),
			"array32": append([]byte("\x81\xb3kv_caches_base_addr\xdd\xd0\x77\x00\x13"), make([]byte, 64)...),
			"map32":   append([]byte("\xdf\xd0\x77\x00\x13"), make([]byte, 64)...),
			"unknown": append([]byte("\x81\xa3zzz\xc6\xd0\x77\x00\x13"), make([]byte, 64)...),
			"ext32":   append([]byte("\x81\xa3zzz\xc9\xd0\x77\x00\x13\x01"), make([]byte, 64)...),
		} {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := p.DecodeMetadata(msg)
			runtime.ReadMemStats(&after)
			require.ErrorIs(t, err, ErrMalformed, "%s %s", p.Name, name)
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "%s %s allocated what it claimed", p.Name, name)
		}
	}
}
