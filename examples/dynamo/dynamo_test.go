package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newCluster builds this command (the Go workers are this binary re-executed, built without the race
// detector) and starts the whole set behind Dynamo's frontend: real Dynamo (the cached venv), real NIXL;
// prefills Go prefill workers (each with a Dynamo prefill worker), given prefillArgs besides the batch shape.
func newCluster(t *testing.T, callTimeout time.Duration, rows, maxSeq, prefills int, prefillArgs ...string) *cluster {
	t.Helper()
	python := testenv.DynamoPython(t)
	t.Setenv("NIXL_LIB_DIR", testenv.RequireNIXLLibDir(t))
	bin := testenv.BuildCommand(t, "dynamo-demo")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := startCluster(ctx, clusterConfig{Self: bin, Python: python, Worker: filepath.Join(testenv.RepoRoot(), "python", "dynamo_worker.py"),
		Dir: dir, GoArgs: []string{"-vllm-version", "0.31.0", "-num-blocks", "256", "-log-level", "warn"},
		PrefillArgs: append([]string{"-max-seq", strconv.Itoa(maxSeq), "-batch-rows", strconv.Itoa(rows)}, prefillArgs...),
		DecodeArgs:  []string{"-cache", "dram"}, Prefills: prefills,
		Context: maxSeq, KVBlocks: 256, MaxSeqs: rows, CallTimeout: callTimeout, Model: "gonixl-demo"})
	require.NoError(t, err)
	t.Cleanup(func() {
		cl.close()
		if t.Failed() { // the processes have exited: their log files are complete
			for _, p := range cl.procs() {
				t.Logf("%s (%v):%s", p.Name, p.Err(), p.Tail())
			}
		}
	})
	return cl
}

// TestDynamoEndToEnd drives gonixl's Go workers through NVIDIA Dynamo's frontend (KV-aware routing, file
// discovery, TCP request plane, loopback): concurrent requests of different lengths and a streaming one, each
// proven from both workers' records (the decode received exactly the prefill's params, remote_request_id is
// Dynamo's request id, every byte verified). Then the failure paths on the same set: a stopped (SIGSTOP) Go
// prefill and a killed one give the client an error, not a hang; a Dynamo worker stopped with SIGTERM leaves
// discovery (the frontend's view and the file records) at once and requests fail fast; a killed one leaves
// when its record expires.
func TestDynamoEndToEnd(t *testing.T) {
	const callTimeout = 20 * time.Second
	cl := newCluster(t, callTimeout, 6, 1024, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("concurrent and streaming", func(t *testing.T) {
		lengths := []int{333, 17, 160, 1000, 47}
		type result struct {
			res    completion
			tokens int
			err    error
		}
		results := make([]result, len(lengths)+1)
		var wg sync.WaitGroup
		for i, n := range lengths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := cl.Complete(ctx, prompt(i+1, n), 4, false)
				results[i] = result{res, n, err}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := cl.Complete(ctx, prompt(99, 200), 6, true)
			results[len(lengths)] = result{res, 200, err}
		}()
		wg.Wait()
		prefill, decode, err := cl.RequestRecords()
		require.NoError(t, err)
		ids := map[string]bool{}
		for i, r := range results {
			require.NoError(t, r.err, "request %d (%d tokens)", i, r.tokens)
			require.Equal(t, "length", r.res.FinishReason)
			proof, err := Check(r.res, r.tokens, prefill, decode)
			require.NoError(t, err)
			require.Equal(t, r.res.RequestID(), proof.Decode.RequestID)
			ids[r.res.RequestID()] = true
		}
		require.Len(t, ids, len(results), "Dynamo request ids are distinct")
		stream := results[len(lengths)].res
		require.Equal(t, 6, stream.Chunks, "the streamed response came as one chunk per token: %+v", stream)
	})

	t.Run("stopped Go prefill gives an error, not a hang", func(t *testing.T) {
		require.NoError(t, cl.goPrefills[0].Signal(syscall.SIGSTOP))
		rctx, rcancel := context.WithTimeout(ctx, callTimeout+60*time.Second)
		_, err := cl.Complete(rctx, prompt(7, 64), 4, false)
		rcancel()
		require.NoError(t, cl.goPrefills[0].Signal(syscall.SIGCONT))
		t.Logf("with the Go prefill stopped: %v", err)
		require.Error(t, err)
		require.False(t, errors.Is(err, context.DeadlineExceeded), "the frontend answered only when the client gave up: %v", err)
		require.Contains(t, err.Error(), "HTTP ")
		requireServes(t, ctx, cl, 8) // again, once the Go prefill runs
	})

	t.Run("client disconnect cancels the decode call", func(t *testing.T) {
		// The Go decode is stopped, so the request waits there; the client gives up; Dynamo cancels the
		// request and the decode worker closes its call to the Go decode.
		require.NoError(t, cl.goDecode.Signal(syscall.SIGSTOP))
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := cl.Complete(rctx, prompt(11, 64), 4, false)
		rcancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		for !strings.Contains(readFile(cl.dynDecode.Log), "cancelled by Dynamo: cancelling the gonixl call") {
			select {
			case <-ctx.Done():
				require.NoError(t, cl.goDecode.Signal(syscall.SIGCONT))
				t.Fatalf("the decode worker did not cancel its call:%s", cl.dynDecode.Tail())
			case <-time.After(200 * time.Millisecond):
			}
		}
		require.NoError(t, cl.goDecode.Signal(syscall.SIGCONT))
		requireServes(t, ctx, cl, 12) // again
	})

	t.Run("killed Go prefill gives an error", func(t *testing.T) {
		require.NoError(t, cl.goPrefills[0].Signal(syscall.SIGKILL))
		<-cl.goPrefills[0].Done()
		rctx, rcancel := context.WithTimeout(ctx, callTimeout+60*time.Second)
		defer rcancel()
		_, err := cl.Complete(rctx, prompt(9, 64), 4, false)
		t.Logf("with the Go prefill killed: %v", err)
		require.Error(t, err)
		require.False(t, errors.Is(err, context.DeadlineExceeded), "no answer before the client gave up: %v", err)
		require.Contains(t, err.Error(), "HTTP ")
	})

	t.Run("stopped worker leaves discovery", func(t *testing.T) {
		recs, err := cl.Records("dynamo/prefill/generate")
		require.NoError(t, err)
		require.NotEmpty(t, recs, "the prefill worker's discovery record")
		require.NoError(t, cl.dynPrefills[0].Signal(syscall.SIGTERM))
		comps := waitUndiscovered(t, ctx, cl, "prefill", "the stopped prefill worker")
		require.Equal(t, 1, comps["backend"], "the decode worker stays")
		select {
		case <-cl.dynPrefills[0].Done():
		case <-ctx.Done():
			t.Fatal("the prefill worker did not exit after SIGTERM")
		}
		_, err = cl.Complete(ctx, prompt(10, 64), 4, false)
		t.Logf("with no prefill worker: %v", err)
		require.Error(t, err)
		require.Contains(t, err.Error(), "HTTP 503")
	})

	t.Run("killed worker leaves discovery", func(t *testing.T) {
		// SIGKILL: no unregistering; the record stops being refreshed and expires.
		require.NoError(t, cl.dynDecode.Signal(syscall.SIGKILL))
		<-cl.dynDecode.Done()
		t0 := time.Now()
		waitUndiscovered(t, ctx, cl, "backend", "the killed decode worker")
		t.Logf("the killed decode worker left discovery after %v", time.Since(t0).Round(100*time.Millisecond))
	})
}

// waitUndiscovered waits until neither the frontend nor the discovery folder lists the component ("prefill",
// or "backend": the decode worker's) and returns the frontend's components then; who names it in the failure.
func waitUndiscovered(t *testing.T, ctx context.Context, cl *cluster, component, who string) map[string]int {
	t.Helper()
	for {
		comps, err := cl.Components(ctx)
		recs, _ := cl.Records("dynamo/" + component + "/generate")
		if err == nil && comps[component] == 0 && len(recs) == 0 {
			return comps
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s is still discovered: frontend %v (%v), records %v", who, comps, err, recs)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// requireServes sends request i (64 tokens) and proves it from both workers' records (Check).
func requireServes(t *testing.T, ctx context.Context, cl *cluster, i int) {
	t.Helper()
	res, err := cl.Complete(ctx, prompt(i, 64), 4, false)
	require.NoError(t, err, "request %d", i)
	prefill, decode, err := cl.RequestRecords()
	require.NoError(t, err)
	_, err = Check(res, 64, prefill, decode)
	require.NoError(t, err)
}

// readFile reads a log file a child process appends to (a file, not a buffer the child writes into).
func readFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}
