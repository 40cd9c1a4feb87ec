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
		for _, c := range v.Metadata {
			b, _ := hex.DecodeString(c.Hex)
			add(b)
		}
		for _, c := range v.MetadataDecode {
			b, _ := hex.DecodeString(c.Hex)
			add(b)
		}
		for _, c := range v.Payload {
			b, _ := hex.DecodeString(c.Hex)
			add(b)
		}
		for _, c := range v.Requests {
			b, _ := hex.DecodeString(c.Hex)
			add(b)
		}
		for _, c := range v.Clock {
			b, _ := hex.DecodeString(c.Hex)
			add(b)
		}
	}
	for _, rv := range loadRealVectors(f) { // what vLLM's own connector sent
		b, _ := hex.DecodeString(rv.Handshake.PayloadHex)
		add(b)
		if hp, err := DecodeHandshakePayload(b); err == nil {
			add(hp.AgentMetadataBytes)
		}
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	seedHex(f, func(b []byte) {
		for i := range Profiles {
			f.Add(b, uint8(i))
		}
	})
	f.Fuzz(func(t *testing.T, b []byte, which uint8) {
		p := Profiles[int(which)%len(Profiles)]
		m, err := p.DecodeMetadata(b)
		if err != nil {
			return
		}
		enc, err := p.EncodeMetadata(m)
		require.NoError(t, err)
		m2, err := p.DecodeMetadata(enc)
		require.NoError(t, err)
		require.Equal(t, m, m2)
	})
}

func FuzzDecodeHandshakePayload(f *testing.F) {
	seedHex(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, b []byte) {
		hp, err := DecodeHandshakePayload(b)
		if err != nil {
			return
		}
		enc, err := EncodeHandshakePayload(hp)
		require.NoError(t, err)
		hp2, err := DecodeHandshakePayload(enc)
		require.NoError(t, err)
		require.Equal(t, hp, hp2)
		for _, p := range Profiles {
			_, _ = p.OpenHandshake(b, HandshakeCheck{LocalHash: hp.CompatibilityHash, EnforceHash: true})
		}
	})
}

func FuzzDecodeRequest(f *testing.F) {
	seedHex(f, func(b []byte) {
		for i := range Profiles {
			f.Add(b, uint8(i))
		}
	})
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
		c, err := DecodeClock(b)
		if err != nil || math.IsNaN(c) || math.IsInf(c, 0) {
			return
		}
		enc, err := EncodeClock(c)
		require.NoError(t, err)
		c2, err := DecodeClock(enc)
		require.NoError(t, err)
		require.Equal(t, c, c2)
	})
}

func FuzzDecodeParams(f *testing.F) {
	for _, v := range loadVectors(f) {
		for _, c := range v.Params {
			for i := range Profiles {
				f.Add([]byte(c.JSON), uint8(i))
			}
		}
	}
	for _, rv := range loadRealVectors(f) {
		for i := range Profiles {
			f.Add([]byte(rv.KVTransferParams), uint8(i))
		}
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
			for i := range Profiles {
				f.Add([]byte(c.Text), uint8(i))
			}
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

// PyFloatRepr must always round-trip and use Python's notation switch points.
func FuzzPyFloatRepr(f *testing.F) {
	for _, x := range []float64{0, 1, 0.1, 1e16, 1e-5, 1e-4, 5e-324, math.MaxFloat64, -2.5e-7} {
		f.Add(x)
	}
	f.Fuzz(func(t *testing.T, x float64) {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		s := PyFloatRepr(x)
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
