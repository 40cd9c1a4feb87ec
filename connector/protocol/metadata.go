package protocol

import (
	"fmt"
	"unicode/utf8"
)

// AgentMetadata is vLLM's NixlAgentMetadata with every field any supported release has. A profile's Schema
// picks which fields go on the wire and in which order; fields outside the schema are ignored when encoding
// and left at their zero value when decoding.
//
// Python ints are int64 here (uint64 for addresses). Optional Python fields ("X | None") are nil slices or nil
// pointers for None; a non-nil empty slice encodes as an empty list.
type AgentMetadata struct {
	EngineID         string   // engine_id: must equal kv_transfer_params.remote_engine_id
	AgentMetadata    []byte   // agent_metadata: the NIXL agent blob (nixl_agent.get_agent_metadata)
	KVCachesBaseAddr []uint64 // kv_caches_base_addr: one base address per registered region
	DeviceID         int64    // device_id
	NumBlocks        int64    // num_blocks (kernel blocks per region)
	BlockLens        []int64  // block_lens: bytes per block, per region
	BlockStrides     []int64  // block_strides (0.29+): bytes between consecutive blocks, per region
	KVCacheLayout    string   // kv_cache_layout: "HND"/"NHD" up to 0.28, "LBHNC"/"LBNHC" from 0.29 (Profile.Labels)
	BlockSize        int64    // block_size: tokens per kernel block
	SSMSizes         [2]int64 // ssm_sizes (0.18+): (conv bytes, ssm bytes); (0, 0) without Mamba layers
	AttnBackendName  string   // attn_backend_name (0.20+; before, it is only hashed)
	// PhysicalBlocksPerLogicalKVBlock (0.21+): logical --block-size ÷ kernel block size.
	PhysicalBlocksPerLogicalKVBlock int64
	RegionNumBlocks                 []int64    // region_num_blocks (0.30+), None = nil
	RegionGroupIDs                  []int64    // region_group_ids (0.30+), None = nil
	RegionNames                     []string   // region_names (0.30+), None = nil
	RegionMemTypes                  []string   // region_mem_types (0.30+), None = nil ("VRAM"/"DRAM" per region)
	DCPSize                         int64      // dcp_size (0.29+), Python default 1
	PCPSize                         int64      // pcp_size (0.29+), Python default 1
	PLEBlockLen                     *int64     // ple_block_len (0.32+), None = nil
	RegionMembers                   [][]string // region_members (0.31+): layer names sharing each region
	// PackedMemberLayouts (0.31+): member name → (byte offset in its region's block, bytes per page), in dict
	// (insertion) order.
	PackedMemberLayouts []PackedMemberLayout
}

// PackedMemberLayout is one entry of packed_member_layouts.
type PackedMemberLayout struct {
	Name      string
	Offset    int64
	PageBytes int64
}

// NewAgentMetadata returns metadata with the Python defaults of the fields that have one (dcp_size = pcp_size
// = 1, physical_blocks_per_logical_kv_block = 1); start from it rather than from the zero value.
func NewAgentMetadata() AgentMetadata {
	return AgentMetadata{DCPSize: 1, PCPSize: 1, PhysicalBlocksPerLogicalKVBlock: 1}
}

// HandshakePayload is vLLM's NixlHandshakePayload, the side-channel reply payload of every row: the
// compatibility hash and the msgpack of NixlAgentMetadata (Profile.DecodeMetadata decodes those bytes).
type HandshakePayload struct {
	CompatibilityHash  string
	AgentMetadataBytes []byte
}

// Schema is an ordered list of NixlAgentMetadata fields (declaration order = wire order) with their
// required/default flags. It is data: profiles share the field definitions and differ only in this list.
type Schema struct {
	name   string
	fields []*fieldDef
	byName map[string]*fieldDef
}

// Fields returns the wire names in order.
func (s Schema) Fields() []string {
	out := make([]string, len(s.fields))
	for i, f := range s.fields {
		out[i] = f.name
	}
	return out
}

// Required returns the wire names that have no default (a peer must send them).
func (s Schema) Required() []string {
	var out []string
	for _, f := range s.fields {
		if f.required {
			out = append(out, f.name)
		}
	}
	return out
}

type fieldDef struct {
	name     string
	required bool
	enc      func(w *writer, m *AgentMetadata) error
	dec      func(r *reader, m *AgentMetadata) error
	def      func(m *AgentMetadata) // applies the Python default when the key is absent
}

const objMeta = "NixlAgentMetadata"

func checkUTF8(field, s string) error {
	if !utf8.ValidString(s) {
		return invalid(objMeta, field, "string is not valid UTF-8")
	}
	return nil
}

// encList writes v as an array, each element by enc.
func encList[T any](w *writer, v []T, enc func(T) error) error {
	w.arrayLen(len(v))
	for _, x := range v {
		if err := enc(x); err != nil {
			return err
		}
	}
	return nil
}

// decList reads an array, each element by dec (given the field name); an empty list decodes as nil (nullable
// fields turn it back into a non-nil empty slice).
func decList[T any](r *reader, field string, dec func(field string) (T, error)) ([]T, error) {
	n, err := r.arrayLen(field)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([]T, 0, min(n, 1024))
	for range n {
		v, err := dec(field)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func encInts(w *writer, v []int64) {
	_ = encList(w, v, func(n int64) error { w.int(n); return nil })
}

func decInts(r *reader, field string) ([]int64, error) { return decList(r, field, r.int64) }

func encStrs(w *writer, field string, v []string) error {
	return encList(w, v, func(s string) error {
		if err := checkUTF8(field, s); err != nil {
			return err
		}
		w.str(s)
		return nil
	})
}

func decStrs(r *reader, field string) ([]string, error) { return decList(r, field, r.str) }

func strField(name string, get func(m *AgentMetadata) *string) *fieldDef {
	return &fieldDef{name: name, required: true,
		enc: func(w *writer, m *AgentMetadata) error {
			s := *get(m)
			if err := checkUTF8(name, s); err != nil {
				return err
			}
			w.str(s)
			return nil
		},
		dec: func(r *reader, m *AgentMetadata) (err error) { *get(m), err = r.str(name); return },
	}
}

func intField(name string, get func(m *AgentMetadata) *int64) *fieldDef {
	return &fieldDef{name: name, required: true,
		enc: func(w *writer, m *AgentMetadata) error { w.int(*get(m)); return nil },
		dec: func(r *reader, m *AgentMetadata) (err error) { *get(m), err = r.int64(name); return },
	}
}

func intsField(name string, get func(m *AgentMetadata) *[]int64) *fieldDef {
	return &fieldDef{name: name, required: true,
		enc: func(w *writer, m *AgentMetadata) error { encInts(w, *get(m)); return nil },
		dec: func(r *reader, m *AgentMetadata) (err error) { *get(m), err = decInts(r, name); return },
	}
}

// optional marks a field as having a Python default.
func optional(f *fieldDef, def func(m *AgentMetadata)) *fieldDef {
	f.required = false
	f.def = def
	return f
}

// nullable wraps a field whose Python type is "X | None" (nil slice = None, so a decoded empty list must
// become a non-nil empty slice: setEmpty does that when the decoded value is nil).
func nullable(f *fieldDef, isNil func(m *AgentMetadata) bool, setNil, setEmpty func(m *AgentMetadata)) *fieldDef {
	enc, dec := f.enc, f.dec
	f.enc = func(w *writer, m *AgentMetadata) error {
		if isNil(m) {
			w.nil()
			return nil
		}
		return enc(w, m)
	}
	f.dec = func(r *reader, m *AgentMetadata) error {
		if r.isNil() {
			setNil(m)
			return nil
		}
		if err := dec(r, m); err != nil {
			return err
		}
		if isNil(m) {
			setEmpty(m)
		}
		return nil
	}
	return f
}

// fieldDefs holds one definition per wire name; schemas refer to them by name.
var fieldDefs = buildFieldDefs()

func buildFieldDefs() map[string]*fieldDef {
	defs := map[string]*fieldDef{}
	def := func(f *fieldDef) { defs[f.name] = f }
	def(strField("engine_id", func(m *AgentMetadata) *string { return &m.EngineID }))
	def(&fieldDef{name: "agent_metadata", required: true,
		enc: func(w *writer, m *AgentMetadata) error { w.bin(m.AgentMetadata); return nil },
		dec: func(r *reader, m *AgentMetadata) (err error) { m.AgentMetadata, err = r.bin("agent_metadata"); return },
	})
	def(&fieldDef{name: "kv_caches_base_addr", required: true,
		enc: func(w *writer, m *AgentMetadata) error {
			return encList(w, m.KVCachesBaseAddr, func(a uint64) error { w.uint(a); return nil })
		},
		dec: func(r *reader, m *AgentMetadata) (err error) {
			m.KVCachesBaseAddr, err = decList(r, "kv_caches_base_addr", r.uint64)
			return err
		},
	})
	def(intField("device_id", func(m *AgentMetadata) *int64 { return &m.DeviceID }))
	def(intField("num_blocks", func(m *AgentMetadata) *int64 { return &m.NumBlocks }))
	def(intsField("block_lens", func(m *AgentMetadata) *[]int64 { return &m.BlockLens }))
	def(intsField("block_strides", func(m *AgentMetadata) *[]int64 { return &m.BlockStrides }))
	def(strField("kv_cache_layout", func(m *AgentMetadata) *string { return &m.KVCacheLayout }))
	def(intField("block_size", func(m *AgentMetadata) *int64 { return &m.BlockSize }))
	def(&fieldDef{name: "ssm_sizes", required: true,
		enc: func(w *writer, m *AgentMetadata) error { encInts(w, m.SSMSizes[:]); return nil },
		dec: func(r *reader, m *AgentMetadata) error {
			v, err := decInts(r, "ssm_sizes")
			if err != nil {
				return err
			}
			if len(v) != 2 {
				return malformed(objMeta, "ssm_sizes", "expected an array of length 2, got %d", len(v))
			}
			m.SSMSizes = [2]int64{v[0], v[1]}
			return nil
		},
	})
	def(strField("attn_backend_name", func(m *AgentMetadata) *string { return &m.AttnBackendName }))
	def(intField("physical_blocks_per_logical_kv_block", func(m *AgentMetadata) *int64 {
		return &m.PhysicalBlocksPerLogicalKVBlock
	}))
	for _, f := range []struct {
		name string
		get  func(m *AgentMetadata) *[]int64
	}{
		{"region_num_blocks", func(m *AgentMetadata) *[]int64 { return &m.RegionNumBlocks }},
		{"region_group_ids", func(m *AgentMetadata) *[]int64 { return &m.RegionGroupIDs }},
	} {
		get := f.get
		def(optional(nullable(intsField(f.name, get),
			func(m *AgentMetadata) bool { return *get(m) == nil },
			func(m *AgentMetadata) { *get(m) = nil },
			func(m *AgentMetadata) { *get(m) = []int64{} }),
			func(m *AgentMetadata) { *get(m) = nil }))
	}
	for _, f := range []struct {
		name string
		get  func(m *AgentMetadata) *[]string
	}{
		{"region_names", func(m *AgentMetadata) *[]string { return &m.RegionNames }},
		{"region_mem_types", func(m *AgentMetadata) *[]string { return &m.RegionMemTypes }},
	} {
		name, get := f.name, f.get
		def(optional(nullable(&fieldDef{name: name,
			enc: func(w *writer, m *AgentMetadata) error { return encStrs(w, name, *get(m)) },
			dec: func(r *reader, m *AgentMetadata) (err error) { *get(m), err = decStrs(r, name); return },
		},
			func(m *AgentMetadata) bool { return *get(m) == nil },
			func(m *AgentMetadata) { *get(m) = nil },
			func(m *AgentMetadata) { *get(m) = []string{} }),
			func(m *AgentMetadata) { *get(m) = nil }))
	}
	def(optional(intField("dcp_size", func(m *AgentMetadata) *int64 { return &m.DCPSize }),
		func(m *AgentMetadata) { m.DCPSize = 1 }))
	def(optional(intField("pcp_size", func(m *AgentMetadata) *int64 { return &m.PCPSize }),
		func(m *AgentMetadata) { m.PCPSize = 1 }))
	def(optional(&fieldDef{name: "ple_block_len",
		enc: func(w *writer, m *AgentMetadata) error {
			if m.PLEBlockLen == nil {
				w.nil()
			} else {
				w.int(*m.PLEBlockLen)
			}
			return nil
		},
		dec: func(r *reader, m *AgentMetadata) error {
			if r.isNil() {
				m.PLEBlockLen = nil
				return nil
			}
			v, err := r.int64("ple_block_len")
			if err != nil {
				return err
			}
			m.PLEBlockLen = &v
			return nil
		},
	}, func(m *AgentMetadata) { m.PLEBlockLen = nil }))
	def(optional(&fieldDef{name: "region_members",
		enc: func(w *writer, m *AgentMetadata) error {
			return encList(w, m.RegionMembers, func(names []string) error { return encStrs(w, "region_members", names) })
		},
		dec: func(r *reader, m *AgentMetadata) (err error) {
			m.RegionMembers, err = decList(r, "region_members", func(f string) ([]string, error) { return decStrs(r, f) })
			return err
		},
	}, func(m *AgentMetadata) { m.RegionMembers = nil }))
	def(optional(&fieldDef{name: "packed_member_layouts",
		enc: func(w *writer, m *AgentMetadata) error {
			seen := make(map[string]bool, len(m.PackedMemberLayouts))
			w.mapLen(len(m.PackedMemberLayouts))
			for _, p := range m.PackedMemberLayouts {
				if seen[p.Name] {
					return invalid(objMeta, "packed_member_layouts", "duplicate member %q (a Python dict has unique keys)", p.Name)
				}
				seen[p.Name] = true
				if err := checkUTF8("packed_member_layouts", p.Name); err != nil {
					return err
				}
				w.str(p.Name)
				encInts(w, []int64{p.Offset, p.PageBytes})
			}
			return nil
		},
		dec: func(r *reader, m *AgentMetadata) error {
			const f = "packed_member_layouts"
			n, err := r.mapLen(f)
			if err != nil || n == 0 {
				m.PackedMemberLayouts = nil
				return err
			}
			m.PackedMemberLayouts = make([]PackedMemberLayout, 0, min(n, 1024))
			index := map[string]int{}
			for i := 0; i < n; i++ {
				name, err := r.str(f)
				if err != nil {
					return err
				}
				v, err := decInts(r, f)
				if err != nil {
					return err
				}
				if len(v) != 2 {
					return malformed(objMeta, f, "expected an array of length 2 for %q, got %d", name, len(v))
				}
				e := PackedMemberLayout{Name: name, Offset: v[0], PageBytes: v[1]}
				if j, ok := index[name]; ok { // Python dict: a repeated key keeps its first position, last value
					m.PackedMemberLayouts[j] = e
					continue
				}
				index[name] = len(m.PackedMemberLayouts)
				m.PackedMemberLayouts = append(m.PackedMemberLayouts, e)
			}
			return nil
		},
	}, func(m *AgentMetadata) { m.PackedMemberLayouts = nil }))
	return defs
}

// newSchema builds a schema from wire names; it panics on an unknown name (a programming error in the table).
func newSchema(name string, fields ...string) Schema {
	s := Schema{name: name, byName: map[string]*fieldDef{}}
	for _, n := range fields {
		f, ok := fieldDefs[n]
		if !ok {
			panic("protocol: schema " + name + " names unknown field " + n)
		}
		s.fields = append(s.fields, f)
		s.byName[n] = f
	}
	return s
}

var (
	// schemaV016: vLLM 0.13–0.17 (NIXL_CONNECTOR_VERSION 1–2), read from 0.16.0's and 0.17.0's nixl_connector.py.
	schemaV016 = newSchema("0.13–0.17", "engine_id", "agent_metadata", "kv_caches_base_addr", "device_id",
		"num_blocks", "block_lens", "kv_cache_layout", "block_size")
	// schemaV018: 0.18–0.19 (still version 2): ssm_sizes appended (0.18.0's and 0.19.0's nixl_connector.py).
	schemaV018 = newSchema("0.18–0.19", append(schemaV016.Fields(), "ssm_sizes")...)
	// schemaV020: 0.20 (version 2): attn_backend_name appended (0.20.0's v1/nixl/metadata.py).
	schemaV020 = newSchema("0.20", append(schemaV018.Fields(), "attn_backend_name")...)
	// schemaV021: versions 3–7 (0.21–0.28): physical_blocks_per_logical_kv_block appended (0.21.0–0.28.0's
	// v1/nixl/metadata.py).
	schemaV021 = newSchema("0.21–0.28", append(schemaV020.Fields(), "physical_blocks_per_logical_kv_block")...)
	// schemaV029: version 9 (0.29): block_strides after block_lens; dcp_size, pcp_size (default 1) at the end.
	schemaV029 = newSchema("0.29", "engine_id", "agent_metadata", "kv_caches_base_addr", "device_id",
		"num_blocks", "block_lens", "block_strides", "kv_cache_layout", "block_size", "ssm_sizes",
		"attn_backend_name", "physical_blocks_per_logical_kv_block", "dcp_size", "pcp_size")
	// schemaV030: version 11 (0.30): region_num_blocks, region_group_ids, region_names, region_mem_types
	// (default None) before dcp_size.
	schemaV030 = newSchema("0.30", "engine_id", "agent_metadata", "kv_caches_base_addr", "device_id",
		"num_blocks", "block_lens", "block_strides", "kv_cache_layout", "block_size", "ssm_sizes",
		"attn_backend_name", "physical_blocks_per_logical_kv_block", "region_num_blocks", "region_group_ids",
		"region_names", "region_mem_types", "dcp_size", "pcp_size")
	// schemaV031: version 13 (0.31): region_members, packed_member_layouts (default empty) at the end.
	schemaV031 = newSchema("0.31", append(schemaV030.Fields(), "region_members", "packed_member_layouts")...)
	// schemaV032: versions 14–15 (0.32–0.33, identical): ple_block_len (default None) before region_members, read from
	// 0.32.0's and 0.33.0's v1/nixl/metadata.py.
	schemaV032 = newSchema("0.32–0.33", "engine_id", "agent_metadata", "kv_caches_base_addr", "device_id",
		"num_blocks", "block_lens", "block_strides", "kv_cache_layout", "block_size", "ssm_sizes",
		"attn_backend_name", "physical_blocks_per_logical_kv_block", "region_num_blocks", "region_group_ids",
		"region_names", "region_mem_types", "dcp_size", "pcp_size", "ple_block_len", "region_members",
		"packed_member_layouts")
)

// EncodeMetadata encodes m as msgspec encodes vLLM's NixlAgentMetadata dataclass for this profile: a msgpack
// map of the schema's fields in declaration order, smallest integer forms, bin for bytes, str for strings.
func (p Profile) EncodeMetadata(m AgentMetadata) ([]byte, error) {
	if len(p.Schema.fields) == 0 {
		return nil, fmt.Errorf("%w: profile %q has no metadata schema", ErrInvalid, p.Name)
	}
	w := newWriter()
	w.mapLen(len(p.Schema.fields))
	for _, f := range p.Schema.fields {
		w.str(f.name)
		if err := f.enc(w, &m); err != nil {
			return nil, err
		}
	}
	return w.bytes()
}

// DecodeMetadata decodes NixlAgentMetadata the way msgspec.msgpack.Decoder(NixlAgentMetadata) does: keys in any
// order, unknown keys skipped, a repeated key's last value wins, defaults for absent optional fields, and an
// ErrMissingField error naming the first absent required field. It never panics on any input.
func (p Profile) DecodeMetadata(b []byte) (AgentMetadata, error) {
	m, err := decodeMetadata(p.Schema, b)
	if err != nil {
		return AgentMetadata{}, err
	}
	return m, nil
}

func decodeMetadata(s Schema, b []byte) (AgentMetadata, error) {
	var m AgentMetadata
	r := newReader(b, objMeta)
	n, err := r.mapLen("")
	if err != nil {
		return m, err
	}
	seen := make(map[string]bool, len(s.fields))
	for i := 0; i < n; i++ {
		c, err := r.peek("")
		if err != nil {
			return m, err
		}
		key, err := r.str("")
		if err != nil {
			return m, malformed(objMeta, "", "map key must be str, got %s", codeName(c))
		}
		f, ok := s.byName[key]
		if !ok {
			if err := r.skip(key, 0); err != nil {
				return m, err
			}
			continue
		}
		if err := f.dec(r, &m); err != nil {
			return m, err
		}
		seen[key] = true
	}
	if err := r.end(); err != nil {
		return m, err
	}
	for _, f := range s.fields {
		if seen[f.name] {
			continue
		}
		if f.required {
			return m, &FieldError{Object: objMeta, Field: f.name, Err: ErrMissingField,
				Detail: fmt.Sprintf("the peer's NixlAgentMetadata lacks %q; it likely runs a vLLM release other than %s", f.name, s.name)}
		}
		f.def(&m)
	}
	return m, nil
}

const objPayload = "NixlHandshakePayload"

// EncodeHandshake builds the side-channel reply payload: msgpack(NixlHandshakePayload{hash, msgpack(m)}).
func (p Profile) EncodeHandshake(hash string, m AgentMetadata) ([]byte, error) {
	inner, err := p.EncodeMetadata(m)
	if err != nil {
		return nil, err
	}
	return encodeHandshakePayload(HandshakePayload{CompatibilityHash: hash, AgentMetadataBytes: inner})
}

// encodeHandshakePayload encodes the two-field NixlHandshakePayload dataclass.
func encodeHandshakePayload(hp HandshakePayload) ([]byte, error) {
	if !utf8.ValidString(hp.CompatibilityHash) {
		return nil, invalid(objPayload, "compatibility_hash", "string is not valid UTF-8")
	}
	w := newWriter()
	w.mapLen(2)
	w.str("compatibility_hash")
	w.str(hp.CompatibilityHash)
	w.str("agent_metadata_bytes")
	w.bin(hp.AgentMetadataBytes)
	return w.bytes()
}

// DecodeHandshakePayload decodes NixlHandshakePayload with msgspec's rules (both fields required). It needs no
// profile: the payload's shape is the same in every row (Profile.OpenHandshake also checks the hash and decodes
// the metadata).
func DecodeHandshakePayload(b []byte) (HandshakePayload, error) {
	var hp HandshakePayload
	r := newReader(b, objPayload)
	n, err := r.mapLen("")
	if err != nil {
		return hp, err
	}
	var haveHash, haveBytes bool
	for i := 0; i < n; i++ {
		key, err := r.str("")
		if err != nil {
			return hp, err
		}
		switch key {
		case "compatibility_hash":
			if hp.CompatibilityHash, err = r.str(key); err != nil {
				return hp, err
			}
			haveHash = true
		case "agent_metadata_bytes":
			if hp.AgentMetadataBytes, err = r.bin(key); err != nil {
				return hp, err
			}
			haveBytes = true
		default:
			if err := r.skip(key, 0); err != nil {
				return hp, err
			}
		}
	}
	if err := r.end(); err != nil {
		return hp, err
	}
	if !haveHash {
		return hp, &FieldError{Object: objPayload, Field: "compatibility_hash", Err: ErrMissingField}
	}
	if !haveBytes {
		return hp, &FieldError{Object: objPayload, Field: "agent_metadata_bytes", Err: ErrMissingField}
	}
	return hp, nil
}

// HandshakeCheck is what the handshake initiator (the decode side in pull mode) verifies, in vLLM's order.
type HandshakeCheck struct {
	// LocalHash is our own compatibility hash (Profile.CompatHash). Compared only when EnforceHash is set.
	LocalHash string
	// EnforceHash mirrors kv_connector_extra_config.enforce_handshake_compat (vLLM's default: true). Set it to
	// false to accept a peer whose hash differs (the opt-out); the metadata must still decode.
	EnforceHash bool
	// ExpectedEngineID is kv_transfer_params.remote_engine_id; "" skips the check.
	ExpectedEngineID string
	// LocalInputs, when set, are the inputs LocalHash was computed from: a mismatch error then lists our factor
	// dict as JSON and names any single default-able input whose other value would have matched the peer.
	LocalInputs *CompatInputs
}

// OpenHandshake does what vLLM's decode side does with a reply payload: decode the outer payload, compare the
// compatibility hash before touching the inner bytes, decode NixlAgentMetadata, check the engine id.
// Errors wrap ErrMalformed, ErrMissingField, ErrHashMismatch or ErrEngineMismatch.
func (p Profile) OpenHandshake(b []byte, c HandshakeCheck) (AgentMetadata, error) {
	hp, err := DecodeHandshakePayload(b)
	if err != nil {
		return AgentMetadata{}, fmt.Errorf("decode handshake payload (is the peer really vLLM %s?): %w", p.Name, err)
	}
	if c.EnforceHash && hp.CompatibilityHash != c.LocalHash {
		return AgentMetadata{}, fmt.Errorf("%w: local %s, remote %s; prefill and decode differ in vLLM version, "+
			"model, dtype, attention backend or cache dtype%s (set EnforceHash=false, like vLLM's "+
			"enforce_handshake_compat=false, to skip this check)", ErrHashMismatch, c.LocalHash, hp.CompatibilityHash,
			p.explainMismatch(c.LocalInputs, hp.CompatibilityHash))
	}
	m, err := p.DecodeMetadata(hp.AgentMetadataBytes)
	if err != nil {
		return AgentMetadata{}, fmt.Errorf("decode agent metadata: %w", err)
	}
	if c.ExpectedEngineID != "" && m.EngineID != c.ExpectedEngineID {
		return AgentMetadata{}, fmt.Errorf("%w: expected %q, received %q", ErrEngineMismatch, c.ExpectedEngineID, m.EngineID)
	}
	return m, nil
}
