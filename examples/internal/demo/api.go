package demo

import (
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
)

// api is what the two demo servers share: the peer's wire profile, the logger, and the OpenAI-shaped HTTP API
// around each one's completions handler.
type api struct {
	version string // the peer's vLLM version
	profile protocol.Profile
	log     *zap.Logger
	prefill bool                 // the side served: requests with do_remote_decode (prefill) or do_remote_prefill (decode)
	newID   func(n int64) string // the id of the n-th request that came without X-Request-Id
	seq     atomic.Int64
}

// init sets the API up for a peer of the vLLM version, logging to log (nil: nowhere).
func (a *api) init(version string, log *zap.Logger, prefill bool, newID func(n int64) string) error {
	p, err := protocol.ProfileFor(version)
	if err != nil {
		return err
	}
	if log == nil {
		log = zap.NewNop()
	}
	a.version, a.profile, a.log, a.prefill, a.newID = version, p, log, prefill, newID
	return nil
}

// handler returns the HTTP API: POST /v1/completions, GET /version (info), /health, /metrics.
func (a *api) handler(info VersionInfo, metrics prometheus.Collector, completions http.HandlerFunc) http.Handler {
	return apiMux(info, metrics, completions)
}

// VersionInfo is a worker's GET /version: the vLLM version it speaks (what vLLM's own /version answers) and
// what an orchestrator must learn from the worker instead of guessing: its KV block size and, with a prefix
// cache, where it publishes KV events (the addresses it bound, real ports included).
type VersionInfo struct {
	Version           string        `json:"version"`
	BlockSize         int           `json:"block_size"`
	PrefixCacheBlocks int           `json:"prefix_cache_blocks,omitempty"`
	KVEvents          *KVEventsInfo `json:"kv_events,omitempty"`
}

// KVEventsInfo says where a prefill worker publishes vLLM's KV events, as ZMQ endpoints (vLLM's
// kv_events_config names them endpoint and replay_endpoint).
type KVEventsInfo struct {
	Endpoint       string `json:"endpoint"`                  // the PUB socket, tcp://HOST:PORT
	ReplayEndpoint string `json:"replay_endpoint,omitempty"` // the replay ROUTER socket, if any
	Topic          string `json:"topic"`
}

// zmqEndpoint is a TCP address as a ZMQ endpoint ("" for nil).
func zmqEndpoint(a net.Addr) string {
	if a == nil {
		return ""
	}
	return "tcp://" + a.String()
}

// accept reads a completion request for this side of the flow and its id (X-Request-Id, else a new one). It
// answers 400 itself, and returns false, when the request is malformed or for the other side.
func (a *api) accept(w http.ResponseWriter, r *http.Request) (CompletionRequest, protocol.KVTransferParams, string, bool) {
	req, kv, ok := readCompletion(w, r, a.profile)
	if !ok {
		return req, kv, "", false
	}
	switch {
	case a.prefill && !kv.DoRemoteDecode:
		writeError(w, http.StatusBadRequest, "this is a prefill worker: send kv_transfer_params with do_remote_decode=true")
		return req, kv, "", false
	case !a.prefill && !kv.DoRemotePrefill:
		writeError(w, http.StatusBadRequest, "this demo decode worker serves only requests prefilled remotely (do_remote_prefill=true)")
		return req, kv, "", false
	}
	id := r.Header.Get("X-Request-Id")
	if id == "" {
		id = a.newID(a.seq.Add(1))
	}
	return req, kv, id, true
}

// oneToken is the response to req after one generated token, text, for a prompt of tokens tokens.
func oneToken(id string, req CompletionRequest, text string, tokens int) CompletionResponse {
	return CompletionResponse{
		ID: id, Object: "text_completion", Created: time.Now().Unix(), Model: req.Model,
		Choices: []Choice{{Index: 0, Text: text, FinishReason: "length"}},
		Usage:   Usage{PromptTokens: tokens, CompletionTokens: 1, TotalTokens: tokens + 1},
	}
}

// prefillID and decodeID are the workers' ids of requests that came without X-Request-Id.
func prefillID(n int64) string { return fmt.Sprintf("cmpl-%d-%d", time.Now().UnixNano(), n) }
func decodeID(n int64) string  { return fmt.Sprintf("cmpl-d-%d", n) }
