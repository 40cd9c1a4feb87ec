package vllmengine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Request is a greedy completion request (temperature 0, ignore_eos) with logprobs.
type Request struct {
	Model     string
	Prompt    string
	MaxTokens int
	// Logprobs is how many of the top logprobs come back per token (0: 1); 2 or more gives Completion.Margin.
	Logprobs int
	// CacheSalt is vLLM's cache_salt ("" = none): the request's prefix-cache entries are its own.
	CacheSalt string
	// KVTransferParams: a prefill request's {do_remote_decode: true, …}, or a decode request's copy of what
	// the prefill returned (nil: none).
	KVTransferParams json.RawMessage
	RequestID        string // X-Request-Id ("" = none)
}

// Completion is what came back: the generated text, its tokens (the tokenizer's words) and their logprobs,
// the kv_transfer_params of a prefill answer, and the times.
type Completion struct {
	Text     string
	Tokens   []string
	Logprobs []float64
	// Params is the answer's kv_transfer_params (a prefill's).
	Params json.RawMessage
	// Raw is a non-streamed answer's body (the gonixl workers add their timings there).
	Raw json.RawMessage
	// Margin is the smallest gap between the top two logprobs over the generated tokens (+Inf where no
	// token had two: Logprobs 1; 0 without logprobs): how far float noise is from flipping a greedy choice.
	Margin float64
	// TTFT is the time from sending the request to the first generated token (streamed: the first chunk
	// carrying a token; not streamed: the whole answer); Total to the end of the answer.
	TTFT, Total time.Duration
	// First is when the first generated token arrived.
	First time.Time

	hasLogprobs bool
}

func (r Request) body(stream bool) ([]byte, error) {
	logprobs := r.Logprobs
	if logprobs == 0 {
		logprobs = 1
	}
	b := map[string]any{"model": r.Model, "prompt": r.Prompt, "max_tokens": r.MaxTokens, "temperature": 0, "logprobs": logprobs,
		"ignore_eos": true, "stream": stream}
	if r.KVTransferParams != nil {
		b["kv_transfer_params"] = r.KVTransferParams
	}
	if r.CacheSalt != "" {
		b["cache_salt"] = r.CacheSalt
	}
	return json.Marshal(b)
}

type choice struct {
	Text     string `json:"text"`
	Logprobs *struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []float64            `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	} `json:"logprobs"`
}

type answer struct {
	Choices          []choice        `json:"choices"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

func (c *Completion) add(ch choice) {
	c.Text += ch.Text
	lp := ch.Logprobs
	if lp == nil {
		return
	}
	c.Tokens = append(c.Tokens, lp.Tokens...)
	c.Logprobs = append(c.Logprobs, lp.TokenLogprobs...)
	if !c.hasLogprobs {
		c.hasLogprobs, c.Margin = true, math.Inf(1)
	}
	for _, top := range lp.TopLogprobs {
		var v []float64
		for _, x := range top {
			v = append(v, x)
		}
		if len(v) < 2 {
			continue // the chosen token alone (or a tie merged by name)
		}
		sort.Sort(sort.Reverse(sort.Float64Slice(v)))
		c.Margin = min(c.Margin, v[0]-v[1])
	}
}

func post(ctx context.Context, client *http.Client, url string, r Request, stream bool) (*http.Response, time.Time, error) {
	body, err := r.body(stream)
	if err != nil {
		return nil, time.Time{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, time.Time{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.RequestID != "" {
		req.Header.Set("X-Request-Id", r.RequestID)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return nil, start, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, start, fmt.Errorf("%s: HTTP %d: %s", url, resp.StatusCode, bytes.TrimSpace(msg))
	}
	return resp, start, nil
}

// Complete posts r to url (an engine's, a gonixl worker's) and reads the whole answer.
func Complete(ctx context.Context, client *http.Client, url string, r Request) (Completion, error) {
	resp, start, err := post(ctx, client, url, r, false)
	if err != nil {
		return Completion{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return Completion{}, err
	}
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return Completion{}, fmt.Errorf("%s: %w: %.300s", url, err, raw)
	}
	if len(a.Choices) != 1 {
		return Completion{}, fmt.Errorf("%s: %d choices, want 1: %.300s", url, len(a.Choices), raw)
	}
	c := Completion{Params: a.KVTransferParams, Raw: raw, First: time.Now()}
	c.TTFT = c.First.Sub(start)
	c.Total = c.TTFT
	c.add(a.Choices[0])
	return c, nil
}

// Stream posts r to url with stream=true (vLLM's server-sent events: "data: {chunk}" lines, then
// "data: [DONE]") and gathers the chunks; TTFT is taken at the first chunk that carries a token.
func Stream(ctx context.Context, client *http.Client, url string, r Request) (Completion, error) {
	resp, start, err := post(ctx, client, url, r, true)
	if err != nil {
		return Completion{}, err
	}
	defer resp.Body.Close()
	var c Completion
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // blank separators, comments
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var a answer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			return c, fmt.Errorf("%s: a stream chunk: %w: %.300s", url, err, data)
		}
		for _, ch := range a.Choices {
			// A token may decode to no text (a special token, with ignore_eos): its logprob entry counts.
			if c.TTFT == 0 && (ch.Text != "" || ch.Logprobs != nil && len(ch.Logprobs.Tokens) > 0) {
				c.First = time.Now()
				c.TTFT = c.First.Sub(start)
			}
			c.add(ch)
		}
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("%s: reading the stream: %w", url, err)
	}
	if !done {
		return c, fmt.Errorf("%s: the stream ended without [DONE]", url)
	}
	c.Total = time.Since(start)
	return c, nil
}

// RemoteDecodeParams are the kv_transfer_params vLLM's disaggregated proxy sends with the prefill request.
var RemoteDecodeParams = json.RawMessage(`{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
 "remote_block_ids": null, "remote_host": null, "remote_port": null}`)

// Scrape sums the samples of one metric in a server's /metrics (Prometheus' text format), over every label
// set (vLLM labels its samples by engine and model); ok is false when the metric has no sample there.
func Scrape(ctx context.Context, client *http.Client, base, name string) (sum float64, ok bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("%s/metrics: HTTP %d", base, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, found := strings.CutPrefix(line, name)
		if !found || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s/metrics: %q: %w", base, line, err)
		}
		sum, ok = sum+v, true
	}
	return sum, ok, sc.Err()
}
