// Command disagg runs a disaggregated prefill/decode pair end to end: it starts the prefill worker (KV cache on
// a Neuron device — gonixl's fake libnrt when no Trainium is present — staged through NIXL-registered DRAM) and
// the decode worker as separate processes, then runs vLLM's disaggregated request flow through a small proxy
// for several concurrent requests of different lengths of a Qwen3-0.6B-shaped KV cache, moved over real NIXL
// (UCX on loopback). The decode worker verifies every byte. It prints progress and a summary.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

func main() {
	if demo.ServeSubcommand(os.Args[1:]) {
		return
	}
	if err := orchestrate(); err != nil {
		fmt.Fprintln(os.Stderr, "disagg: FAILED:", err)
		os.Exit(1)
	}
}

type child struct {
	name string
	cmd  *exec.Cmd
	url  string
	info string
}

func start(ctx context.Context, name string, args []string, stderr io.Writer) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = stderr
	cmd.Env = os.Environ()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "READY ") {
				ready <- strings.TrimPrefix(line, "READY ")
			}
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			cmd.Wait()
			return nil, fmt.Errorf("%s worker exited before it was ready", name)
		}
		f := strings.Fields(line)
		c.url, c.info = f[0], strings.Join(f[1:], " ")
		return c, nil
	case <-ctx.Done():
		c.stop()
		return nil, fmt.Errorf("%s worker not ready: %w", name, ctx.Err())
	}
}

func (c *child) stop() {
	if c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

type outcome struct {
	id     string
	tokens int
	res    demo.ProxyResult
	err    error
}

func orchestrate() error {
	var c demo.Common
	fs := flag.NewFlagSet("disagg", flag.ExitOnError)
	c.Register(fs)
	lengths := fs.String("lengths", "3000,2048,1536,1000,640,333", "prompt lengths in tokens, one request each, sent concurrently")
	concurrency := fs.Int("concurrency", 4, "requests in flight at once")
	where := fs.String("cache", "auto", "decode KV cache: auto (GPU memory when a CUDA GPU is present, else DRAM), gpu, dram, or hostbuf (NIXL into pinned DRAM, then copied to GPU memory)")
	gpu := fs.Bool("gpu", false, "same as -cache gpu")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the whole run")
	cudaCtx := fs.String("prefill-cuda-context", "auto", "the prefill worker's -cuda-context: auto (hold a CUDA context when a driver and device are present: needed for reads into a GPU on this host at PCIe speed), on, off")
	pin := fs.Bool("prefill-cuda-pin-staging", true, "the prefill worker's -cuda-pin-staging (page-lock its staging arena for CUDA while it holds a context)")
	fs.Parse(os.Args[1:])
	var sizes []int
	maxLen := 0
	for _, s := range strings.Split(*lengths, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("bad -lengths entry %q", s)
		}
		sizes = append(sizes, n)
		maxLen = max(maxLen, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	m := demo.Qwen3_0_6B
	fmt.Printf("gonixl disaggregated prefill/decode demo — vLLM %s wire profile, %s KV cache (%d layers × %d KV heads × %d, bf16, block %d)\n",
		c.VLLMVersion, m.Name, m.Layers, m.KVHeads, m.HeadDim, m.BlockSize)
	common := []string{"-vllm-version", c.VLLMVersion, "-num-blocks", strconv.Itoa(c.NumBlocks), "-kv-layout", c.Order,
		"-backends", c.Backends, "-log-level", c.LogLevel, "-http", "127.0.0.1:0"}
	if c.NIXLLibDir != "" {
		common = append(common, "-nixl-lib-dir", c.NIXLLibDir)
	}
	if c.DataDevice != "" {
		common = append(common, "-data-device", c.DataDevice)
	}
	fmt.Print("starting prefill worker (Neuron KV tensors → pinned DRAM staging → NIXL) ... ")
	t0 := time.Now()
	pre, err := start(ctx, "prefill", append([]string{"serve-prefill", "-max-seq", strconv.Itoa(maxLen), "-batch-rows", strconv.Itoa(*concurrency),
		"-cuda-context", *cudaCtx, "-cuda-pin-staging=" + strconv.FormatBool(*pin)}, common...), os.Stderr)
	if err != nil {
		return err
	}
	defer pre.stop()
	fmt.Printf("ready in %v at %s (%s)\n", time.Since(t0).Round(time.Millisecond), pre.url, pre.info)
	if *gpu {
		*where = "gpu"
	}
	fmt.Printf("starting decode worker (NIXL READ → KV cache: %s) ... ", *where)
	dargs := append([]string{"serve-decode", "-cache", *where}, common...)
	t0 = time.Now()
	dec, err := start(ctx, "decode", dargs, os.Stderr)
	if err != nil {
		return err
	}
	defer dec.stop()
	fmt.Printf("ready in %v at %s (%s)\n", time.Since(t0).Round(time.Millisecond), dec.url, dec.info)

	proxy := &demo.Proxy{Prefill: pre.url, Decode: dec.url}
	fmt.Printf("running %d requests through the proxy (prefill max_tokens=1 + do_remote_decode → kv_transfer_params → decode), %d at a time\n",
		len(sizes), *concurrency)
	results := make([]outcome, len(sizes))
	sem := make(chan struct{}, *concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	start := time.Now()
	for i, n := range sizes {
		wg.Add(1)
		go func(i, n int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := fmt.Sprintf("req-%d", i+1)
			prompt := strings.TrimSpace(strings.Repeat(fmt.Sprintf("%s-word ", id), n))
			res, err := proxy.Do(ctx, demo.CompletionRequest{Model: m.Name, Prompt: prompt, MaxTokens: 16}, id)
			results[i] = outcome{id: id, tokens: n, res: res, err: err}
			mu.Lock()
			done++
			if err != nil {
				fmt.Printf("  [%d/%d] %s (%d tokens): FAILED: %v\n", done, len(sizes), id, n, err)
			} else {
				t := res.Decode.Gonixl
				fmt.Printf("  [%d/%d] %s (%d tokens): staged %.1f ms, READ %.1f MB in %.1f ms (%.2f GB/s), %d bytes verified\n",
					done, len(sizes), id, n, res.Prefill.Gonixl.StageMS, float64(t.Bytes)/1e6, t.TransferMS, demo.GBps(t.Bytes, t.TransferMS), t.VerifiedBytes)
			}
			mu.Unlock()
		}(i, n)
	}
	wg.Wait()
	wall := time.Since(start)
	fmt.Printf("metrics: prefill %s, decode %s\n",
		scrape(ctx, pre.url, "gonixl_requests_total", "gonixl_stage_time_seconds_count"),
		scrape(ctx, dec.url, "gonixl_requests_total", "gonixl_xfer_time_seconds_count"))
	return summary(results, wall)
}

// scrape reads a worker's /metrics (Prometheus' text format) and returns the named samples as
// "name value" pairs, or what went wrong.
func scrape(ctx context.Context, base string, names ...string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		for _, n := range names {
			if strings.HasPrefix(line, n+" ") {
				out = append(out, line)
			}
		}
	}
	return strings.Join(out, ", ")
}

func summary(results []outcome, wall time.Duration) error {
	sort.Slice(results, func(i, j int) bool { return results[i].id < results[j].id })
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "request\ttokens\tblocks\tmodel ms\tstage ms\thandshake ms\ttransfer ms\tGB/s\th→d copy ms\tverify ms\tend-to-end ms\tverified\t")
	var bytes, verified int64
	var xferMS float64
	var spans [][2]int64
	failed := 0
	for _, r := range results {
		if r.err != nil {
			failed++
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\t-\t-\t-\t-\t-\tFAILED\t\n", r.id, r.tokens)
			continue
		}
		t := r.res.Decode.Gonixl
		ok := "yes"
		if !t.Verified || t.VerifiedBytes != t.Bytes {
			ok = "NO"
			failed++
		}
		bytes += t.Bytes
		verified += t.VerifiedBytes
		xferMS += t.TransferMS
		if t.TransferEndUS > t.TransferStartUS {
			spans = append(spans, [2]int64{t.TransferStartUS, t.TransferEndUS})
		}
		st := r.res.Prefill.Gonixl
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%s\t\n", r.id, r.tokens, t.Blocks, st.ComputeMS, st.StageMS,
			t.HandshakeMS, t.TransferMS, demo.GBps(t.Bytes, t.TransferMS), t.CopyMS, t.VerifyMS, float64(r.res.Total.Microseconds())/1000, ok)
	}
	tw.Flush()
	busy := busyMS(spans)
	fmt.Printf("\ntotal: %d requests, %.1f MB of KV moved over NIXL, %d bytes verified, wall %.2f s\n", len(results), float64(bytes)/1e6, verified, wall.Seconds())
	fmt.Printf("transfer only: %.2f GB/s aggregate (%.1f MB over the %.1f ms during which a READ was in flight; per-request sum %.1f ms)\n",
		demo.GBps(bytes, busy), float64(bytes)/1e6, busy, xferMS)
	if failed > 0 {
		return errors.New(strconv.Itoa(failed) + " request(s) failed or were not verified")
	}
	fmt.Println("OK: every byte of every request arrived intact")
	return nil
}

// busyMS is the length of the union of the [start, end) spans (Unix microseconds), in milliseconds.
func busyMS(spans [][2]int64) float64 {
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	var total, end int64
	for _, s := range spans {
		if s[0] > end {
			total += s[1] - s[0]
			end = s[1]
		} else if s[1] > end {
			total += s[1] - end
			end = s[1]
		}
	}
	return float64(total) / 1000
}
