// Package connector makes Go programs prefill or decode workers that are wire-compatible with vLLM's
// NixlConnector (pull mode): a vLLM-style proxy — or vLLM itself on the other side — cannot tell them from
// vLLM workers of the configured version.
//
// # Roles
//
// A Prefill (NewPrefill) owns a registered KV cache, serves its rank's handshake on the ZMQ side channel
// (connector/sidechannel), and for each request takes blocks, fills them (Prefill.Hold's FillFunc: a Neuron
// staging, a CPU computation) and returns the kv_transfer_params of vLLM's prefill response. It holds the
// blocks until the decode peer's transfer notifications arrive, renews them on "HB:" heartbeats where the
// profile has leases, and frees them at lease expiry or abort timeout, logging and counting each expiry.
// With PrefillConfig.PrefixCache it keeps prompts' full blocks cached under vLLM's block hashes
// (connector/blockhash, connector/prefixcache) once read, and HoldTokens serves a prompt's cached prefix from
// them, filling only the rest (PrefixFillFunc) and reporting the hit as remote_prefill_cached_tokens; with
// PrefillConfig.KVEvents it publishes the cache's changes as vLLM's KV events (connector/kvevents) for a
// KV-aware router.
//
// A Decode (NewDecode) takes those kv_transfer_params (do_remote_prefill), handshakes once per prefill
// engine (cached; dropped and redone after a failed transfer), checks the compatibility hash and the peer's
// geometry, validates every block id before anything moves (ErrBadParams), READs the blocks with one NIXL
// request per prefill rank it reads (heterogeneous TP as vLLM plans it, layout.ReadPlan), notifies the
// prefill side with the profile's message, and reports timings (Result).
//
// Which vLLM version is spoken is data: a protocol.Profile, picked by the configs' VLLMVersion (the peers'
// version string, e.g. "0.16.0"; protocol.ProfileFor). The model is described once, as a Model (layers, KV
// heads of the whole model, head size, dtype, ...): with the profile it yields the cache geometry of a rank in
// the region plan of that version's layout era, and the compatibility-hash inputs with that release's vLLM
// defaults and the version string ProfileFor kept (Profile.Version). Compat is only for overrides, and a role
// creates its own DRAM cache from the Model (NumBlocks) unless given one.
//
// The block format follows the attention backend, not only the era: Model.AttnBackend "CPU_ATTN" (a vLLM CPU
// engine's backend) gives the cache CPU_ATTN's own format (layout.CPUAttn; a bf16 model states it, since vLLM
// packs bf16 differently on CPUs with AMX), which the prefill role publishes as attn_backend_name "CPU_ATTN"
// under HND's label, with the compatibility hash a vLLM CPU engine computes: a vLLM CPU decode engine reads it
// as its own blocks. The decode role takes a peer's format from its attn_backend_name (protocol.Profile.
// BackendOrder; before 0.20, which does not send it, from the hashed name) and refuses a peer whose format is
// not its cache's. The alternative, staging the standard layout under another backend name for vLLM's
// heterogeneous-attention repack (CpuPlatform.pack_kv_cache), works only when the vLLM decode opts out of
// the hash (enforce_handshake_compat=false), so it is never the default.
//
// # Caches
//
// Cache is what the roles register and publish: DRAMCache here, a neuron.Stager (Neuron KV staged through
// pinned DRAM) or a cuda.KVCache (GPU memory) from the device packages, which this package never imports.
// A role owns the rest: it allocates blocks (BlockPool), holds them for the decode peer on one clock (the
// profile's lease or abort timeout, PrefillConfig.HoldTimeout) and registers the cache; a device only fills
// blocks (Prefill.Hold's FillFunc, e.g. neuron.Stager.Fill). Optional interfaces add what a device needs: Registrar
// (the cache registers itself), DeviceContext (NIXL calls run with the device context current) and
// HostBuffered (a host-buffered decode cache copied to the device after each READ; HostBufferedPipeline
// copies each READ slice while the next ones run).
//
// # Concurrency and lifetime
//
// Prefill, Decode, DRAMCache, BlockPool and Metrics are safe for concurrent use. Close has one contract for
// Prefill, Decode and sidechannel.Server: the first Close tears down and returns the first error it met; every
// later (or concurrent) Close waits for that teardown to finish and returns nil; calls after Close fail with
// an error wrapping nixl.ErrClosed. A Prefill stops its side channel and notification loop, then deregisters the cache and closes its NIXL agent;
// a Decode cancels its in-flight pulls, waits for them to return (their errors wrap nixl.ErrClosed), then
// releases its descriptor lists, registration and agent. A Decode reference-counts its handshakes: dropping
// one after a failed transfer never closes descriptor lists that another pull is still using; they are
// released when the last such pull returns. A cache a role created (from a Model) goes last. Close the roles
// before the caches you gave them.
//
// # Exposure
//
// Whoever reaches the side channel gets the NIXL metadata, and with it, over the data port, can read and
// write the registered cache and send notifications (see docs/trust.md). The prefill role binds
// 127.0.0.1 by default and keeps NIXL's UCX data plane on the same device (RoleConfig.DataDevice);
// PrefillConfig.NotifyFrom restricts whose notifications count.
package connector
