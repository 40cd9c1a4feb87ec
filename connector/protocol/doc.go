// Package protocol is the pure-Go wire protocol of vLLM's NixlConnector (pull mode): version profiles, the
// side-channel request/reply framing, the handshake objects (NixlAgentMetadata, NixlHandshakePayload) encoded
// byte-for-byte as msgspec encodes them, the compatibility hash, kv_transfer_params and NIXL notification
// messages.
//
// Everything that differs between vLLM releases is data in a Profile (see Profiles); pick one with ProfileFor
// from the version string the peer's OpenAI server reports at GET /version (the profile keeps it as Version,
// which the compatibility hash includes), or with ProfileByName (then set Version yourself):
//
//	p, err := protocol.ProfileFor("0.33.0")
//	in := p.DefaultCompatInputs(protocol.PlatformCUDA) // "0.33.0" and vLLM's defaults: HMA, FLASH_ATTN, "auto", pull
//	in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = "Qwen/Qwen3-0.6B", "torch.bfloat16", 8, 128, 28
//	hash, err := p.CompatHash(in)
//	payload, err := p.EncodeHandshake(hash, meta)          // prefill side: what the side channel serves
//	meta, err := p.OpenHandshake(payload, protocol.HandshakeCheck{LocalHash: hash, EnforceHash: true})
//
// Supported: every vLLM release from 0.16.0 to 0.33.x, in 13 rows (framing H2 up to 0.25, H4 from 0.26;
// NIXL_CONNECTOR_VERSION 2 to 15). The Profiles doc comment lists what each row adds to the one before.
// Decoders never panic on network input and return errors wrapping the package's sentinels (ErrMalformed,
// ErrMissingField, ErrHashMismatch, ...).
//
// What differs on the wire between the oldest and the newest row (read in their wheels):
//
//   - Side channel: 0.16 requests are msgpack [bin "get_meta_msg", tp_rank] and the reply is one frame (H2);
//     0.33 requests are [bin "get_meta_msg", pp_rank, tp_rank] and the reply has a second frame, msgpack
//     float64 of the listener's time.perf_counter() (H4; vLLM's decoder asserts exactly two frames).
//   - NixlAgentMetadata: 0.16 has 8 required fields (engine_id, agent_metadata, kv_caches_base_addr, device_id,
//     num_blocks, block_lens, kv_cache_layout, block_size); 0.33 has 21: block_strides after block_lens,
//     then ssm_sizes, attn_backend_name, physical_blocks_per_logical_kv_block after block_size (all required),
//     then 9 fields with defaults: region_num_blocks, region_group_ids, region_names, region_mem_types
//     (None), dcp_size, pcp_size (1), ple_block_len (None), region_members ([]), packed_member_layouts ({}).
//     The handshake payload {compatibility_hash, agent_metadata_bytes} is the same.
//   - Compatibility hash: both hash vllm_version, nixl_connector_version (2 vs 15), model, dtype, num_kv_heads,
//     head_size, num_hidden_layers, attn_backend_name, cache_dtype; 0.16 adds cross_layers_blocks, 0.33 adds
//     is_hma_enabled, speculative_config and transfer_mode. Each row carries vLLM's defaults for what a user
//     does not set (Profile.Defaults): is_hma_enabled false in 0.18–0.21 (any connector turns HMA off), true
//     from 0.22 (NixlConnector supports HMA); the backend is the platform's (FLASH_ATTN on CUDA, CPU_ATTN on
//     CPU); cache_dtype "auto"; transfer_mode "pull". A hash mismatch (with HandshakeCheck.LocalInputs) lists
//     our factor dict and which single default-able input would have matched.
//   - kv_transfer_params: 0.16 remote_block_ids is a flat list and P returns 8 keys; 0.33 has one list per
//     KV-cache group and adds dcp_size, pp_size, remote_num_tokens, remote_blocks_expiry_time,
//     remote_registration_generation (1 after vLLM's first registration, larger after each re-registration)
//     and transfer_mode; its scheduler appends remote_prefill_cached_tokens (0.31+).
//   - kv_cache_layout: "HND" (or "NHD") up to 0.28; vLLM's KVCacheLayout enum names from 0.29, "LBHNC" (HND
//     blocks, what NixlConnector requires) or "LBNHC" (NHD). vLLM compares the names exactly; Profile.Labels
//     maps each row's names to the block order (LayoutName, ParseLayoutName) and LabelQuirks lists the
//     configurations whose label is not their bytes' order.
//   - Notifications: both "<remote_request_id>:<n>"; n is D's TP size up to 0.28 (P derives the count) and
//     the number of expected consumers from 0.29. From 0.22, "HB:<id>,<id>" heartbeats renew 30 s leases
//     (sent every 5 s, extending to now+20 s); up to 0.21 P frees unread blocks after 480 s instead.
//   - KV layout era: A (K and V separate regions) up to 0.22, B (K/V halves per block) in 0.23–0.25, C (K/V
//     packed in the last dim) from 0.26. These are FLASH_ATTN's; the CPU backend (CPU_ATTN) keeps its own block
//     format inside the same regions (Profile.BackendOrder, layout.CPUAttn), and cannot transfer in era B.
//
// Concurrency: Profiles and all values here are plain data; every function is safe for concurrent use.
// The package builds with CGO_ENABLED=0.
package protocol

//go:generate go tool stringer -linecomment -output=string.go -type=Framing,LayoutEra
