package vllmengine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Stream gathers vLLM's server-sent events: text, tokens and logprobs in order, TTFT at the first chunk with
// text (not at the response headers); a stream cut before [DONE] is an error.
func TestStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(100 * time.Millisecond) // the first token comes after the headers
		for i, tok := range []string{" w1", " w2", " w3"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":%q,\"logprobs\":{\"tokens\":[%q],\"token_logprobs\":[-0.%d]}}]}\n\n", tok, tok, i+1)
			w.(http.Flusher).Flush()
		}
		if r.URL.Query().Get("cut") == "" && !strings.Contains(r.Header.Get("X-Request-Id"), "cut") {
			fmt.Fprint(w, "data: [DONE]\n\n")
		}
	}))
	defer srv.Close()
	c, err := Stream(ctx, srv.Client(), srv.URL, Request{Model: "m", Prompt: "w0", MaxTokens: 3})
	require.NoError(t, err)
	assert.Equal(t, " w1 w2 w3", c.Text)
	assert.Equal(t, []string{" w1", " w2", " w3"}, c.Tokens)
	assert.Equal(t, []float64{-0.1, -0.2, -0.3}, c.Logprobs)
	assert.GreaterOrEqual(t, c.TTFT, 100*time.Millisecond)
	assert.GreaterOrEqual(t, c.Total, c.TTFT)
	_, err = Stream(ctx, srv.Client(), srv.URL, Request{Model: "m", Prompt: "w0", MaxTokens: 3, RequestID: "cut"})
	assert.ErrorContains(t, err, "without [DONE]")
}

// A worker's error status comes back with its message.
func TestCompleteError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no reference KV for this prompt", http.StatusInternalServerError)
	}))
	defer srv.Close()
	_, err := Complete(ctx, srv.Client(), srv.URL, Request{Model: "m", Prompt: "w0", MaxTokens: 1, KVTransferParams: RemoteDecodeParams})
	assert.ErrorContains(t, err, "HTTP 500: no reference KV for this prompt")
}

// The buffer keeps the last bytes within its bound.
func TestBuffer(t *testing.T) {
	b := NewBuffer(100)
	for i := range 50 {
		fmt.Fprintf(b, "line %02d\n", i)
	}
	s := b.String()
	assert.LessOrEqual(t, len(s), 100)
	assert.True(t, strings.HasSuffix(s, "line 49\n"), s)
	assert.Equal(t, "line 49\n", b.Tail(8)[len("…"):])
	assert.Equal(t, 1, b.Count("line 49"))
	assert.Equal(t, strings.Count(s, "line"), b.Count("line"))
}

// Prompts are the tokenizer's words and their ids; ReadKV refuses a file of the wrong size.
func TestPromptAndKV(t *testing.T) {
	p := MakePrompt(5, 1)
	require.Len(t, p.IDs, 5)
	for i, w := range strings.Fields(p.Text) {
		assert.Equal(t, fmt.Sprintf("w%d", p.IDs[i]-FirstWord), w)
	}
	assert.Equal(t, p, MakePrompt(5, 1))
	c := Config{Layers: 2, KVHeads: 1, HeadDim: 2}
	f := filepath.Join(t.TempDir(), "kv.bin")
	require.NoError(t, os.WriteFile(f, make([]byte, 2*2*3*1*2*4), 0o644))
	k, v, err := ReadKV(f, c, 3)
	require.NoError(t, err)
	assert.Len(t, k, 2)
	assert.Len(t, v[1], 24)
	_, _, err = ReadKV(f, c, 4)
	assert.ErrorContains(t, err, "want 128")
}

// Start against stand-ins for python: one that exits during start-up (its output comes with the error), one
// whose side-channel port is "in use" (started again with other ports, then given up), one that never gets
// healthy (the start-up bound; its process group, a grandchild included, is gone afterwards).
func TestStartFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755))
		return p
	}
	_, err := Start(ctx, Spec{Python: script("exits", "echo 'no module named vllm' >&2; exit 3"), Model: dir, Name: "stand-in"})
	assert.ErrorContains(t, err, "exited during start-up")
	assert.ErrorContains(t, err, "no module named vllm")

	_, err = Start(ctx, Spec{Python: script("inuse", "echo \"port $VLLM_NIXL_SIDE_CHANNEL_PORT: Address already in use\"; sleep 60"), Model: dir, Name: "stand-in"})
	assert.ErrorIs(t, err, syscall.EADDRINUSE)

	pidFile := filepath.Join(dir, "grandchild.pid")
	_, err = Start(ctx, Spec{Python: script("hangs", "sleep 300 & echo $! > "+pidFile+"; wait"), Model: dir, Name: "stand-in", StartupTimeout: 2 * time.Second})
	assert.ErrorContains(t, err, "not ready after")
	raw, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	// Gone, or a zombie that nobody has reaped yet (this test's reaper is whatever adopted it).
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		f := strings.Fields(string(stat))
		require.Greater(t, len(f), 2)
		assert.Equal(t, "Z", f[2], "the engine's grandchild outlived Stop: %s", stat)
	}
}

// Scrape sums a metric over its label sets and tells a missing one apart.
func TestScrape(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP vllm:nixl_bytes_transferred x\nvllm:nixl_bytes_transferred_sum{engine=\"0\",model_name=\"m{x}\"} 1024.0\n"+
			"vllm:nixl_bytes_transferred_sum{engine=\"1\"} 2048\nvllm:nixl_bytes_transferred_count{engine=\"0\"} 2\ngonixl_blocks_held 3\n")
	}))
	defer srv.Close()
	v, ok, err := Scrape(ctx, srv.Client(), srv.URL, "vllm:nixl_bytes_transferred_sum")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 3072.0, v)
	v, ok, err = Scrape(ctx, srv.Client(), srv.URL, "gonixl_blocks_held")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 3.0, v)
	_, ok, err = Scrape(ctx, srv.Client(), srv.URL, "vllm:nixl_bytes")
	require.NoError(t, err)
	assert.False(t, ok)
}

// The request carries the top logprobs asked for and the cache salt; Margin is the smallest top-2 gap over
// the generated tokens (a token with one entry does not count).
func TestCompleteMargin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = nil
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"choices":[{"text":" w1 w2 w3","logprobs":{"tokens":[" w1"," w2"," w3"],"token_logprobs":[-0.1,-0.2,-0.3],`+
			`"top_logprobs":[{" w1":-0.1," w9":-2.1},{" w2":-0.2," w8":-0.7," w7":-3},{" w3":-0.3}]}}],"kv_transfer_params":{"x":1}}`)
	}))
	defer srv.Close()
	c, err := Complete(ctx, srv.Client(), srv.URL, Request{Model: "m", Prompt: "w0", MaxTokens: 3, Logprobs: 2, CacheSalt: "s1"})
	require.NoError(t, err)
	assert.Equal(t, 2.0, got["logprobs"])
	assert.Equal(t, "s1", got["cache_salt"])
	assert.NotContains(t, got, "kv_transfer_params")
	assert.InDelta(t, 0.5, c.Margin, 1e-9)
	assert.Equal(t, []string{" w1", " w2", " w3"}, c.Tokens)
	assert.JSONEq(t, `{"x":1}`, string(c.Params))
	_, err = Complete(ctx, srv.Client(), srv.URL, Request{Model: "m", Prompt: "w0", MaxTokens: 3})
	require.NoError(t, err)
	assert.Equal(t, 1.0, got["logprobs"])
	assert.NotContains(t, got, "cache_salt")
}

// The engine's command line and environment follow the spec: dtype, sequences, log requests, prefix caching,
// the lease (kv_lease_duration with leases, VLLM_NIXL_ABORT_REQUEST_TIMEOUT without), the compatibility
// check, more environment. A stand-in prints them and exits; Begin's Wait returns why, and Abort after Wait
// does nothing.
func TestSpecCommandLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	py := filepath.Join(dir, "args")
	require.NoError(t, os.WriteFile(py, []byte("#!/bin/sh\necho \"ARGS $*\"; echo \"ABORT=$VLLM_NIXL_ABORT_REQUEST_TIMEOUT X=$X\"; exit 3\n"), 0o755))
	st := Begin(ctx, Spec{Python: py, Model: dir, Name: "stand-in", BlockSize: 64, DType: "bfloat16", MaxNumSeqs: 4, PrefixCaching: true,
		EnforceCompat: true, LogRequests: true, Lease: 30 * time.Second, Leases: true, TP: 2, Env: []string{"X=y"}})
	_, err := st.Wait()
	st.Abort()
	require.ErrorContains(t, err, "exited during start-up")
	for _, want := range []string{"--block-size 64", "--dtype bfloat16", "--max-num-seqs 4", "--enable-log-requests --enable-prefix-caching",
		`"kv_lease_duration":30`, "ABORT= X=y", "--tensor-parallel-size 2 --distributed-executor-backend mp"} {
		assert.ErrorContains(t, err, want)
	}
	assert.NotContains(t, err.Error(), "enforce_handshake_compat")
	_, err = Start(ctx, Spec{Python: py, Model: dir, Name: "stand-in", Lease: 30 * time.Second})
	require.ErrorContains(t, err, "ABORT=30")
	assert.ErrorContains(t, err, `"enforce_handshake_compat":false`)
	assert.ErrorContains(t, err, "--dtype float32 --max-model-len 1024 --max-num-seqs 8")
	assert.ErrorContains(t, err, "--no-enable-prefix-caching")
	assert.NotContains(t, err.Error(), "kv_lease_duration")
	assert.NotContains(t, err.Error(), "--tensor-parallel-size")
}

// Abort before Wait ends the start-up and leaves nothing running.
func TestBeginAbort(t *testing.T) {
	dir := t.TempDir()
	py := filepath.Join(dir, "hangs")
	require.NoError(t, os.WriteFile(py, []byte("#!/bin/sh\nsleep 300\n"), 0o755))
	st := Begin(context.Background(), Spec{Python: py, Model: dir, Name: "stand-in"})
	time.Sleep(100 * time.Millisecond)
	st.Abort()
	_, err := st.Wait()
	assert.ErrorIs(t, err, context.Canceled)
}
