package kvevents

import (
	"fmt"
	"strings"

	"github.com/gonixl/gonixl/connector/protocol"
)

// Field is one field of a msgspec struct in declaration (= wire) order. Default fields have a default (None),
// and vLLM's structs are omit_defaults: such a field is left off the wire while it holds its default.
type Field struct {
	Name    string
	Default bool
}

// Format is everything release-dependent about vLLM's KV events (vllm/distributed/kv_events.py and the
// ZmqEventPublisher in it), as data. A Format is immutable; it is safe to copy and to use from many goroutines.
type Format struct {
	// Name is the release series, e.g. "0.16".
	Name string
	// Profiles are the names of the connector/protocol rows (protocol.Profiles) whose releases use this format.
	Profiles []string
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

var (
	storedV016 = []Field{{"block_hashes", false}, {"parent_block_hash", false}, {"token_ids", false},
		{"block_size", false}, {"lora_id", false}, {"medium", false}, {"lora_name", false}}
	removedV016 = []Field{{"block_hashes", false}, {"medium", false}}
	storedV033  = append(append([]Field(nil), storedV016...), Field{"extra_keys", true}, Field{"group_idx", true},
		Field{"kv_cache_spec_kind", true}, Field{"kv_cache_spec_sliding_window", true}, Field{"locality", true},
		Field{"ownership", true}, Field{"session_id", true}, Field{"lookahead_token_ids", true})
	removedV033 = append(append([]Field(nil), removedV016...), Field{"group_idx", true}, Field{"locality", true},
		Field{"ownership", true})
)

// Formats is the table of KV-event formats, oldest first, each read from its release's wheel
// (vllm/distributed/kv_events.py, vllm/v1/core/kv_cache_utils.py for ExternalBlockHash = bytes | int). What
// changes from one row to the next:
//
//	0.16  events array_like: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//	      medium, lora_name], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"]; replay [seq, payload]
//	0.33  events are maps {"type": "BlockStored", ...} (KVCacheEvent lost array_like); BlockStored + extra_keys,
//	      group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership, session_id,
//	      lookahead_token_ids; BlockRemoved + group_idx, locality, ownership (all default None, omitted when
//	      None); replay frames carry the topic first: [topic, seq, payload], end [b"", -1, b""]
//
// Only the 0.16 and 0.33 wheels have been read; the releases between them (0.17–0.32) have no row yet.
var Formats = []Format{
	{Name: "0.16", Profiles: []string{"0.16"}, Stored: storedV016, Removed: removedV016},
	{Name: "0.33", Profiles: []string{"0.33"}, EventsAsMaps: true, Stored: storedV033, Removed: removedV033, ReplayTopic: true},
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
	p, err := protocol.ProfileFor(version)
	if err != nil {
		return Format{}, fmt.Errorf("%w: %w", ErrUnknownVersion, err)
	}
	for _, f := range Formats {
		for _, name := range f.Profiles {
			if name == p.Name {
				return f, nil
			}
		}
	}
	return Format{}, fmt.Errorf("%w: vLLM %q: the KV-event format of releases %s has not been read yet (known: %s); "+
		"use FormatByName if you know which one its consumers expect", ErrUnknownVersion, version, p.Name, formatNames())
}

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
