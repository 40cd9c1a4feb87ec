package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

func contextWithTimeout(r *http.Request, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), d)
}

// UpstreamError is a worker's answer other than 200.
type UpstreamError struct {
	Status     int
	Message    string
	RetryAfter string // the worker's Retry-After header, if any
}

func (e *UpstreamError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message) }

// passThrough reports whether the proxy answers the client with the worker's own status: a 4xx is about the
// request (bad parameters, a duplicate id) and a 503 asks the client to retry; anything else is the
// proxy's upstream failing (502).
func (e *UpstreamError) passThrough() bool {
	return (e.Status >= 400 && e.Status < 500) || e.Status == http.StatusServiceUnavailable
}

// defaultClient bounds a worker call when Proxy.Client is nil.
var defaultClient = &http.Client{Timeout: 5 * time.Minute}

// Proxy runs vLLM's disaggregated request flow, as vLLM's toy_proxy_server.py does: the request goes to the
// prefill worker with max_tokens=1 and kv_transfer_params{do_remote_decode: true}; the prefill response's
// kv_transfer_params are copied into the original request, which goes to the decode worker.
type Proxy struct {
	Prefill, Decode string // base URLs
	Client          *http.Client
}

// ProxyResult is what the proxy saw of one request.
type ProxyResult struct {
	Prefill     CompletionResponse
	Decode      CompletionResponse
	PrefillTime time.Duration
	DecodeTime  time.Duration
	Total       time.Duration
}

// Do runs one request through prefill then decode.
func (p *Proxy) Do(ctx context.Context, req CompletionRequest, requestID string) (ProxyResult, error) {
	var res ProxyResult
	start := time.Now()
	pre := req
	pre.MaxTokens = 1
	pre.Stream = false
	pre.KVTransferParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	if err := p.post(ctx, p.Prefill, pre, requestID, &res.Prefill); err != nil {
		return res, fmt.Errorf("prefill: %w", err)
	}
	res.PrefillTime = time.Since(start)
	if len(res.Prefill.KVTransferParams) == 0 {
		return res, errors.New("prefill response has no kv_transfer_params")
	}
	dec := req
	dec.KVTransferParams = res.Prefill.KVTransferParams
	t := time.Now()
	if err := p.post(ctx, p.Decode, dec, requestID, &res.Decode); err != nil {
		return res, fmt.Errorf("decode: %w", err)
	}
	res.DecodeTime = time.Since(t)
	res.Total = time.Since(start)
	return res, nil
}

func (p *Proxy) post(ctx context.Context, base string, body CompletionRequest, id string, out *CompletionResponse) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	c := p.Client
	if c == nil {
		c = defaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		ue := &UpstreamError{Status: resp.StatusCode, Message: string(bytes.TrimSpace(data)), RetryAfter: resp.Header.Get("Retry-After")}
		var e ErrorResponse
		if json.Unmarshal(data, &e) == nil && e.Message != "" {
			ue.Message = e.Message
		}
		return ue
	}
	return json.Unmarshal(data, out)
}

// Handler serves the proxy as POST /v1/completions. A worker's 4xx (bad request, duplicate id) and 503 (out
// of KV blocks, stopping; Retry-After kept) reach the client as they are; other failures are 502.
func (p *Proxy) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req CompletionRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20)).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		res, err := p.Do(r.Context(), req, r.Header.Get("X-Request-Id"))
		if err != nil {
			var ue *UpstreamError
			if errors.As(err, &ue) && ue.passThrough() {
				if ue.RetryAfter != "" {
					w.Header().Set("Retry-After", ue.RetryAfter)
				}
				writeError(w, ue.Status, err.Error())
				return
			}
			writeError(w, http.StatusBadGateway, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, res.Decode)
	})
	return mux
}
