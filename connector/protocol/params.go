package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

const objParams = "kv_transfer_params"

// BlockIDs is kv_transfer_params.remote_block_ids: P's logical block ids in token order, one list per KV-cache
// group. Profiles with flat block ids (BlockIDsFlat) have exactly one group. A nil BlockIDs is JSON null.
type BlockIDs [][]int64

// Flat returns the single group of a flat profile, or nil when there is not exactly one group.
func (b BlockIDs) Flat() []int64 {
	if len(b) != 1 {
		return nil
	}
	return b[0]
}

// Empty reports whether no group holds a block (vLLM: nothing to read, notification only).
func (b BlockIDs) Empty() bool {
	for _, g := range b {
		if len(g) > 0 {
			return false
		}
	}
	return true
}

// KVTransferParams is the kv_transfer_params object of vLLM's OpenAI API, as P returns it in its response and
// the proxy copies it into D's request. JSON null and an absent key both read as the zero value; Has reports
// which keys were present. Keys this type does not know are kept in Extra and written back by EncodeParams.
type KVTransferParams struct {
	DoRemotePrefill bool
	DoRemoteDecode  bool
	RemoteBlockIDs  BlockIDs
	RemoteEngineID  string
	RemoteRequestID string // P's internal request id; D puts it into its notifications
	RemoteHost      string
	RemotePort      int
	TPSize          int // P's transfer TP size (D assumes 1 when absent)
	// Later releases (Profile.ParamsKeys says which row sends which):
	DCPSize                int      // dcp_size (0.29+)
	PPSize                 int      // pp_size (0.29+)
	RemoteNumTokens        int64    // remote_num_tokens (0.21+)
	RemoteBlocksExpiryTime *float64 // remote_blocks_expiry_time (0.26+); null from a pull-mode P
	// RemoteRegistrationGeneration (0.33+): how often P registered its KV cache (vLLM's scheduler starts at 0
	// and counts every changed handshake payload, so its first response says 1). D redoes the handshake with
	// P's engine when this grows.
	RemoteRegistrationGeneration int64
	TransferMode                 string // transfer_mode (0.28+)
	// RemotePrefillCachedTokens (0.31+): P's prefix-cache hits for the prompt (prefill_stats.num_cached_tokens),
	// which D reports in prompt_tokens_details; 0 for a prompt computed in full.
	RemotePrefillCachedTokens int64

	// Has lists the keys present in decoded JSON (null included), so "absent" and "zero" can be told apart.
	Has map[string]bool
	// Extra holds keys this type does not model, verbatim.
	Extra map[string]json.RawMessage
}

// paramField maps one JSON key to a KVTransferParams field.
type paramField struct {
	enc func(p Profile, k *KVTransferParams) (any, error)
	dec func(p Profile, k *KVTransferParams, raw json.RawMessage) error
}

func jsonInt(raw json.RawMessage, dst *int64) error {
	if t := bytes.TrimSpace(raw); len(t) == 0 || (t[0] != '-' && (t[0] < '0' || t[0] > '9')) {
		return fmt.Errorf("expected an integer, got %s", raw)
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return err
	}
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return fmt.Errorf("expected an integer, got %s", n)
	}
	*dst = v
	return nil
}

func intParam(get func(k *KVTransferParams) *int) paramField {
	return paramField{
		enc: func(_ Profile, k *KVTransferParams) (any, error) { return *get(k), nil },
		dec: func(_ Profile, k *KVTransferParams, raw json.RawMessage) error {
			var v int64
			if err := jsonInt(raw, &v); err != nil {
				return err
			}
			*get(k) = int(v)
			return nil
		},
	}
}

func int64Param(get func(k *KVTransferParams) *int64) paramField {
	return paramField{
		enc: func(_ Profile, k *KVTransferParams) (any, error) { return *get(k), nil },
		dec: func(_ Profile, k *KVTransferParams, raw json.RawMessage) error { return jsonInt(raw, get(k)) },
	}
}

func boolParam(get func(k *KVTransferParams) *bool) paramField {
	return paramField{
		enc: func(_ Profile, k *KVTransferParams) (any, error) { return *get(k), nil },
		dec: func(_ Profile, k *KVTransferParams, raw json.RawMessage) error { return json.Unmarshal(raw, get(k)) },
	}
}

func strParam(get func(k *KVTransferParams) *string) paramField {
	return paramField{
		enc: func(_ Profile, k *KVTransferParams) (any, error) {
			if !utf8.ValidString(*get(k)) {
				return nil, fmt.Errorf("string is not valid UTF-8")
			}
			return *get(k), nil
		},
		dec: func(_ Profile, k *KVTransferParams, raw json.RawMessage) error { return json.Unmarshal(raw, get(k)) },
	}
}

var paramFields = map[string]paramField{
	"do_remote_prefill": boolParam(func(k *KVTransferParams) *bool { return &k.DoRemotePrefill }),
	"do_remote_decode":  boolParam(func(k *KVTransferParams) *bool { return &k.DoRemoteDecode }),
	"remote_block_ids": {
		enc: func(p Profile, k *KVTransferParams) (any, error) {
			if k.RemoteBlockIDs == nil {
				return nil, nil
			}
			if p.BlockIDs == BlockIDsFlat {
				if len(k.RemoteBlockIDs) != 1 {
					return nil, fmt.Errorf("profile %s has flat block ids: want exactly 1 group, got %d", p.Name, len(k.RemoteBlockIDs))
				}
				return nonNil(k.RemoteBlockIDs[0]), nil
			}
			groups := make([][]int64, len(k.RemoteBlockIDs))
			for i, g := range k.RemoteBlockIDs {
				groups[i] = nonNil(g)
			}
			return groups, nil
		},
		dec: func(p Profile, k *KVTransferParams, raw json.RawMessage) error {
			if p.BlockIDs == BlockIDsFlat {
				var flat []int64
				if err := json.Unmarshal(raw, &flat); err != nil {
					return fmt.Errorf("profile %s wants a flat list of ints like [1, 2, 3]: %v", p.Name, err)
				}
				k.RemoteBlockIDs = BlockIDs{nonNil(flat)}
				return nil
			}
			var groups [][]int64
			if err := json.Unmarshal(raw, &groups); err != nil {
				return fmt.Errorf("profile %s wants one list per KV-cache group like [[1, 2, 3]]: %v", p.Name, err)
			}
			for i := range groups {
				groups[i] = nonNil(groups[i])
			}
			k.RemoteBlockIDs = groups
			return nil
		},
	},
	"remote_engine_id":  strParam(func(k *KVTransferParams) *string { return &k.RemoteEngineID }),
	"remote_request_id": strParam(func(k *KVTransferParams) *string { return &k.RemoteRequestID }),
	"remote_host":       strParam(func(k *KVTransferParams) *string { return &k.RemoteHost }),
	"remote_port":       intParam(func(k *KVTransferParams) *int { return &k.RemotePort }),
	"tp_size":           intParam(func(k *KVTransferParams) *int { return &k.TPSize }),
	"dcp_size":          intParam(func(k *KVTransferParams) *int { return &k.DCPSize }),
	"pp_size":           intParam(func(k *KVTransferParams) *int { return &k.PPSize }),
	"remote_num_tokens": int64Param(func(k *KVTransferParams) *int64 { return &k.RemoteNumTokens }),
	"remote_blocks_expiry_time": {
		enc: func(_ Profile, k *KVTransferParams) (any, error) {
			if k.RemoteBlocksExpiryTime == nil {
				return nil, nil
			}
			return *k.RemoteBlocksExpiryTime, nil
		},
		dec: func(_ Profile, k *KVTransferParams, raw json.RawMessage) error {
			var f float64
			if err := json.Unmarshal(raw, &f); err != nil {
				return err
			}
			k.RemoteBlocksExpiryTime = &f
			return nil
		},
	},
	"remote_registration_generation": int64Param(func(k *KVTransferParams) *int64 { return &k.RemoteRegistrationGeneration }),
	"transfer_mode":                  strParam(func(k *KVTransferParams) *string { return &k.TransferMode }),
	"remote_prefill_cached_tokens":   int64Param(func(k *KVTransferParams) *int64 { return &k.RemotePrefillCachedTokens }),
}

func nonNil(v []int64) []int64 {
	if v == nil {
		return []int64{}
	}
	return v
}

// EncodeParams writes the kv_transfer_params object P returns in this profile: the profile's keys in vLLM's
// order (block ids flat or grouped per profile), then any Extra keys in sorted order.
func (p Profile) EncodeParams(k KVTransferParams) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	write := func(key string, v any) error {
		js, err := json.Marshal(v)
		if err != nil {
			return invalid(objParams, key, "%v", err)
		}
		if !first {
			b.WriteString(", ")
		}
		first = false
		kj, _ := json.Marshal(key)
		b.Write(kj)
		b.WriteString(": ")
		b.Write(js)
		return nil
	}
	known := map[string]bool{}
	for _, key := range p.ParamsKeys {
		known[key] = true
		f, ok := paramFields[key]
		if !ok {
			return nil, invalid(objParams, key, "profile %s names a key this package does not model", p.Name)
		}
		v, err := f.enc(p, &k)
		if err != nil {
			return nil, invalid(objParams, key, "%v", err)
		}
		if err := write(key, v); err != nil {
			return nil, err
		}
	}
	extra := make([]string, 0, len(k.Extra))
	for key := range k.Extra {
		if !known[key] {
			extra = append(extra, key)
		}
	}
	sort.Strings(extra)
	for _, key := range extra {
		if !json.Valid(k.Extra[key]) {
			return nil, invalid(objParams, key, "Extra value is not valid JSON")
		}
		if err := write(key, k.Extra[key]); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// DecodeParams parses a kv_transfer_params JSON object with this profile's shapes. Every key of any profile is
// understood (a 0.16 decoder still reads "dcp_size"), except that remote_block_ids must have the profile's
// shape. Unknown keys go to Extra. null reads as the zero value. Use ValidateForDecode before pulling.
func (p Profile) DecodeParams(b []byte) (KVTransferParams, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return KVTransferParams{}, malformed(objParams, "", "not a JSON object: %v", err)
	}
	if raw == nil {
		return KVTransferParams{}, malformed(objParams, "", "null instead of an object")
	}
	if dec.More() {
		return KVTransferParams{}, malformed(objParams, "", "trailing data after the object")
	}
	k := KVTransferParams{Has: make(map[string]bool, len(raw))}
	for key, v := range raw {
		k.Has[key] = true
		f, ok := paramFields[key]
		if !ok {
			if k.Extra == nil {
				k.Extra = map[string]json.RawMessage{}
			}
			k.Extra[key] = v
			continue
		}
		if string(bytes.TrimSpace(v)) == "null" {
			continue
		}
		if err := f.dec(p, &k, v); err != nil {
			return KVTransferParams{}, malformed(objParams, key, "%v", err)
		}
	}
	return k, nil
}

// ValidateForDecode applies vLLM's decode-side rule (update_state_after_alloc): remote_block_ids must be
// non-empty and remote_engine_id, remote_request_id, remote_host and remote_port must be present. vLLM logs
// "Got invalid KVTransferParams" and skips the transfer otherwise; we return an ErrMissingField error.
func (k KVTransferParams) ValidateForDecode() error {
	if !k.DoRemotePrefill {
		return invalid(objParams, "do_remote_prefill", "not set: these params do not ask D to pull from a remote prefill")
	}
	if len(k.RemoteBlockIDs) == 0 {
		return &FieldError{Object: objParams, Field: "remote_block_ids", Err: ErrMissingField}
	}
	var missing []string
	for _, key := range []string{"remote_engine_id", "remote_request_id", "remote_host", "remote_port"} {
		if k.Has != nil && !k.Has[key] {
			missing = append(missing, key)
		}
	}
	if k.RemoteEngineID == "" && (k.Has == nil || k.Has["remote_engine_id"]) {
		missing = append(missing, "remote_engine_id (empty)")
	}
	if len(missing) > 0 {
		return &FieldError{Object: objParams, Field: strings.Join(missing, ", "), Err: ErrMissingField,
			Detail: "P's response lacks keys a pulling D needs (is P older than vLLM 0.13?)"}
	}
	return nil
}

// PrefillRequestParams is the kv_transfer_params a proxy sends to P with the prompt (all eras): it asks P to
// keep the blocks for a remote decode.
const PrefillRequestParams = `{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null, ` +
	`"remote_block_ids": null, "remote_host": null, "remote_port": null}`
