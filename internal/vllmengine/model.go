package vllmengine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Script is python/engine_model.py's path under the repository root.
const Script = "python/engine_model.py"

// FirstWord is the token id of the tokenizer's word "w0" (after <unk>, <s>, </s>); Words is its vocabulary.
const (
	FirstWord = 3
	Words     = 4096
)

// Config is what the examples read of the model's config.json.
type Config struct {
	Layers  int `json:"num_hidden_layers"`
	KVHeads int `json:"num_key_value_heads"`
	HeadDim int `json:"head_dim"`
}

// MakeModel writes the model (engine_model.py make-model) into cacheDir/qwen3-tiny-<digest>, the digest that
// of the scripts that write it (so a changed script makes a new model), unless it is there already; it
// returns the folder. The model is written into a temporary sibling and renamed, so a run stopped half-way
// leaves no half-written model behind.
func MakeModel(ctx context.Context, python, repo, cacheDir string) (string, error) {
	h := sha256.New()
	for _, f := range []string{Script, "python/dynamo_worker.py"} {
		b, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	dir := filepath.Join(cacheDir, "qwen3-tiny-"+hex.EncodeToString(h.Sum(nil))[:12])
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".making-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, python, filepath.Join(repo, Script), "make-model", tmp)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s make-model: %w: %s", Script, err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "model.safetensors")); serr == nil {
			return dir, nil // another run made it meanwhile
		}
		return "", err
	}
	return dir, nil
}

// ReadConfig reads the model folder's config.json.
func ReadConfig(model string) (Config, error) {
	var c Config
	b, err := os.ReadFile(filepath.Join(model, "config.json"))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s/config.json: %w", model, err)
	}
	if c.Layers <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 {
		return c, fmt.Errorf("%s/config.json: num_hidden_layers %d, num_key_value_heads %d, head_dim %d", model, c.Layers, c.KVHeads, c.HeadDim)
	}
	return c, nil
}

// Prompt is a prompt of the tokenizer's words: its text and its token ids.
type Prompt struct {
	Text string
	IDs  []int
}

// MakePrompt returns a prompt of n words drawn from seed.
func MakePrompt(n int, seed uint64) Prompt {
	r := rand.New(rand.NewPCG(seed, 20))
	var p Prompt
	words := make([]string, n)
	for i := range words {
		w := r.IntN(Words)
		words[i] = fmt.Sprintf("w%d", w)
		p.IDs = append(p.IDs, FirstWord+w)
	}
	p.Text = strings.Join(words, " ")
	return p
}

// Reference is the model's reference computation of a prompt (transformers' forward pass).
type Reference struct {
	// KV is every layer's K then V, each (1, kv_heads, tokens, head_dim) float32: transformers'
	// past_key_values, post-RoPE, NxDI's BHSD layout; written by engine_model.py into File.
	File string
	// MinMargin is the smallest top-2 logprob margin of the greedy continuation: how far float noise is from
	// flipping a greedy choice.
	MinMargin float64
}

// ComputeReference runs engine_model.py reference over the prompt's ids and writes its KV to out.
func ComputeReference(ctx context.Context, python, repo, model, out string, p Prompt) (Reference, error) {
	args := []string{filepath.Join(repo, Script), "reference", model, out}
	for _, id := range p.IDs {
		args = append(args, fmt.Sprint(id))
	}
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
	stdout, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return Reference{}, fmt.Errorf("%s reference: %w: %s", Script, err, ee.Stderr)
		}
		return Reference{}, fmt.Errorf("%s reference: %w", Script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	var res struct {
		MinMargin float64 `json:"min_margin"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return Reference{}, fmt.Errorf("%s reference: %w: %s", Script, err, stdout)
	}
	return Reference{File: out, MinMargin: res.MinMargin}, nil
}

// ReadKV splits a reference KV file into its layers' K and V ((kv_heads, tokens, head_dim) float32 each).
func ReadKV(file string, c Config, tokens int) (k, v [][]byte, err error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	n := tokens * c.KVHeads * c.HeadDim * 4
	if len(raw) != 2*c.Layers*n {
		return nil, nil, fmt.Errorf("%s: %d bytes, want %d (%d layers × K, V × %d tokens × %d heads × %d × fp32)", file, len(raw), 2*c.Layers*n,
			c.Layers, tokens, c.KVHeads, c.HeadDim)
	}
	for l := range c.Layers {
		k = append(k, raw[(2*l)*n:(2*l+1)*n])
		v = append(v, raw[(2*l+1)*n:(2*l+2)*n])
	}
	return k, v, nil
}
