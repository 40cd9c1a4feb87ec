package protocol

import (
	"fmt"
	"strings"

	"github.com/gonixl/gonixl/layout"
)

// LayoutLabel is one name a vLLM release writes in NixlAgentMetadata.kv_cache_layout, with the physical order of
// the bytes inside one block that the name stands for. vLLM publishes the name of its own cache layout and
// accepts from a peer exactly that name (it compares the strings; only its experimental enable_permute_local_kv
// relaxes this), so one list per row serves both directions.
type LayoutLabel struct {
	// Name is the string on the wire: "HND"/"NHD" up to 0.28 (get_kv_cache_layout()), the KVCacheLayout enum
	// member's name from 0.29 (cache_config.get_resolved_kv_cache_layout().name, e.g. "LBHNC").
	Name string
	// Order is the physical order inside one block of one layer's region. 0 marks a layout vLLM knows but gonixl
	// does not model: LHBNC (heads outside blocks: a block is not one contiguous run) and the block-outermost
	// layouts BLHNC, BLNHC, BHLNC (every layer's page packed into one block row).
	Order layout.BlockOrder
}

// LabelQuirk is a known case where a vLLM peer's kv_cache_layout label is not the physical order of its bytes:
// serve such a peer with DecodeConfig.PeerOrder (decode) or a cache of order Bytes published under Label
// (PrefillConfig.KVCacheLayout).
type LabelQuirk struct {
	Label string            // what the peer publishes
	Bytes layout.BlockOrder // what its bytes are
	When  string            // the configuration that does this, with the vLLM source that shows it
}

var (
	// labelsV016: vLLM 0.16–0.28. kv_cache_layout = get_kv_cache_layout() (v1/attention/backends/utils.py,
	// KVCacheLayoutType = Literal["NHD", "HND"]; VLLM_KV_CACHE_LAYOUT accepts the same two); NixlConnector's
	// get_required_kvcache_layout returns "HND" for non-MLA models, so "HND" is what vLLM publishes by default.
	// FLASH_ATTN's get_kv_cache_stride_order maps "HND" to heads-major blocks and "NHD" to token-major ones.
	labelsV016 = []LayoutLabel{{"HND", layout.HND}, {"NHD", layout.NHD}}
	// labelsV029: vLLM 0.29+. vllm/v1/kv_cache_layout.py: logical axes [L, B, H, N, C] (layer, block, KV head,
	// token in block, content = 2·head_dim with K and V packed); each member's value is the stride permutation,
	// its name the physical order. NixlConnector.get_required_kvcache_layout returns "LBHNC" (per layer, blocks;
	// inside a block heads, then tokens: HND); "LBNHC" is the token-major variant (NHD). The other members exist
	// in every 0.29–0.33 release and are refused with a clear error.
	labelsV029 = []LayoutLabel{{"LBHNC", layout.HND}, {"LBNHC", layout.NHD},
		{"LHBNC", 0}, {"BLHNC", 0}, {"BLNHC", 0}, {"BHLNC", 0}}
)

var (
	// quirkHostMirror: eras A/B (0.16–0.25). A kv_buffer_device="cpu" worker mirrors its device cache into a
	// host tensor of the backend's logical shape (initialize_host_xfer_buffer: torch.empty(kv_cache.shape)),
	// whose token-major bytes go out under the device's label.
	quirkHostMirror = LabelQuirk{"HND", layout.NHD, `kv_buffer_device="cpu" host-buffer mirror (initialize_host_xfer_buffer allocates the logical (.., block_size, heads, head_dim) shape)`}
	// Up to 0.19 TRITON_ATTN, and up to 0.22 FLEX_ATTENTION, have no get_kv_cache_stride_order: their cache keeps
	// the logical token-major shape (.., block_size, heads, head_dim) while NixlConnector publishes "HND".
	quirkTritonNoStrideOrder = LabelQuirk{"HND", layout.NHD, "TRITON_ATTN (no get_kv_cache_stride_order before 0.20)"}
	quirkFlexNoStrideOrder   = LabelQuirk{"HND", layout.NHD, "FLEX_ATTENTION (no get_kv_cache_stride_order before 0.23)"}
	// Up to 0.21 CPU_ATTN's cache is its own format whatever the label; with VLLM_KV_CACHE_LAYOUT=NHD it is
	// published as "NHD" (from 0.22 CPU_ATTN requires "HND" via get_required_kv_cache_layout). Profile.BackendOrder
	// derives the bytes' order from the peer's attn_backend_name instead of its label.
	quirkCPUForcedNHD = LabelQuirk{"NHD", layout.CPUAttn, "CPU_ATTN with VLLM_KV_CACHE_LAYOUT=NHD (cpu_attn.get_kv_cache_shape is (2, num_blocks, heads, block_size, head_dim), K transposed per head)"}

	quirksV016 = []LabelQuirk{quirkHostMirror, quirkTritonNoStrideOrder, quirkFlexNoStrideOrder, quirkCPUForcedNHD}
	quirksV020 = []LabelQuirk{quirkHostMirror, quirkFlexNoStrideOrder, quirkCPUForcedNHD}
	quirksV022 = []LabelQuirk{quirkHostMirror, quirkFlexNoStrideOrder}
	quirksV023 = []LabelQuirk{quirkHostMirror}
)

// LayoutName returns the kv_cache_layout name this row's vLLM publishes for a cache whose blocks are in order o
// ("HND" → "LBHNC" from 0.29); a CPU_ATTN cache (layout.CPUAttn, layout.CPUAttnAMX) is published under HND's
// name, as vLLM does.
func (p Profile) LayoutName(o layout.BlockOrder) (string, error) {
	if o.IsCPUAttn() {
		o = o.LabelOrder()
	}
	for _, l := range p.Labels {
		if l.Order == o && o.Valid() {
			return l.Name, nil
		}
	}
	return "", fmt.Errorf("%w: vLLM %s has no kv_cache_layout name for block order %v (its names: %s)",
		layout.ErrInvalidGeometry, p.Name, o, p.labelList())
}

// ParseLayoutName returns the physical block order a kv_cache_layout name of this row stands for. Names are
// exact, as vLLM compares them; a name of another release ("HND" to a 0.33 row) or one gonixl does not model
// ("BLHNC") is an error that lists the row's names. The error wraps layout.ErrInvalidGeometry.
func (p Profile) ParseLayoutName(name string) (layout.BlockOrder, error) {
	for _, l := range p.Labels {
		if l.Name != name {
			continue
		}
		if !l.Order.Valid() {
			return 0, fmt.Errorf("%w: kv_cache_layout %q is a vLLM %s layout gonixl does not model (blocks must be "+
				"per layer and contiguous; supported: %s)", layout.ErrInvalidGeometry, name, p.Name, p.supportedList())
		}
		return l.Order, nil
	}
	return 0, fmt.Errorf("%w: kv_cache_layout %q is not a vLLM %s name (it names its layouts %s)",
		layout.ErrInvalidGeometry, name, p.Name, p.labelList())
}

func (p Profile) labelList() string {
	parts := make([]string, len(p.Labels))
	for i, l := range p.Labels {
		if l.Order.Valid() {
			parts[i] = fmt.Sprintf("%q (%v)", l.Name, l.Order)
		} else {
			parts[i] = fmt.Sprintf("%q (unsupported)", l.Name)
		}
	}
	return strings.Join(parts, ", ")
}

func (p Profile) supportedList() string {
	var parts []string
	for _, l := range p.Labels {
		if l.Order.Valid() {
			parts = append(parts, fmt.Sprintf("%q (%v)", l.Name, l.Order))
		}
	}
	return strings.Join(parts, ", ")
}
