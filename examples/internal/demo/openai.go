package demo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// CompletionRequest is the subset of vLLM's OpenAI /v1/completions request the demo serves. The prompt is text
// or, as vLLM also takes it, token ids (what a frontend that tokenizes sends, e.g. NVIDIA Dynamo's).
type CompletionRequest struct {
	Model            string          `json:"model"`
	Prompt           string          `json:"prompt"`
	PromptTokenIDs   []int           `json:"-"` // the prompt as token ids; on the wire, "prompt": [ids...]
	MaxTokens        int             `json:"max_tokens,omitempty"`
	Stream           bool            `json:"stream"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	// CacheSalt is vLLM's cache_salt: prompts share cached prefix blocks only under the same salt.
	CacheSalt string `json:"cache_salt,omitempty"`
}

type completionWire CompletionRequest

// UnmarshalJSON reads "prompt" as a string or an array of token ids.
func (r *CompletionRequest) UnmarshalJSON(data []byte) error {
	var w struct {
		completionWire
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*r = CompletionRequest(w.completionWire)
	if p := bytes.TrimSpace(w.Prompt); len(p) > 0 && p[0] == '[' {
		if err := json.Unmarshal(p, &r.PromptTokenIDs); err != nil {
			return fmt.Errorf("prompt: want a string or an array of token ids: %w", err)
		}
		return nil
	}
	if len(w.Prompt) > 0 {
		return json.Unmarshal(w.Prompt, &r.Prompt)
	}
	return nil
}

// MarshalJSON writes the token ids as "prompt" when they are set.
func (r CompletionRequest) MarshalJSON() ([]byte, error) {
	w := struct {
		completionWire
		Prompt any `json:"prompt"`
	}{completionWire(r), r.Prompt}
	if r.PromptTokenIDs != nil {
		w.Prompt = r.PromptTokenIDs
	}
	return json.Marshal(w)
}

// NumTokens is the prompt's length in tokens: its token ids, or the demo tokenizer's count of its text.
func (r CompletionRequest) NumTokens() int {
	if r.PromptTokenIDs != nil {
		return len(r.PromptTokenIDs)
	}
	return Tokens(r.Prompt)
}

// TokenIDs are the prompt's token ids: as sent, or the demo tokenizer's ids of its text (TokenIDs). Its KV
// content derives from them (KVChain), so the same prompt gives the same bytes on both sides.
func (r CompletionRequest) TokenIDs() []int {
	if r.PromptTokenIDs != nil {
		return r.PromptTokenIDs
	}
	return TokenIDs(r.Prompt)
}

// CompletionResponse is vLLM's OpenAI completion response, with kv_transfer_params on the prefill side and
// gonixl's timings.
type CompletionResponse struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Created          int64           `json:"created"`
	Model            string          `json:"model"`
	Choices          []Choice        `json:"choices"`
	Usage            Usage           `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	Gonixl           *Timing         `json:"gonixl,omitempty"`
}

// Choice is one completion choice.
type Choice struct {
	Index        int    `json:"index"`
	Text         string `json:"text"`
	FinishReason string `json:"finish_reason"`
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Timing is what each side measured (milliseconds), carried in the responses for the demo's summary.
type Timing struct {
	ComputeMS   float64 `json:"compute_ms,omitempty"` // the demo's stand-in for the model writing the device KV
	StageMS     float64 `json:"stage_ms,omitempty"`
	HandshakeMS float64 `json:"handshake_ms,omitempty"`
	TransferMS  float64 `json:"transfer_ms,omitempty"`
	PostMS      float64 `json:"post_ms,omitempty"` // the parts of TransferMS: posting the READs, then waiting for them
	WaitMS      float64 `json:"wait_ms,omitempty"`
	CopyMS      float64 `json:"copy_ms,omitempty"`   // host → device copy (host-buffered caches)
	VerifyMS    float64 `json:"verify_ms,omitempty"` // the demo's check of every byte
	// TransferStartUS and TransferEndUS bound the READ in Unix microseconds (the demo's aggregate counts
	// the time during which any transfer ran).
	TransferStartUS int64 `json:"transfer_start_us,omitempty"`
	TransferEndUS   int64 `json:"transfer_end_us,omitempty"`
	Bytes           int64 `json:"bytes,omitempty"`
	Blocks          int   `json:"blocks,omitempty"`
	VerifiedBytes   int64 `json:"verified_bytes,omitempty"`
	Verified        bool  `json:"verified"`
	// Prefix cache (prefill): the prompt's leading tokens and full blocks whose KV was cached from an
	// earlier request and reused, and the blocks computed and staged for this one.
	CachedTokens int `json:"cached_tokens,omitempty"`
	CachedBlocks int `json:"cached_blocks,omitempty"`
	StagedBlocks int `json:"staged_blocks,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ErrorResponse is vLLM's error shape.
type ErrorResponse struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}
