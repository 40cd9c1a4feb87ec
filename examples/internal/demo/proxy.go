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

func errorsIs(err, target error) bool { return errors.Is(err, target) }

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
		c = http.DefaultClient
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
		var e ErrorResponse
		if json.Unmarshal(data, &e) == nil && e.Message != "" {
			return fmt.Errorf("HTTP %d: %s", resp.StatusCode, e.Message)
		}
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	return json.Unmarshal(data, out)
}

// Handler serves the proxy as POST /v1/completions.
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
			writeError(w, http.StatusBadGateway, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, res.Decode)
	})
	return mux
}
