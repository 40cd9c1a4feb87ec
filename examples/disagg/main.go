// Command disagg runs a disaggregated prefill/decode pair end to end: it starts the prefill worker (KV cache on
// a Neuron device — gonixl's fake libnrt when no Trainium is present — staged through NIXL-registered DRAM) and
// the decode worker as separate processes, then runs vLLM's disaggregated request flow through a small proxy
// for several concurrent requests of different lengths of a Qwen3-0.6B-shaped KV cache, moved over real NIXL
// (UCX on loopback). The decode worker verifies every byte. It prints progress and a summary.
//
// With -netns (root), the two workers run on two "hosts": network namespaces joined by a veth pair that the
// demo creates and deletes (netns.New), NIXL's data plane pinned to the veth (UCX over tcp, or libfabric's
// tcp provider with -backends LIBFABRIC, which needs them: libfabric's tcp provider does not run on lo). The
// orchestrator re-runs itself in the decode's namespace (its proxy reaches the decode on loopback and the
// prefill across the veth).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime/trace"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gonixl/gonixl/examples/internal/demo"
	"github.com/gonixl/gonixl/internal/netns"
)

func main() { demo.OrchestratorMain("disagg", os.Args[1:], orchestrate) }

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
	readAgents := fs.Int("read-agents", 0, "the decode worker's -read-agents: NIXL agents of its own that split each READ (0 = the default: 4 into DRAM on two CPUs or more, none into GPU memory; 1 = none)")
	readSpin := fs.Duration("read-spin", 0, "the decode worker's -read-spin: how long it polls a READ back to back before backing off (0 = the default: 10ms into GPU memory, none into DRAM; negative = none)")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the whole run")
	cudaCtx := fs.String("prefill-cuda-context", "auto", "the prefill worker's -cuda-context: auto (hold a CUDA context when a driver and device are present: needed for reads into a GPU on this host at PCIe speed), on, off")
	busyPoll := fs.Duration("prefill-busy-poll", 0, "the prefill worker's -busy-poll (0: it polls NIXL back to back while blocks are held)")
	pin := fs.Bool("prefill-cuda-pin-staging", true, "the prefill worker's -cuda-pin-staging (page-lock its staging arena for CUDA while it holds a context)")
	useNetNS := fs.Bool("netns", false, "run prefill and decode in two network namespaces joined by a veth pair (root; implied by -backends LIBFABRIC)")
	inner := fs.String("netns-inner", "", "internal: the namespaces made by -netns (prefill-ns,prefill-if,decode-if); this run is in the decode's")
	fs.Parse(os.Args[1:])
	if *inner == "" && (*useNetNS || strings.Contains(strings.ToUpper(c.Backends), "LIBFABRIC")) {
		return inNetNS(*timeout)
	}
	var preWrap, preEnv, decEnv, preNet []string
	if *inner != "" {
		f := strings.Split(*inner, ",")
		if len(f) != 3 {
			return fmt.Errorf("bad -netns-inner %q", *inner)
		}
		preWrap = []string{"ip", "netns", "exec", f[0]}
		preEnv, decEnv = append(os.Environ(), netns.DataPlaneEnv(f[1])...), append(os.Environ(), netns.DataPlaneEnv(f[2])...)
		preNet = []string{"-http", netns.PrefillIP + ":0", "-side-channel-host", netns.PrefillIP}
	}
	sizes, maxLen, err := demo.ParseLengths(*lengths)
	if err != nil {
		return err
	}
	stopTrace, err := c.StartTrace()
	if err != nil {
		return err
	}
	defer stopTrace()
	ctx, cancel := demo.RunContext(*timeout)
	defer cancel()

	m := demo.Qwen3_0_6B
	fmt.Printf("gonixl disaggregated prefill/decode demo — vLLM %s wire profile, %s\n", c.VLLMVersion, demo.DescribeModel())
	fmt.Print("starting prefill worker (Neuron KV tensors → pinned DRAM staging → NIXL) ... ")
	t0 := time.Now()
	pre, preURL, preInfo, err := demo.StartWorker(ctx, demo.WorkerSpec{Name: "prefill worker", Role: "prefill", Wrap: preWrap, Env: preEnv,
		Args: append(append(append([]string{"-max-seq", strconv.Itoa(maxLen), "-batch-rows", strconv.Itoa(*concurrency),
			"-cuda-context", *cudaCtx, "-cuda-pin-staging=" + strconv.FormatBool(*pin), "-busy-poll", busyPoll.String()}, c.WorkerArgs()...), preNet...), c.TraceArgs("prefill")...)})
	if err != nil {
		return err
	}
	defer pre.Stop(10 * time.Second)
	fmt.Printf("ready in %v at %s (%s)\n", time.Since(t0).Round(time.Millisecond), preURL, preInfo)
	if *gpu {
		*where = "gpu"
	}
	fmt.Printf("starting decode worker (NIXL READ → KV cache: %s) ... ", *where)
	t0 = time.Now()
	dec, decURL, decInfo, err := demo.StartWorker(ctx, demo.WorkerSpec{Name: "decode worker", Role: "decode", Env: decEnv,
		Args: append(append([]string{"-cache", *where, "-read-agents", strconv.Itoa(*readAgents), "-read-spin", readSpin.String()}, c.WorkerArgs()...), c.TraceArgs("decode")...)})
	if err != nil {
		return err
	}
	defer dec.Stop(10 * time.Second)
	fmt.Printf("ready in %v at %s (%s)\n", time.Since(t0).Round(time.Millisecond), decURL, decInfo)

	proxy := &demo.Proxy{Prefill: preURL, Decode: decURL}
	fmt.Printf("running %d requests through the proxy (prefill max_tokens=1 + do_remote_decode → kv_transfer_params → decode), %d at a time\n",
		len(sizes), *concurrency)
	results := make([]outcome, len(sizes))
	wall := demo.RunRequests(len(sizes), *concurrency, func(i int) string {
		n := sizes[i]
		id := fmt.Sprintf("req-%d", i+1)
		prompt := strings.TrimSpace(strings.Repeat(fmt.Sprintf("%s-word ", id), n))
		ctx, task := trace.NewTask(ctx, "disagg.request")
		trace.Log(ctx, "request_id", id)
		res, err := proxy.Do(ctx, demo.CompletionRequest{Model: m.Name, Prompt: prompt, MaxTokens: 16}, id)
		task.End()
		results[i] = outcome{id: id, tokens: n, res: res, err: err}
		if err != nil {
			return fmt.Sprintf("%s (%d tokens): FAILED: %v", id, n, err)
		}
		t := res.Decode.Gonixl
		return fmt.Sprintf("%s (%d tokens): staged %.1f ms, READ %.1f MB in %.1f ms (%.2f GB/s), %d bytes verified",
			id, n, res.Prefill.Gonixl.StageMS, float64(t.Bytes)/1e6, t.TransferMS, demo.GBps(t.Bytes, t.TransferMS), t.VerifiedBytes)
	})
	fmt.Printf("metrics: prefill %s, decode %s\n",
		scrape(ctx, preURL, "gonixl_requests_total", "gonixl_stage_time_seconds_count"),
		scrape(ctx, decURL, "gonixl_requests_total", "gonixl_xfer_time_seconds_count"))
	fmt.Printf("phases (seconds summed over the requests): decode %s; prefill %s\n",
		scrape(ctx, decURL, "gonixl_xfer_prepare_time_seconds_sum", "gonixl_xfer_post_time_seconds_sum", "gonixl_xfer_wait_time_seconds_sum",
			"gonixl_heartbeat_time_seconds_sum", "gonixl_copy_time_seconds_sum"),
		scrape(ctx, preURL, "gonixl_held_time_seconds_sum"))
	return summary(results, wall)
}

// inNetNS makes the two namespaces, re-runs this program (same flags) inside the decode's, and deletes them.
func inNetNS(timeout time.Duration) error {
	n, err := netns.New("gonixl-demo")
	if err != nil {
		return fmt.Errorf("-netns: %w", err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "disagg:", err)
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("two hosts: network namespaces %s (prefill, %s on %s) and %s (decode, %s on %s), joined by a veth pair\n",
		n.Prefill, netns.PrefillIP, n.PrefillIf, n.Decode, netns.DecodeIP, n.DecodeIf)
	ctx, cancel := demo.RunContext(timeout + time.Minute)
	defer cancel()
	args := append([]string{"netns", "exec", n.Decode, self}, os.Args[1:]...)
	cmd := exec.CommandContext(ctx, "ip", append(args, "-netns-inner", n.Prefill+","+n.PrefillIf+","+n.DecodeIf)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the run in %s: %w", n.Decode, err)
	}
	return nil
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
	tb := demo.NewTable("request", "tokens", "blocks", "model ms", "stage ms", "handshake ms", "transfer ms", "post ms", "wait ms", "GB/s", "h→d copy ms",
		"verify ms", "end-to-end ms", "verified")
	var bytes, verified int64
	var xferMS float64
	var spans [][2]int64
	for _, r := range results {
		if r.err != nil {
			tb.Fail(r.id, r.tokens)
			continue
		}
		t := r.res.Decode.Gonixl
		ok := "yes"
		if !t.Verified || t.VerifiedBytes != t.Bytes {
			ok = "NO"
			tb.Failed++
		}
		bytes += t.Bytes
		verified += t.VerifiedBytes
		xferMS += t.TransferMS
		if t.TransferEndUS > t.TransferStartUS {
			spans = append(spans, [2]int64{t.TransferStartUS, t.TransferEndUS})
		}
		st := r.res.Prefill.Gonixl
		tb.Row("%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%s", r.id, r.tokens, t.Blocks, st.ComputeMS, st.StageMS,
			t.HandshakeMS, t.TransferMS, t.PostMS, t.WaitMS, demo.GBps(t.Bytes, t.TransferMS), t.CopyMS, t.VerifyMS, float64(r.res.Total.Microseconds())/1000, ok)
	}
	tb.Flush()
	busy := busyMS(spans)
	fmt.Printf("\ntotal: %d requests, %.1f MB of KV moved over NIXL, %d bytes verified, wall %.2f s\n", len(results), float64(bytes)/1e6, verified, wall.Seconds())
	fmt.Printf("transfer only: %.2f GB/s aggregate (%.1f MB over the %.1f ms during which a READ was in flight; per-request sum %.1f ms)\n",
		demo.GBps(bytes, busy), float64(bytes)/1e6, busy, xferMS)
	if err := tb.Err(); err != nil {
		return err
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
