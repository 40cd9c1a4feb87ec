package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Framing is the side-channel request/reply format. The names follow the order in which vLLM introduced the
// formats (H1–H4); only H2 and H4 were in a final release from 0.16 on, so only they are here (H1, one raw
// "get_meta_msg" listener per TP rank, predates 0.16; H3, H4's request with a one-frame reply, never shipped
// in a release).
type Framing int

const (
	// FramingH2: the request is msgpack [bin "get_meta_msg", tp_rank]; the reply is one frame.
	FramingH2 Framing = iota + 1 // H2
	// FramingH4: the request is msgpack [bin "get_meta_msg", pp_rank, tp_rank]; the reply has a second frame,
	// msgpack float64 of the server's monotonic clock.
	FramingH4 // H4
)

// BlockIDsShape is how kv_transfer_params.remote_block_ids is shaped in JSON.
type BlockIDsShape int

const (
	// BlockIDsFlat: [1, 2, 3].
	BlockIDsFlat BlockIDsShape = iota + 1
	// BlockIDsGrouped: one list per KV-cache group, [[1, 2, 3]] for a plain model.
	BlockIDsGrouped
)

// NotifMeaning says what the number after the last ':' of a transfer notification means.
type NotifMeaning int

const (
	// NotifDecodeTPSize: "<remote_request_id>:<D's TP size>"; P derives how many notifications to wait for.
	NotifDecodeTPSize NotifMeaning = iota + 1
	// NotifConsumers: "<remote_request_id>:<expected consumers>"; P waits for exactly that many.
	NotifConsumers
)

// LayoutEra is the FLASH_ATTN KV-cache layout era of the vLLM side: it decides the region plan and
// the descriptor math. It is carried here so that the whole version-dependent picture lives in one table row.
type LayoutEra int

const (
	// LayoutA: per layer (2, num_blocks, block_size, H, D); K and V are separate regions.
	LayoutA LayoutEra = iota + 1 // A
	// LayoutB: per layer (num_blocks, 2, block_size, H, D); one region per layer, K/V halves per block.
	LayoutB // B
	// LayoutC: per layer (num_blocks, H, block_size, 2·D); K and V packed in the last dim.
	LayoutC // C
)

// Profile is everything version-dependent about vLLM's NixlConnector wire protocol, as one value. A Profile is
// immutable data; it is safe to copy and to use from many goroutines.
//
// Supporting another vLLM release means adding a row to Profiles (and vectors under testdata/vllm/<version>/),
// not new code paths.
type Profile struct {
	// Name is the version series, e.g. "0.16".
	Name string
	// MinVersion (inclusive) and MaxVersion (exclusive) bound the final releases this profile covers.
	MinVersion, MaxVersion string
	// Version is the vLLM version string of the side whose compatibility hash we reproduce (vllm.__version__,
	// hashed as "vllm_version"), exactly as ProfileFor was given it; the hash inputs take it from here
	// (DefaultCompatInputs, and Factors when CompatInputs.VLLMVersion is empty), so the version is stated once.
	// The rows of Profiles and ProfileByName leave it empty: a row spans several releases, and no release's
	// string can stand for a dev build's, so set it to the peer's exact string then.
	Version string

	// Framing is the side-channel request/reply format. In every row the reply payload is
	// msgpack(NixlHandshakePayload{compatibility_hash, agent_metadata_bytes}) (vLLM's M1; the bare metadata, M0,
	// predates 0.16).
	Framing Framing
	// Schema lists NixlAgentMetadata's fields in declaration (= wire) order.
	Schema Schema
	// ConnectorVersion is vLLM's NIXL_CONNECTOR_VERSION, hashed as "nixl_connector_version".
	ConnectorVersion int
	// HashFactors lists the keys of the compatibility-hash factor dict (order is irrelevant: they are sorted).
	HashFactors []string

	BlockIDs BlockIDsShape
	// ParamsKeys lists the keys P's kv_transfer_params response carries, in vLLM's dict order.
	ParamsKeys []string
	Notif      NotifMeaning
	// Leases: P frees unread blocks after LeaseDuration unless D sends "HB:" heartbeats; without leases P frees
	// them after AbortTimeout (VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
	Leases            bool
	LeaseDuration     time.Duration // kv_lease_duration default
	HeartbeatInterval time.Duration // D sends heartbeats this often (kv_lease_duration // 6)
	LeaseExtension    time.Duration // a heartbeat extends a lease to now + this (kv_lease_duration * 2 // 3)
	AbortTimeout      time.Duration // without leases

	Layout LayoutEra
	// SideChannelPort is VLLM_NIXL_SIDE_CHANNEL_PORT's default (the engine adds its DP index).
	SideChannelPort int
	// HandshakeTimeout is vLLM's REQ receive timeout (RCVTIMEO) on the decode side.
	HandshakeTimeout time.Duration

	// Labels are the kv_cache_layout names of this release with the block order each stands for; the first is
	// the one vLLM publishes by default (NixlConnector.get_required_kvcache_layout). See LayoutName and
	// ParseLayoutName.
	Labels []LayoutLabel
	// LabelQuirks are the known vLLM configurations of this release whose label is not their bytes' order.
	LabelQuirks []LabelQuirk
	// Defaults are the compatibility-hash inputs this release uses when its user sets nothing
	// (DefaultCompatInputs).
	Defaults CompatDefaults
}

// The hash-factor and kv_transfer_params key lists of the rows, each named by the first release series that
// has it (rows share them; order matters only for ParamsKeys).
var (
	hashFactorsV016 = []string{"vllm_version", "nixl_connector_version", "model", "dtype", "num_kv_heads", "head_size", "num_hidden_layers", "attn_backend_name", "cache_dtype", "cross_layers_blocks"}
	paramsKeysV016  = []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size"}
	hashFactorsV018 = []string{"vllm_version", "nixl_connector_version", "model", "dtype", "num_kv_heads", "head_size", "num_hidden_layers", "attn_backend_name", "cache_dtype", "cross_layers_blocks", "is_hma_enabled"}
	paramsKeysV021  = []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size", "remote_num_tokens"}
	paramsKeysV026  = []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size", "remote_num_tokens", "remote_blocks_expiry_time"}
	hashFactorsV028 = []string{"vllm_version", "nixl_connector_version", "model", "dtype", "num_kv_heads", "head_size", "num_hidden_layers", "attn_backend_name", "cache_dtype", "cross_layers_blocks", "is_hma_enabled", "speculative_config", "transfer_mode"}
	paramsKeysV028  = []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size", "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode"}
	hashFactorsV029 = []string{"vllm_version", "nixl_connector_version", "model", "dtype", "num_kv_heads", "head_size", "num_hidden_layers", "attn_backend_name", "cache_dtype", "is_hma_enabled", "speculative_config", "transfer_mode"}
	paramsKeysV029  = []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode"}
	// paramsKeysV031: from 0.31 the scheduler (vllm/v1/core/sched/scheduler.py, update_from_output) appends
	// remote_prefill_cached_tokens (P's prefix-cache hits) to what request_finished returned.
	paramsKeysV031 = append(append([]string(nil), paramsKeysV029...), "remote_prefill_cached_tokens")
	paramsKeysV033 = []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens", "remote_blocks_expiry_time", "remote_registration_generation", "transfer_mode", "remote_prefill_cached_tokens"}
)

// Profiles is the table of supported vLLM releases, oldest first. Each row was read from its releases' wheels
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py up to 0.19, the v1/nixl/ package from 0.20;
// vllm/envs.py; vllm/v1/attention/backends/flash_attn.py and, from 0.29, vllm/v1/kv_cache_layout.py). A row
// spans several releases only where their connector sources are identical (patch releases were compared file
// by file). What changes from one row to the next:
//
//	0.16–0.17  H2, version 2, flat remote_block_ids, layout A, abort timeout 480 s
//	0.18–0.19  + ssm_sizes; hash + is_hma_enabled; remote_block_ids one list per KV-cache group
//	0.20       + attn_backend_name (last metadata field)
//	           (all three: hash default is_hma_enabled false, vLLM turns HMA off when a connector is set)
//	0.21       version 3: + physical_blocks_per_logical_kv_block; params + remote_num_tokens
//	0.22       version 4: leases and "HB:" heartbeats replace the abort timeout; HMA stays on with
//	           NixlConnector (SupportsHMA), so is_hma_enabled defaults to true
//	0.23–0.25  layout B (blocks first, K/V halves per block)
//	0.26–0.27  version 5: H4 (pp rank in the request, clock frame); layout C; params + remote_blocks_expiry_time
//	0.28       version 7: hash + speculative_config, transfer_mode; params + transfer_mode
//	0.29       version 9: + block_strides, dcp_size, pcp_size; hash − cross_layers_blocks; params + dcp_size,
//	           pp_size; the notification count is the number of consumers; kv_cache_layout names become
//	           KVCacheLayout enum names ("LBHNC" for HND blocks, "LBNHC" for NHD)
//	0.30       version 11: + region_num_blocks, region_group_ids, region_names, region_mem_types
//	0.31       version 13: + region_members, packed_member_layouts; params + remote_prefill_cached_tokens
//	           (appended by the scheduler)
//	0.32       version 14: + ple_block_len
//	0.33       version 15: params + remote_registration_generation (before transfer_mode)
var Profiles = []Profile{
	{
		Name: "0.16", MinVersion: "0.16.0", MaxVersion: "0.18.0",
		Framing:          FramingH2,
		Schema:           schemaV016,
		ConnectorVersion: 2,
		HashFactors:      hashFactorsV016,
		BlockIDs:         BlockIDsFlat,
		ParamsKeys:       paramsKeysV016,
		Notif:            NotifDecodeTPSize,
		AbortTimeout:     480 * time.Second,
		Layout:           LayoutA,
		SideChannelPort:  5600,
		HandshakeTimeout: 5 * time.Second,
		Labels:           labelsV016,
		LabelQuirks:      quirksV016,
		Defaults:         defaultsV016,
	},
	{
		Name: "0.18", MinVersion: "0.18.0", MaxVersion: "0.20.0",
		Framing:          FramingH2,
		Schema:           schemaV018,
		ConnectorVersion: 2,
		HashFactors:      hashFactorsV018,
		BlockIDs:         BlockIDsGrouped,
		ParamsKeys:       paramsKeysV016,
		Notif:            NotifDecodeTPSize,
		AbortTimeout:     480 * time.Second,
		Layout:           LayoutA,
		SideChannelPort:  5600,
		HandshakeTimeout: 5 * time.Second,
		Labels:           labelsV016,
		LabelQuirks:      quirksV016,
		Defaults:         defaultsV016,
	},
	{
		Name: "0.20", MinVersion: "0.20.0", MaxVersion: "0.21.0",
		Framing:          FramingH2,
		Schema:           schemaV020,
		ConnectorVersion: 2,
		HashFactors:      hashFactorsV018,
		BlockIDs:         BlockIDsGrouped,
		ParamsKeys:       paramsKeysV016,
		Notif:            NotifDecodeTPSize,
		AbortTimeout:     480 * time.Second,
		Layout:           LayoutA,
		SideChannelPort:  5600,
		HandshakeTimeout: 5 * time.Second,
		Labels:           labelsV016,
		LabelQuirks:      quirksV020,
		Defaults:         defaultsV016,
	},
	{
		Name: "0.21", MinVersion: "0.21.0", MaxVersion: "0.22.0",
		Framing:          FramingH2,
		Schema:           schemaV021,
		ConnectorVersion: 3,
		HashFactors:      hashFactorsV018,
		BlockIDs:         BlockIDsGrouped,
		ParamsKeys:       paramsKeysV021,
		Notif:            NotifDecodeTPSize,
		AbortTimeout:     480 * time.Second,
		Layout:           LayoutA,
		SideChannelPort:  5600,
		HandshakeTimeout: 5 * time.Second,
		Labels:           labelsV016,
		LabelQuirks:      quirksV020,
		Defaults:         defaultsV016,
	},
	{
		Name: "0.22", MinVersion: "0.22.0", MaxVersion: "0.23.0",
		Framing:           FramingH2,
		Schema:            schemaV021,
		ConnectorVersion:  4,
		HashFactors:       hashFactorsV018,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV021,
		Notif:             NotifDecodeTPSize,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutA,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV016,
		LabelQuirks:       quirksV022,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.23", MinVersion: "0.23.0", MaxVersion: "0.26.0",
		Framing:           FramingH2,
		Schema:            schemaV021,
		ConnectorVersion:  4,
		HashFactors:       hashFactorsV018,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV021,
		Notif:             NotifDecodeTPSize,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutB,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV016,
		LabelQuirks:       quirksV023,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.26", MinVersion: "0.26.0", MaxVersion: "0.28.0",
		Framing:           FramingH4,
		Schema:            schemaV021,
		ConnectorVersion:  5,
		HashFactors:       hashFactorsV018,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV026,
		Notif:             NotifDecodeTPSize,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV016,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.28", MinVersion: "0.28.0", MaxVersion: "0.29.0",
		Framing:           FramingH4,
		Schema:            schemaV021,
		ConnectorVersion:  7,
		HashFactors:       hashFactorsV028,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV028,
		Notif:             NotifDecodeTPSize,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV016,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.29", MinVersion: "0.29.0", MaxVersion: "0.30.0",
		Framing:           FramingH4,
		Schema:            schemaV029,
		ConnectorVersion:  9,
		HashFactors:       hashFactorsV029,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV029,
		Notif:             NotifConsumers,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV029,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.30", MinVersion: "0.30.0", MaxVersion: "0.31.0",
		Framing:           FramingH4,
		Schema:            schemaV030,
		ConnectorVersion:  11,
		HashFactors:       hashFactorsV029,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV029,
		Notif:             NotifConsumers,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV029,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.31", MinVersion: "0.31.0", MaxVersion: "0.32.0",
		Framing:           FramingH4,
		Schema:            schemaV031,
		ConnectorVersion:  13,
		HashFactors:       hashFactorsV029,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV031,
		Notif:             NotifConsumers,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV029,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.32", MinVersion: "0.32.0", MaxVersion: "0.33.0",
		Framing:           FramingH4,
		Schema:            schemaV032,
		ConnectorVersion:  14,
		HashFactors:       hashFactorsV029,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV031,
		Notif:             NotifConsumers,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV029,
		Defaults:          defaultsV022,
	},
	{
		Name: "0.33", MinVersion: "0.33.0", MaxVersion: "0.34.0",
		Framing:           FramingH4,
		Schema:            schemaV032,
		ConnectorVersion:  15,
		HashFactors:       hashFactorsV029,
		BlockIDs:          BlockIDsGrouped,
		ParamsKeys:        paramsKeysV033,
		Notif:             NotifConsumers,
		Leases:            true,
		LeaseDuration:     30 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		LeaseExtension:    20 * time.Second,
		Layout:            LayoutC,
		SideChannelPort:   5600,
		HandshakeTimeout:  5 * time.Second,
		Labels:            labelsV029,
		Defaults:          defaultsV022,
	},
}

// ProfileByName returns the profile whose Name is name ("0.16", "0.33"), with Version empty: set it to the
// exact version string of the vLLM side before hashing (e.g. a dev build's, which ProfileFor refuses).
func ProfileByName(name string) (Profile, error) {
	for _, p := range Profiles {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("%w: no profile named %q (known: %s)", ErrUnknownVersion, name, knownNames())
}

// ProfileFor returns the profile for the vLLM version string a peer reports (GET /version → {"version": …}),
// with Version set to that string (hashed as the peer's vllm_version). Final releases, post releases and local
// tags ("0.16.0", "0.16.0.post1", "0.33.0+cu129") match by their release number. Pre-releases and dev builds
// ("0.17.0rc1", "0.20.2rc1.dev265+gdd6b3a5ef") are rejected with ErrUnknownVersion: their code may sit anywhere
// between two releases, so choosing a profile would be a guess; use ProfileByName if you know which format such
// a build speaks.
func ProfileFor(version string) (Profile, error) {
	v, err := parseVersion(version)
	if err != nil {
		return Profile{}, err
	}
	if v.pre {
		return Profile{}, fmt.Errorf("%w: %q is a pre-release or dev build; choose a profile with ProfileByName (known: %s)",
			ErrUnknownVersion, version, knownNames())
	}
	for _, p := range Profiles {
		lo, _ := parseVersion(p.MinVersion)
		hi, _ := parseVersion(p.MaxVersion)
		if compareRelease(v.release, lo.release) >= 0 && compareRelease(v.release, hi.release) < 0 {
			p.Version = version
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("%w: vLLM %q (supported: %s)", ErrUnknownVersion, version, knownNames())
}

// String returns "vLLM 0.16 (H2, connector v2)".
func (p Profile) String() string {
	return fmt.Sprintf("vLLM %s (%s, connector v%d)", p.Name, p.Framing, p.ConnectorVersion)
}

func knownNames() string {
	names := make([]string, len(Profiles))
	for i, p := range Profiles {
		names[i] = p.releases()
	}
	return strings.Join(names, ", ")
}

// releases describes the row's range: "0.16.x" for one series, "0.23.x–0.25.x" for several.
func (p Profile) releases() string {
	lo, errLo := parseVersion(p.MinVersion)
	hi, errHi := parseVersion(p.MaxVersion)
	if errLo != nil || errHi != nil || len(lo.release) != 3 || len(hi.release) != 3 || lo.release[0] != hi.release[0] ||
		lo.release[2] != 0 || hi.release[2] != 0 || hi.release[1] <= lo.release[1] {
		return p.MinVersion + "–<" + p.MaxVersion
	}
	first := fmt.Sprintf("%d.%d.x", lo.release[0], lo.release[1])
	if hi.release[1] == lo.release[1]+1 {
		return first
	}
	return fmt.Sprintf("%s–%d.%d.x", first, hi.release[0], hi.release[1]-1)
}

type version struct {
	release []int
	pre     bool // a pre-release (aN, bN, rcN) or dev release
}

// parseVersion parses the PEP 440 subset vLLM uses: N(.N)*[{a|b|rc}N][.postN][.devN][+local].
func parseVersion(s string) (version, error) {
	bad := func() (version, error) {
		return version{}, fmt.Errorf("%w: %q is not a PEP 440 version string", ErrUnknownVersion, s)
	}
	t := strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexByte(t, '+'); i >= 0 {
		if i == len(t)-1 {
			return bad()
		}
		t = t[:i]
	}
	var v version
	i := 0
	for {
		j := i
		for j < len(t) && t[j] >= '0' && t[j] <= '9' {
			j++
		}
		if j == i || j-i > 9 {
			return bad()
		}
		n, _ := strconv.Atoi(t[i:j])
		v.release = append(v.release, n)
		i = j
		if i < len(t) && t[i] == '.' && i+1 < len(t) && t[i+1] >= '0' && t[i+1] <= '9' {
			i++
			continue
		}
		break
	}
	rest := t[i:]
	for rest != "" {
		var tag string
		switch {
		case strings.HasPrefix(rest, ".post"), strings.HasPrefix(rest, "post"):
			tag = "post"
		case strings.HasPrefix(rest, ".dev"), strings.HasPrefix(rest, "dev"):
			tag, v.pre = "dev", true
		case strings.HasPrefix(rest, "rc"):
			tag, v.pre = "rc", true
		case strings.HasPrefix(rest, "a"):
			tag, v.pre = "a", true
		case strings.HasPrefix(rest, "b"):
			tag, v.pre = "b", true
		default:
			return bad()
		}
		rest = strings.TrimPrefix(rest, ".")
		rest = rest[len(tag):]
		k := 0
		for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' {
			k++
		}
		if k == 0 {
			return bad()
		}
		rest = rest[k:]
	}
	return v, nil
}

func compareRelease(a, b []int) int {
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y int
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}
