package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"iter"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

type vectorFile struct {
	VLLMVersion      string   `json:"vllm_version"`
	Profile          string   `json:"profile"`
	ConnectorVersion int      `json:"connector_version"`
	GetMetaMsg       string   `json:"get_meta_msg"`
	MetadataFields   []string `json:"metadata_fields"`
	// Wire: the row's facts; framing, leases and (where the wheel defines it there) layout were checked against
	// the wheel's source by gen_vectors.py, and params_keys was read from it.
	Wire struct {
		Framing      string   `json:"framing"`
		BlockIDsFlat bool     `json:"block_ids_flat"`
		Notif        string   `json:"notif"`
		Leases       bool     `json:"leases"`
		Layout       string   `json:"layout"`
		ParamsKeys   []string `json:"params_keys"`
		// LayoutNames are the kv_cache_layout names the release knows, RequiredLayout the one NixlConnector asks
		// for (what vLLM publishes by default).
		LayoutNames    []string `json:"layout_names"`
		RequiredLayout string   `json:"required_layout"`
		// HMADefault is is_hma_enabled for an ordinary model with NixlConnector and no HMA flag.
		HMADefault bool `json:"hma_default"`
	} `json:"wire"`
	Metadata []struct {
		Name   string          `json:"name"`
		Fields json.RawMessage `json:"fields"`
		hexCase
	} `json:"metadata"`
	MetadataDecode []struct {
		Name string `json:"name"`
		hexCase
		Error  *string         `json:"error"`
		Fields json.RawMessage `json:"fields"`
	} `json:"metadata_decode"`
	Payload []struct {
		Name     string `json:"name"`
		Hash     string `json:"hash"`
		Metadata string `json:"metadata"`
		hexCase
	} `json:"payload"`
	Requests []struct {
		PP, TP int
		hexCase
	} `json:"requests"`
	Clock []struct {
		Value string `json:"value"`
		hexCase
	} `json:"clock"`
	Hash []struct {
		Name       string          `json:"name"`
		Inputs     json.RawMessage `json:"inputs"`
		FactorKeys []string        `json:"factor_keys"`
		JSON       string          `json:"json"`
		SHA256     string          `json:"sha256"`
	} `json:"hash"`
	Params []struct {
		Name string `json:"name"`
		JSON string `json:"json"`
	} `json:"params"`
	Notifications []struct {
		Text      string   `json:"text"`
		Hex       string   `json:"hex"`
		RequestID string   `json:"request_id"`
		Count     int      `json:"count"`
		Heartbeat []string `json:"heartbeat"`
	} `json:"notifications"`
}

// hexCase is a vector's message as hex (the fuzz targets are seeded with every one).
type hexCase struct {
	Hex string `json:"hex"`
}

func (c hexCase) bytes() []byte {
	b, _ := hex.DecodeString(c.Hex)
	return b
}

// loadVectors returns every testdata/vllm/<version>/vectors.json; it fails when there are none.
func loadVectors(tb testing.TB) map[string]vectorFile {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "testdata", "vllm", "*", "vectors.json"))
	require.NoError(tb, err)
	require.NotEmpty(tb, files, "no vectors: run `make vectors`")
	out := map[string]vectorFile{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(tb, err)
		var v vectorFile
		require.NoError(tb, json.Unmarshal(b, &v), f)
		out[v.VLLMVersion] = v
	}
	return out
}

// vectorProfiles yields every vector file with the profile of its vLLM version.
func vectorProfiles(tb testing.TB) iter.Seq2[vectorFile, Profile] {
	files := loadVectors(tb)
	return func(yield func(vectorFile, Profile) bool) {
		for version, v := range files {
			p, err := ProfileFor(version)
			require.NoError(tb, err)
			if !yield(v, p) {
				return
			}
		}
	}
}

func unhex(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(tb, err)
	return b
}

func jsonBytes(b []byte) string {
	if len(b) <= 4096 {
		return hex.EncodeToString(b)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// metaFields renders m the way gen_vectors.py renders vLLM's dataclass (bytes as hex, tuples as lists).
func metaFields(m AgentMetadata) map[string]any {
	nullable := func(v any, isNil bool) any {
		if isNil {
			return nil
		}
		return v
	}
	ints := func(v []int64) []int64 {
		if v == nil {
			return []int64{}
		}
		return v
	}
	strs := func(v []string) []string {
		if v == nil {
			return []string{}
		}
		return v
	}
	members := [][]string{}
	for _, r := range m.RegionMembers {
		members = append(members, strs(r))
	}
	packed := map[string]any{}
	for _, p := range m.PackedMemberLayouts {
		packed[p.Name] = []int64{p.Offset, p.PageBytes}
	}
	addrs := make([]string, len(m.KVCachesBaseAddr))
	for i, a := range m.KVCachesBaseAddr {
		addrs[i] = strconv.FormatUint(a, 10)
	}
	var ple any
	if m.PLEBlockLen != nil {
		ple = *m.PLEBlockLen
	}
	return map[string]any{
		"engine_id": m.EngineID, "agent_metadata": jsonBytes(m.AgentMetadata),
		"kv_caches_base_addr": json.RawMessage("[" + strings.Join(addrs, ",") + "]"),
		"device_id":           m.DeviceID, "num_blocks": m.NumBlocks, "block_lens": ints(m.BlockLens),
		"block_strides": ints(m.BlockStrides), "kv_cache_layout": m.KVCacheLayout, "block_size": m.BlockSize,
		"ssm_sizes": m.SSMSizes[:], "attn_backend_name": m.AttnBackendName,
		"physical_blocks_per_logical_kv_block": m.PhysicalBlocksPerLogicalKVBlock,
		"region_num_blocks":                    nullable(m.RegionNumBlocks, m.RegionNumBlocks == nil),
		"region_group_ids":                     nullable(m.RegionGroupIDs, m.RegionGroupIDs == nil),
		"region_names":                         nullable(m.RegionNames, m.RegionNames == nil),
		"region_mem_types":                     nullable(m.RegionMemTypes, m.RegionMemTypes == nil),
		"dcp_size":                             m.DCPSize, "pcp_size": m.PCPSize, "ple_block_len": ple,
		"region_members": members, "packed_member_layouts": packed,
	}
}

// assertMetaFields compares m with the fields gen_vectors.py recorded for vLLM's NixlAgentMetadata.
func assertMetaFields(tb testing.TB, fields json.RawMessage, m AgentMetadata) {
	tb.Helper()
	var want map[string]json.RawMessage
	require.NoError(tb, json.Unmarshal(fields, &want))
	got := metaFields(m)
	for name, w := range want {
		assert.Equal(tb, normJSON(tb, w), normJSON(tb, got[name]), "field %s", name)
	}
}

// requireRoundTrip checks that v encodes to bytes that decode to v again, and returns the bytes.
func requireRoundTrip[T any](tb testing.TB, v T, enc func(T) ([]byte, error), dec func([]byte) (T, error)) []byte {
	tb.Helper()
	b, err := enc(v)
	require.NoError(tb, err)
	v2, err := dec(b)
	require.NoError(tb, err, "%x", b)
	require.Equal(tb, v, v2)
	return b
}

// normJSON re-reads JSON with exact numbers so that values compare structurally.
func normJSON(tb testing.TB, v any) any {
	tb.Helper()
	b, ok := v.(json.RawMessage)
	if !ok {
		var err error
		b, err = json.Marshal(v)
		require.NoError(tb, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	require.NoError(tb, d.Decode(&out))
	return out
}

func TestVectorsCoverEveryProfile(t *testing.T) {
	vf := loadVectors(t)
	for _, p := range Profiles {
		found := false
		for _, v := range vf {
			found = found || v.Profile == p.Name
		}
		assert.True(t, found, "profile %s has no vectors under testdata/vllm/", p.Name)
	}
}

func TestVectorsProfileTable(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		t.Run(v.VLLMVersion, func(t *testing.T) {
			assert.Equal(t, v.Profile, p.Name)
			// The schema row must equal the dataclass fields of vLLM's own NixlAgentMetadata, in order.
			assert.Equal(t, v.MetadataFields, p.Schema.Fields())
			assert.Equal(t, v.ConnectorVersion, p.ConnectorVersion)
			assert.Equal(t, GetMetaMsg, v.GetMetaMsg)
			// The rest of the row against what the wheel says (framing, leases, layout, kv_transfer_params keys
			// in request_finished's order) and what gen_vectors records for the row (block-id shape, notif).
			assert.Equal(t, v.Wire.Framing, p.Framing.String(), "framing")
			assert.Equal(t, v.Wire.Leases, p.Leases, "leases")
			assert.Equal(t, v.Wire.Layout, p.Layout.String(), "layout era")
			assert.Equal(t, v.Wire.ParamsKeys, p.ParamsKeys, "kv_transfer_params keys and order")
			// kv_cache_layout: the row's names are the release's, the first (published for HND blocks) is the one
			// NixlConnector requires, and every name round-trips.
			names := make([]string, len(p.Labels))
			for i, l := range p.Labels {
				names[i] = l.Name
			}
			assert.ElementsMatch(t, v.Wire.LayoutNames, names, "kv_cache_layout names")
			if assert.NotEmpty(t, p.Labels) {
				assert.Equal(t, v.Wire.RequiredLayout, p.Labels[0].Name, "the name vLLM publishes by default")
				hnd, err := p.LayoutName(layout.HND)
				require.NoError(t, err)
				assert.Equal(t, v.Wire.RequiredLayout, hnd)
			}
			for _, l := range p.Labels {
				o, err := p.ParseLayoutName(l.Name)
				if l.Order == 0 {
					assert.ErrorIs(t, err, layout.ErrInvalidGeometry, l.Name)
					continue
				}
				require.NoError(t, err)
				assert.Equal(t, l.Order, o)
			}
			assert.Equal(t, v.Wire.BlockIDsFlat, p.BlockIDs == BlockIDsFlat, "remote_block_ids shape")
			assert.Equal(t, map[string]NotifMeaning{"tp_size": NotifDecodeTPSize, "consumers": NotifConsumers}[v.Wire.Notif],
				p.Notif, "notification count meaning")
			if p.Leases {
				assert.Positive(t, p.LeaseDuration)
				assert.Zero(t, p.AbortTimeout)
			} else {
				assert.Positive(t, p.AbortTimeout)
			}
		})
	}
}

func TestVectorsMetadata(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		for _, c := range v.Metadata {
			t.Run(v.VLLMVersion+"/"+c.Name, func(t *testing.T) {
				raw := unhex(t, c.Hex)
				m, err := p.DecodeMetadata(raw)
				require.NoError(t, err)
				enc, err := p.EncodeMetadata(m)
				require.NoError(t, err)
				assert.Equal(t, c.Hex, hex.EncodeToString(enc), "re-encoding must be byte-identical to msgspec")

				assertMetaFields(t, c.Fields, m)
			})
		}
	}
}

func TestVectorsMetadataDecode(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		for _, c := range v.MetadataDecode {
			t.Run(v.VLLMVersion+"/"+c.Name, func(t *testing.T) {
				m, err := p.DecodeMetadata(unhex(t, c.Hex))
				if c.Error != nil {
					require.Error(t, err, "msgspec rejects this: %s", *c.Error)
					if field, ok := strings.CutPrefix(c.Name, "missing_"); ok {
						assert.ErrorIs(t, err, ErrMissingField)
						assert.Contains(t, err.Error(), field)
					} else {
						assert.ErrorIs(t, err, ErrMalformed)
					}
					return
				}
				require.NoError(t, err)
				assertMetaFields(t, c.Fields, m)
				// What we encode decodes back to the same values.
				requireRoundTrip(t, m, p.EncodeMetadata, p.DecodeMetadata)
			})
		}
	}
}

func TestVectorsPayload(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		meta := map[string]string{}
		for _, c := range v.Metadata {
			meta[c.Name] = c.Hex
		}
		for _, c := range v.Payload {
			t.Run(v.VLLMVersion+"/"+c.Name, func(t *testing.T) {
				hp, err := DecodeHandshakePayload(unhex(t, c.Hex))
				require.NoError(t, err)
				assert.Equal(t, c.Hash, hp.CompatibilityHash)
				assert.Equal(t, meta[c.Metadata], hex.EncodeToString(hp.AgentMetadataBytes))
				enc, err := encodeHandshakePayload(hp)
				require.NoError(t, err)
				assert.Equal(t, c.Hex, hex.EncodeToString(enc))

				m, err := p.OpenHandshake(unhex(t, c.Hex), HandshakeCheck{LocalHash: c.Hash, EnforceHash: true})
				require.NoError(t, err)
				enc, err = p.EncodeHandshake(c.Hash, m)
				require.NoError(t, err)
				assert.Equal(t, c.Hex, hex.EncodeToString(enc))
			})
		}
	}
}

func TestVectorsRequestsAndClock(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		for _, c := range v.Requests {
			r := Rank{PP: c.PP, TP: c.TP}
			enc, err := p.EncodeRequest(r)
			require.NoError(t, err)
			assert.Equal(t, c.Hex, hex.EncodeToString(enc), "%s request %v", v.VLLMVersion, r)
			got, err := p.DecodeRequest(unhex(t, c.Hex))
			require.NoError(t, err)
			assert.Equal(t, MetaRequest{Rank: r}, got)
		}
		for _, c := range v.Clock {
			f, err := strconv.ParseFloat(c.Value, 64)
			require.NoError(t, err)
			enc, err := encodeClock(f)
			require.NoError(t, err)
			assert.Equal(t, c.Hex, hex.EncodeToString(enc))
			got, err := decodeClock(enc)
			require.NoError(t, err)
			assert.Equal(t, f, got)
			frames, err := p.ReplyFrames([]byte("x"), f)
			require.NoError(t, err)
			rep, err := p.DecodeReply(frames)
			require.NoError(t, err)
			assert.Equal(t, p.Framing == FramingH4, rep.HasClock)
			if p.Framing == FramingH4 {
				assert.Equal(t, c.Hex, hex.EncodeToString(frames[1]))
			}
		}
	}
}

// jsonToAny converts json.Number to int64 (or *big.Int) / float64 as Python's json would have typed them.
func jsonToAny(v any) any {
	switch x := v.(type) {
	case json.Number:
		s := x.String()
		if strings.ContainsAny(s, ".eE") {
			f, _ := x.Float64()
			return f
		}
		if n, err := x.Int64(); err == nil {
			return n
		}
		b, _ := new(big.Int).SetString(s, 10)
		return b
	case []any:
		for i := range x {
			x[i] = jsonToAny(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = jsonToAny(x[k])
		}
	}
	return v
}

func TestVectorsHash(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		for _, c := range v.Hash {
			t.Run(v.VLLMVersion+"/"+c.Name, func(t *testing.T) {
				var in struct {
					VLLMVersion       string         `json:"vllm_version"`
					Model             string         `json:"model"`
					Dtype             string         `json:"dtype"`
					NumKVHeads        int64          `json:"num_kv_heads"`
					HeadSize          int64          `json:"head_size"`
					NumHiddenLayers   int64          `json:"num_hidden_layers"`
					AttnBackendName   string         `json:"attn_backend_name"`
					CacheDtype        string         `json:"cache_dtype"`
					CrossLayersBlocks bool           `json:"cross_layers_blocks"`
					HMAEnabled        bool           `json:"is_hma_enabled"`
					SpeculativeConfig map[string]any `json:"speculative_config"`
					TransferMode      string         `json:"transfer_mode"`
				}
				d := json.NewDecoder(bytes.NewReader(c.Inputs))
				d.UseNumber()
				require.NoError(t, d.Decode(&in))
				if in.SpeculativeConfig != nil {
					jsonToAny(in.SpeculativeConfig)
				}
				ci := CompatInputs{VLLMVersion: in.VLLMVersion, Model: in.Model, Dtype: in.Dtype, NumKVHeads: in.NumKVHeads,
					HeadSize: in.HeadSize, NumHiddenLayers: in.NumHiddenLayers, AttnBackendName: in.AttnBackendName,
					CacheDtype: in.CacheDtype, CrossLayersBlocks: in.CrossLayersBlocks, HMAEnabled: in.HMAEnabled,
					SpeculativeConfig: in.SpeculativeConfig, TransferMode: in.TransferMode}
				f, err := p.Factors(ci)
				require.NoError(t, err)
				keys := make([]string, 0, len(f))
				for k := range f {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				assert.Equal(t, c.FactorKeys, keys, "the profile's hash factors must be vLLM's")
				js, err := pyJSONDumps(f)
				require.NoError(t, err)
				assert.Equal(t, c.JSON, js)
				h, err := p.CompatHash(ci)
				require.NoError(t, err)
				assert.Equal(t, c.SHA256, h)
				// The defaults cases: naming the v.VLLMVersion, the platform and the model is enough.
				if pl, ok := map[string]Platform{"defaults_cuda": PlatformCUDA, "defaults_cpu": PlatformCPU}[c.Name]; ok {
					assert.Equal(t, v.Wire.HMADefault, p.Defaults.HMAEnabled, "the row's HMA default")
					d := p.DefaultCompatInputs(pl)
					require.Equal(t, in.VLLMVersion, d.VLLMVersion, "the version ProfileFor was given")
					d.Model, d.Dtype, d.NumKVHeads, d.HeadSize, d.NumHiddenLayers = in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers
					h, err := p.CompatHash(d)
					require.NoError(t, err)
					assert.Equal(t, c.SHA256, h, "DefaultCompatInputs(%q) of vLLM %s", pl, in.VLLMVersion)
					// A literal that leaves the backend and cache dtype empty gets them from the row too.
					d.AttnBackendName, d.CacheDtype, d.TransferMode = "", "", ""
					h, err = p.CompatHash(d)
					require.NoError(t, err)
					assert.Equal(t, c.SHA256, h, "empty strings take the row's defaults")
				}
			})
		}
	}
}

func TestVectorsParams(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		for _, c := range v.Params {
			t.Run(v.VLLMVersion+"/"+c.Name, func(t *testing.T) {
				k, err := p.DecodeParams([]byte(c.JSON))
				require.NoError(t, err)
				if c.Name == "proxy_to_prefill" {
					assert.True(t, k.DoRemoteDecode)
					assert.Nil(t, k.RemoteBlockIDs)
					assert.True(t, k.Has["remote_block_ids"])
					assert.Equal(t, normJSON(t, json.RawMessage(c.JSON)), normJSON(t, json.RawMessage(PrefillRequestParams)))
					return
				}
				require.NoError(t, k.ValidateForDecode())
				enc, err := p.EncodeParams(k)
				require.NoError(t, err)
				assert.Equal(t, normJSON(t, json.RawMessage(c.JSON)), normJSON(t, json.RawMessage(enc)))
				// Same key order as vLLM's dict (json.Unmarshal loses order, so compare the key sequence).
				assert.Equal(t, jsonKeys(t, c.JSON), jsonKeys(t, string(enc)))
			})
		}
	}
}

func jsonKeys(tb testing.TB, s string) []string {
	d := json.NewDecoder(strings.NewReader(s))
	var keys []string
	depth := 0
	expectKey := false
	for {
		tok, err := d.Token()
		if err != nil {
			break
		}
		switch x := tok.(type) {
		case json.Delim:
			switch x {
			case '{', '[':
				depth++
				expectKey = x == '{' && depth == 1
			case '}', ']':
				depth--
				expectKey = depth == 1
			}
			continue
		case string:
			if depth == 1 && expectKey {
				keys = append(keys, x)
				expectKey = false
				continue
			}
		}
		if depth == 1 {
			expectKey = true
		}
	}
	return keys
}

func TestVectorsNotifications(t *testing.T) {
	for v, p := range vectorProfiles(t) {
		for _, c := range v.Notifications {
			n, err := p.DecodeNotification(unhex(t, c.Hex))
			require.NoError(t, err, c.Text)
			want := Notification{RequestID: c.RequestID, Count: c.Count, Heartbeat: c.Heartbeat}
			assert.Equal(t, want, n)
			enc, err := p.EncodeNotification(n)
			require.NoError(t, err)
			assert.Equal(t, c.Hex, hex.EncodeToString(enc))
		}
	}
}

type typedValue struct {
	Null  *bool                `json:"null"`
	Bool  *bool                `json:"bool"`
	Int   *string              `json:"int"`
	Float *string              `json:"float"`
	Str   *string              `json:"str"`
	List  []typedValue         `json:"list"`
	Dict  [][2]json.RawMessage `json:"dict"`
}

func (tv typedValue) value(tb testing.TB) any {
	switch {
	case tv.Null != nil:
		return nil
	case tv.Bool != nil:
		return *tv.Bool
	case tv.Int != nil:
		if n, err := strconv.ParseInt(*tv.Int, 10, 64); err == nil {
			return n
		}
		if n, err := strconv.ParseUint(*tv.Int, 10, 64); err == nil {
			return n
		}
		b, ok := new(big.Int).SetString(*tv.Int, 10)
		require.True(tb, ok)
		return b
	case tv.Float != nil:
		f, err := strconv.ParseFloat(*tv.Float, 64)
		if err != nil { // Python's float.hex() writes "inf", "-inf", "nan"
			f, err = strconv.ParseFloat(strings.TrimSuffix(*tv.Float, "inity"), 64)
		}
		require.NoError(tb, err, *tv.Float)
		return f
	case tv.Str != nil:
		return *tv.Str
	case tv.List != nil:
		out := make([]any, len(tv.List))
		for i, e := range tv.List {
			out[i] = e.value(tb)
		}
		return out
	case tv.Dict != nil:
		out := map[string]any{}
		for _, kv := range tv.Dict {
			var k string
			require.NoError(tb, json.Unmarshal(kv[0], &k))
			var e typedValue
			require.NoError(tb, json.Unmarshal(kv[1], &e))
			out[k] = e.value(tb)
		}
		return out
	}
	tb.Fatalf("empty typed value")
	return nil
}

func TestVectorsPyJSON(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "testdata", "vllm", "pyjson.json"))
	require.NoError(t, err)
	var doc struct {
		Cases []struct {
			Typed typedValue `json:"typed"`
			JSON  string     `json:"json"`
		} `json:"cases"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.NotEmpty(t, doc.Cases)
	for _, c := range doc.Cases {
		got, err := pyJSONDumps(c.Typed.value(t))
		require.NoError(t, err)
		assert.Equal(t, c.JSON, got)
	}
}
