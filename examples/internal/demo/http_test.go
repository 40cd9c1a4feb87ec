package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

// prompt returns a prompt of n tokens (the demo's tokenizer splits on whitespace).
func prompt(n int, word string) string { return strings.TrimSpace(strings.Repeat(word+" ", n)) }

// post sends a completion request and returns the status, the Retry-After header and the body.
func post(t *testing.T, url, id string, req CompletionRequest) (int, string, []byte) {
	t.Helper()
	raw, err := json.Marshal(req)
	require.NoError(t, err)
	r, err := http.NewRequestWithContext(testenv.Context(t, 2*time.Minute), http.MethodPost, url+"/v1/completions", bytes.NewReader(raw))
	require.NoError(t, err)
	if id != "" {
		r.Header.Set("X-Request-Id", id)
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Retry-After"), body
}

const prefillParams = `{"do_remote_decode":true,"do_remote_prefill":false}`

// The workers' HTTP statuses: a duplicate request id is 409, running out of KV blocks is 503 with
// Retry-After (prefill and decode), bad kv_transfer_params are 400; the proxy passes a worker's 4xx and 503
// through instead of turning them into 502.
func TestWorkerStatuses(t *testing.T) {
	l := nixltest.Lib(t)
	ctx := testenv.Context(t, 3*time.Minute)
	pre, err := NewPrefillServer(ctx, PrefillConfig{VLLMVersion: "0.33.0", Model: Qwen3_0_6B, NumBlocks: 8, BatchRows: 2, MaxSeq: 128,
		Order: layout.HND, HoldTimeout: 10 * time.Minute, Library: l})
	require.NoError(t, err)
	defer pre.Close()
	dec, err := NewDecodeServer(DecodeConfig{VLLMVersion: "0.33.0", Model: Qwen3_0_6B, NumBlocks: 4, Order: layout.HND, Library: l})
	require.NoError(t, err)
	defer dec.Close()
	ps := httptest.NewServer(pre.Handler())
	defer ps.Close()
	ds := httptest.NewServer(dec.Handler())
	defer ds.Close()
	proxy := httptest.NewServer((&Proxy{Prefill: ps.URL, Decode: ds.URL}).Handler())
	defer proxy.Close()
	m := Qwen3_0_6B.Name

	// Through the proxy: prefill, pull, verify.
	code, _, body := post(t, proxy.URL, "ok-1", CompletionRequest{Model: m, Prompt: prompt(20, "a")})
	require.Equal(t, http.StatusOK, code, string(body))

	// Prefill: held for a decode peer (nobody reads it) …
	code, _, body = post(t, ps.URL, "held", CompletionRequest{Model: m, Prompt: prompt(16, "b"), KVTransferParams: json.RawMessage(prefillParams)})
	require.Equal(t, http.StatusOK, code, string(body))
	var held CompletionResponse
	require.NoError(t, json.Unmarshal(body, &held))
	// … so the same id again is a conflict, directly and through the proxy.
	code, _, body = post(t, ps.URL, "held", CompletionRequest{Model: m, Prompt: prompt(16, "b"), KVTransferParams: json.RawMessage(prefillParams)})
	assert.Equal(t, http.StatusConflict, code, string(body))
	code, _, body = post(t, proxy.URL, "held", CompletionRequest{Model: m, Prompt: prompt(16, "b")})
	assert.Equal(t, http.StatusConflict, code, "the proxy passes the prefill worker's 409 through: %s", body)

	// Out of KV blocks on the prefill worker (7 usable, 1 held): 6 more fit, the next does not.
	code, _, body = post(t, ps.URL, "six", CompletionRequest{Model: m, Prompt: prompt(96, "c"), KVTransferParams: json.RawMessage(prefillParams)})
	require.Equal(t, http.StatusOK, code, string(body))
	var six CompletionResponse
	require.NoError(t, json.Unmarshal(body, &six))
	code, retry, body := post(t, ps.URL, "full", CompletionRequest{Model: m, Prompt: prompt(1, "d"), KVTransferParams: json.RawMessage(prefillParams)})
	assert.Equal(t, http.StatusServiceUnavailable, code, string(body))
	assert.Equal(t, RetryAfter, retry)
	assert.Contains(t, string(body), "not enough free KV blocks")
	code, retry, body = post(t, proxy.URL, "full-2", CompletionRequest{Model: m, Prompt: prompt(1, "d")})
	assert.Equal(t, http.StatusServiceUnavailable, code, "the proxy passes 503 through: %s", body)
	assert.Equal(t, RetryAfter, retry)

	// Out of KV blocks on the decode worker (3 usable): the six-block request cannot land.
	code, retry, body = post(t, ds.URL, "six", CompletionRequest{Model: m, Prompt: prompt(96, "c"), KVTransferParams: six.KVTransferParams})
	assert.Equal(t, http.StatusServiceUnavailable, code, string(body))
	assert.Equal(t, RetryAfter, retry)

	// Bad kv_transfer_params: 400 from the decode worker.
	code, _, body = post(t, ds.URL, "bad", CompletionRequest{Model: m, Prompt: prompt(16, "b"), KVTransferParams: json.RawMessage(`{"do_remote_prefill":true}`)})
	assert.Equal(t, http.StatusBadRequest, code, string(body))
	// The held request still reads fine.
	code, _, body = post(t, ds.URL, "held", CompletionRequest{Model: m, Prompt: prompt(16, "b"), KVTransferParams: held.KVTransferParams})
	assert.Equal(t, http.StatusOK, code, string(body))
}

// The proxy's status mapping against a stand-in worker: 4xx and 503 (with its Retry-After) pass through,
// other failures — a 500, a worker that is not there — are 502.
func TestProxyPassThrough(t *testing.T) {
	for _, c := range []struct {
		status     int
		retryAfter string
		want       int
	}{
		{http.StatusBadRequest, "", http.StatusBadRequest},
		{http.StatusConflict, "", http.StatusConflict},
		{http.StatusTooManyRequests, "3", http.StatusTooManyRequests},
		{http.StatusServiceUnavailable, "7", http.StatusServiceUnavailable},
		{http.StatusInternalServerError, "", http.StatusBadGateway},
		{http.StatusBadGateway, "", http.StatusBadGateway},
	} {
		worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if c.retryAfter != "" {
				w.Header().Set("Retry-After", c.retryAfter)
			}
			writeError(w, c.status, "worker says no")
		}))
		proxy := httptest.NewServer((&Proxy{Prefill: worker.URL, Decode: worker.URL}).Handler())
		code, retry, body := post(t, proxy.URL, "x", CompletionRequest{Model: "m", Prompt: "a b"})
		assert.Equal(t, c.want, code, "worker %d: %s", c.status, body)
		if c.retryAfter != "" {
			assert.Equal(t, c.retryAfter, retry)
		}
		assert.Contains(t, string(body), "worker says no")
		proxy.Close()
		worker.Close()
	}
	// A worker that is not there.
	gone := "http://" + testenv.RefusedAddr(t)
	proxy := httptest.NewServer((&Proxy{Prefill: gone, Decode: gone}).Handler())
	defer proxy.Close()
	code, _, body := post(t, proxy.URL, "x", CompletionRequest{Model: "m", Prompt: "a b"})
	assert.Equal(t, http.StatusBadGateway, code, string(body))
}

// serveShort runs h behind ServeTimeouts with short timeouts and returns its address.
func serveShort(t *testing.T, h http.Handler, to HTTPTimeouts) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- ServeTimeouts(ctx, "127.0.0.1:0", h, func(url string) { addrc <- strings.TrimPrefix(url, "http://") }, to)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case a := <-addrc:
		return a
	case err := <-done:
		t.Fatalf("server did not start: %v", err)
	}
	return ""
}

// closedByServer reads c until the server closes it; it fails the test if that does not happen within a
// minute (a generous bound: the server's timeouts are far shorter, and the point is "not forever").
func closedByServer(t *testing.T, c net.Conn) string {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
	got, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the stalled connection open (read so far: %q)", got)
	}
	return string(got)
}

// A client that sends headers and then stalls the body is cut off (ReadTimeout), as is one that stalls
// inside the headers (ReadHeaderTimeout) and an idle keep-alive connection (IdleTimeout); the server goes on
// serving others.
func TestHTTPTimeouts(t *testing.T) {
	to := HTTPTimeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Handler: time.Minute, Write: 2 * time.Minute, Idle: 300 * time.Millisecond}
	addr := serveShort(t, (&Proxy{Prefill: "http://127.0.0.1:1", Decode: "http://127.0.0.1:1"}).Handler(), to)

	// Headers, then a body that never comes.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	require.NoError(t, err)
	got := closedByServer(t, c)
	c.Close()
	if got != "" {
		assert.True(t, strings.HasPrefix(got, "HTTP/1.1 400"), "a stalled body ends in 400 or a closed connection, got %q", got)
	}

	// Headers that never end.
	c, err = net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
	require.NoError(t, err)
	closedByServer(t, c)
	c.Close()

	// An idle keep-alive connection after one request.
	c, err = net.Dial("tcp", addr)
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, getOn(t, c, "/nothing"))
	closedByServer(t, c)
	c.Close()

	// Others are still served.
	code, _, body := post(t, "http://"+addr, "x", CompletionRequest{Model: "m", Prompt: "a"})
	assert.Equal(t, http.StatusBadGateway, code, "the proxy's workers are not there: %s", body)
}

// The default timeouts are all set, with the handler's bound under the write bound.
func TestDefaultHTTPTimeouts(t *testing.T) {
	d := DefaultHTTPTimeouts
	for _, v := range []time.Duration{d.ReadHeader, d.Read, d.Handler, d.Write, d.Idle} {
		assert.Positive(t, v)
	}
	assert.Less(t, d.Handler, d.Write)
	assert.LessOrEqual(t, d.ReadHeader, d.Read)
}
