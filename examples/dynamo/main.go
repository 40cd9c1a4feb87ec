// Command dynamo runs gonixl's Go prefill and decode workers behind NVIDIA Dynamo on one host: Dynamo's frontend
// (OpenAI API, tokenizer, KV-aware router with its prefill router) discovers a thin Dynamo worker in front of
// each Go worker (python/dynamo_worker.py, on Dynamo's Python backend API) through file discovery, calls them
// over Dynamo's TCP request plane, and hands the prefill's kv_transfer_params to the decode worker. The Go
// prefill (KV on a Neuron device — gonixl's fake libnrt when no Trainium is present — staged through
// NIXL-registered DRAM) and the Go decode move the KV over real NIXL, handshaking over vLLM's side channel, and
// the decode verifies every byte. Every server listens on 127.0.0.1 only.
//
// With -prefills 2 (the default) two Go prefill workers keep prefix caches and publish vLLM's KV events, which
// their Dynamo workers declare to Dynamo (a ZmqSource each): after the batch, requests that share most of an
// earlier request's prompt go, by Dynamo's KV router, to the worker holding that prefix, which reuses the
// cached blocks; the summary prints each request's worker and cached tokens.
//
// It needs the Dynamo virtualenv (`make dynamo`) and NIXL (`make nixl`); `make demo DYNAMO=1` does both.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

func main() { demo.OrchestratorMain("dynamo", os.Args[1:], orchestrate) }

// dynamoPython is $GONIXL_DYNAMO_PYTHON (the Makefile sets it), else the last complete
// ~/.cache/gonixl/venvs/dynamo-* in name order.
func dynamoPython() string {
	if p := os.Getenv("GONIXL_DYNAMO_PYTHON"); p != "" {
		return p
	}
	home, _ := os.UserHomeDir()
	stamps, _ := filepath.Glob(filepath.Join(home, ".cache", "gonixl", "venvs", "dynamo-*", ".complete"))
	if len(stamps) == 0 {
		return ""
	}
	return filepath.Join(filepath.Dir(stamps[len(stamps)-1]), "bin", "python")
}

// workerScript is python/dynamo_worker.py of this source tree (go run), else of the working directory.
func workerScript() string {
	if _, file, _, ok := runtime.Caller(0); ok {
		p := filepath.Join(filepath.Dir(file), "..", "..", "python", "dynamo_worker.py")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join("python", "dynamo_worker.py")
}

// prompt is request i's prompt of n words of the demo model's vocabulary ("w0".."w4095"), one token each.
func prompt(i, n int) string {
	w := make([]string, n)
	for j := range w {
		w[j] = "w" + strconv.Itoa((i*977+j*31)%4096)
	}
	return strings.Join(w, " ")
}

type outcome struct {
	name   string
	tokens int
	res    completion
	proof  checked
	err    error
	seed   int      // a batch request's prompt is prompt(seed, tokens)
	base   *outcome // a prefix-reuse request: the earlier request whose prompt's prefix it shares
	shared int      // tokens shared with base's prompt
}

// prompt is a batch request's prompt.
func (o *outcome) prompt() string { return prompt(o.seed, o.tokens) }

func orchestrate() error {
	var c demo.Common
	fs := flag.NewFlagSet("dynamo", flag.ExitOnError)
	c.Register(fs)
	// Dynamo 1.6's [vllm] extra pins vLLM 0.31.0: the wire profile a Dynamo vLLM worker speaks.
	vf := fs.Lookup("vllm-version")
	vf.DefValue = "0.31.0"
	_ = vf.Value.Set("0.31.0")
	lengths := fs.String("lengths", "333,17,160,1000,640,2048", "prompt lengths in tokens, one request each, sent concurrently")
	concurrency := fs.Int("concurrency", 4, "requests in flight at once (also the Go prefill's batch rows)")
	maxTokens := fs.Int("max-tokens", 8, "tokens each request asks for")
	where := fs.String("cache", "auto", "decode KV cache: auto (GPU memory when a CUDA GPU is present, else DRAM), gpu or dram")
	python := fs.String("python", dynamoPython(), "Python of the Dynamo virtualenv (make dynamo)")
	worker := fs.String("worker", workerScript(), "python/dynamo_worker.py")
	prefills := fs.Int("prefills", 2, "Go prefill workers, each behind its own Dynamo prefill worker")
	prefixBlocks := fs.Int("prefix-cache-blocks", 512, "each Go prefill's prefix cache, in blocks; the prefills then publish KV events that Dynamo's router routes by (0: no prefix cache, no KV events)")
	reuse := fs.Int("reuse", 3, "after the batch, requests that share most of an earlier request's prompt (the longest ones first), one at a time")
	keep := fs.Bool("keep", false, "keep the working folder (logs, discovery records, request records)")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the whole run")
	fs.Parse(os.Args[1:])
	if *python == "" {
		return errors.New("no Dynamo virtualenv: run `make dynamo` (or pass -python)")
	}
	sizes, maxLen, err := demo.ParseLengths(*lengths)
	if err != nil {
		return err
	}
	ctx, cancel := demo.RunContext(*timeout)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gonixl-dynamo-")
	if err != nil {
		return err
	}
	if *keep {
		defer fmt.Printf("working folder kept: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	fmt.Printf("gonixl behind NVIDIA Dynamo — frontend with KV-aware routing, file discovery, TCP request plane, all on 127.0.0.1;\n"+
		"vLLM %s wire profile between the Go workers, %s\n", c.VLLMVersion, demo.DescribeModel())
	prefillArgs := []string{"-max-seq", strconv.Itoa(maxLen), "-batch-rows", strconv.Itoa(*concurrency)}
	kv := *prefixBlocks > 0
	if kv {
		prefillArgs = append(prefillArgs, "-prefix-cache-blocks", strconv.Itoa(*prefixBlocks), "-kv-events", "127.0.0.1:0")
	}
	fmt.Printf("starting: event-plane broker, %d Go prefill(s) (Neuron KV → pinned DRAM → NIXL%s) and a decode, Dynamo frontend, a Dynamo worker per Go worker ... ",
		max(*prefills, 1), map[bool]string{true: "; prefix cache, KV events", false: ""}[kv])
	t0 := time.Now()
	cl, err := startCluster(ctx, clusterConfig{Self: self, Python: *python, Worker: *worker, Dir: dir, GoArgs: c.WorkerArgs(),
		PrefillArgs: prefillArgs, Prefills: *prefills,
		DecodeArgs: []string{"-cache", *where}, Context: maxLen, KVBlocks: c.NumBlocks, MaxSeqs: *concurrency,
		CallTimeout: time.Minute, Model: "gonixl-demo"})
	if err != nil {
		return err
	}
	defer func() {
		t := time.Now()
		cl.close()
		fmt.Printf("stopped in %.1f s (Dynamo workers unregister, drain, then the rest)\n", time.Since(t).Seconds())
	}()
	fmt.Printf("ready in %.1f s (Go workers %.1f s, Dynamo frontend and workers %.1f s)\n", time.Since(t0).Seconds(),
		cl.Started["Go workers"].Seconds(), cl.Started["Dynamo frontend and workers"].Seconds())
	fmt.Printf("frontend %s; Go prefill %s, Go decode %s\n", cl.URL, strings.Join(cl.GoPrefillURLs, " "), cl.GoDecodeURL)
	if kv {
		if err := cl.WaitKVRouting(ctx); err != nil {
			return err
		}
	}

	fmt.Printf("running %d requests through Dynamo's frontend (its prefill router: prefill with max_tokens=1 → disaggregated_params → decode), %d at a time\n",
		len(sizes), *concurrency)
	results := make([]outcome, len(sizes))
	wall := demo.RunRequests(len(sizes), *concurrency, func(i int) string {
		n := sizes[i]
		res, err := cl.Complete(ctx, prompt(i+1, n), *maxTokens, false)
		results[i] = outcome{name: fmt.Sprintf("req-%d", i+1), tokens: n, res: res, err: err, seed: i + 1}
		if err != nil {
			return fmt.Sprintf("req-%d (%d tokens): FAILED: %v", i+1, n, err)
		}
		return fmt.Sprintf("req-%d (%d tokens): %s in %.1f ms through Dynamo (request id %s)", i+1, n,
			res.FinishReason, ms(res.Latency), res.RequestID())
	})

	// One streaming request, after the batch.
	sn := min(160, maxLen)
	sres, serr := cl.Complete(ctx, prompt(len(sizes)+1, sn), *maxTokens, true)
	results = append(results, outcome{name: "stream", tokens: sn, res: sres, err: serr, seed: len(sizes) + 1})
	if serr == nil {
		fmt.Printf("  streaming request (%d tokens): %d chunks, %q, in %.1f ms\n", sn, sres.Chunks, strings.TrimSpace(sres.Text), ms(sres.Latency))
	} else {
		fmt.Printf("  streaming request (%d tokens): FAILED: %v\n", sn, serr)
	}

	prefill, decode, err := cl.RequestRecords()
	if err != nil {
		return err
	}
	for i := range results {
		if results[i].err == nil {
			results[i].proof, results[i].err = Check(results[i].res, results[i].tokens, prefill, decode)
		}
	}
	if kv && *reuse > 0 {
		results = append(results, reuseRequests(ctx, cl, results, *reuse, *maxTokens)...)
	}
	return summary(results, wall)
}

// reuseRequests sends, one at a time, n requests that each share most of an earlier request's prompt (the
// longest ones first, of at least 128 tokens): its full blocks but the last quarter, then 32 words of its own. Each goes once the
// router has taken in every KV event published so far; Dynamo's router should send it to the worker that
// served the earlier request, which reuses the shared blocks.
func reuseRequests(ctx context.Context, cl *cluster, done []outcome, n, maxTokens int) []outcome {
	var bases []*outcome
	for i := range done {
		if done[i].err == nil && done[i].tokens >= 128 { // the reuse prompt (3/4 + 32 tokens) fits the longest prompt
			bases = append(bases, &done[i])
		}
	}
	sort.SliceStable(bases, func(i, j int) bool { return bases[i].tokens > bases[j].tokens })
	bases = bases[:min(n, len(bases))]
	fmt.Printf("prefix reuse: %d requests that share most of an earlier request's prompt, one at a time, each once Dynamo's router has every KV event the Go prefills published\n", len(bases))
	var out []outcome
	for k, base := range bases {
		shared := base.tokens * 3 / 4 / 16 * 16
		words := slices.Concat(strings.Fields(base.prompt())[:shared], strings.Fields(prompt(1000+k, 32)))
		o := outcome{name: base.name + "+", tokens: len(words), base: base, shared: shared}
		if _, o.err = cl.SyncKV(ctx); o.err == nil {
			o.res, o.err = cl.Complete(ctx, strings.Join(words, " "), maxTokens, false)
		}
		if o.err == nil {
			var prefill, decode map[string]record
			if prefill, decode, o.err = cl.RequestRecords(); o.err == nil {
				o.proof, o.err = Check(o.res, o.tokens, prefill, decode)
			}
		}
		if o.err == nil {
			p, b := o.proof.Prefill, base.proof.Prefill
			g := p.Gonixl
			fmt.Printf("  %s (%d tokens, the first %d of %s's): %s (%s's was %s), %d tokens cached (%d blocks), %d of %d blocks staged\n",
				o.name, o.tokens, shared, base.name, p.Worker, base.name, b.Worker, g.CachedTokens, g.CachedBlocks, g.StagedBlocks, g.Blocks)
			if p.Worker != b.Worker || g.CachedTokens == 0 {
				o.err = fmt.Errorf("%s shares %d tokens with %s, which %s served, but went to %s and reused %d tokens", o.name, shared, base.name, b.Worker, p.Worker, g.CachedTokens)
			}
		} else {
			fmt.Printf("  %s: FAILED: %v\n", o.name, o.err)
		}
		out = append(out, o)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func summary(results []outcome, wall time.Duration) error {
	sort.SliceStable(results, func(i, j int) bool { return results[i].name < results[j].name })
	tb := demo.NewTable("request", "tokens", "blocks", "prefill worker", "cached", "prefill ms", "stage ms", "decode ms", "handshake ms", "transfer ms", "GB/s",
		"through Dynamo ms", "params equal", "verified")
	var reused, reuseTokens int
	var bytes, verified int64
	for _, r := range results {
		if r.err != nil {
			tb.Fail(r.name, r.tokens)
			continue
		}
		p, d := r.proof.Prefill, r.proof.Decode
		bytes += d.Gonixl.Bytes
		verified += d.Gonixl.VerifiedBytes
		stage, cached := 0.0, 0
		if p.Gonixl != nil {
			stage, cached = p.Gonixl.StageMS, p.Gonixl.CachedTokens
		}
		if r.base != nil {
			reused += cached
			reuseTokens += r.tokens
		}
		tb.Row("%s\t%d\t%d\t%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.1f\tyes\tyes", r.name, r.tokens, d.Gonixl.Blocks, p.Worker, cached, p.MS, stage,
			d.MS, d.Gonixl.HandshakeMS, d.Gonixl.TransferMS, demo.GBps(d.Gonixl.Bytes, d.Gonixl.TransferMS), ms(r.res.Latency))
	}
	tb.Flush()
	fmt.Printf("\nprefill/decode ms: the Dynamo worker's call to its Go worker; through Dynamo: the client's request to the frontend;\n" +
		"cached: prompt tokens whose KV blocks the Go prefill reused from its prefix cache (it computed and staged only the rest).\n")
	if reuseTokens > 0 {
		fmt.Printf("prefix reuse: %d of the %d prompt tokens of the reuse requests (req-N+) came from the prefix cache of the worker Dynamo's router chose\n", reused, reuseTokens)
	}
	fmt.Printf("total: %d requests, %.1f MB of KV moved over NIXL, %d bytes verified, batch wall %.2f s\n",
		len(results), float64(bytes)/1e6, verified, wall.Seconds())
	for _, r := range results {
		if r.err != nil {
			fmt.Printf("%s: %v\n", r.name, r.err)
		}
	}
	if err := tb.Err(); err != nil {
		return err
	}
	fmt.Println("OK: every byte of every request arrived intact; the decode received exactly the prefill's params under Dynamo's request id")
	if reuseTokens > 0 {
		fmt.Println("OK: Dynamo's KV router sent each prefix request to the Go prefill holding its prefix, which reused the cached blocks")
	}
	return nil
}
