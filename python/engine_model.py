"""The engine tier's model (connector/vllm_engine_test.go): a small Qwen3 with random weights and a word-level
tokenizer, written locally (no hub), and its reference KV computed by transformers.

  make-model DIR           write config.json, model.safetensors and the tokenizer (words "w0".."w4095")
  reference DIR OUT IDS…   run transformers' forward pass over the prompt's token ids and write OUT: every
                           layer's K then V as transformers' past_key_values hold them — (1, kv_heads, seq,
                           head_dim) float32, post-RoPE: NxDI's BHSD layout — layer after layer; prints a JSON
                           line with the greedy continuation and the smallest top-2 logprob margin over it

Weights are random but scaled (std 0.15 instead of 0.02, lm_head 1.0) so that the next-token distribution is
peaked: greedy decoding is decided by the model, not by float noise (`reference` reports the margin and the
test requires it). Runs in an engine venv (torch, transformers, tokenizers, safetensors).
"""
from __future__ import annotations

import json
import os
import sys

LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN = 4, 4, 2, 64, 256, 512
SEED = 20


def config() -> dict:
    from dynamo_worker import VOCAB  # the demo's word-level vocabulary: 3 special tokens + VOCAB words
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "hidden_size": HIDDEN,
        "intermediate_size": FFN, "vocab_size": VOCAB + 3, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_theta": 10000, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "dtype": "float32",
    }


def make_model(folder: str) -> None:
    import torch
    from safetensors.torch import save_file
    from dynamo_worker import make_model as write_tokenizer

    write_tokenizer(folder, 2048)  # tokenizer.json, tokenizer_config.json (and a config.json replaced below)
    cfg = config()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    g = torch.Generator().manual_seed(SEED)
    w = {}

    def rnd(name, *shape, std=0.15):
        w[name] = (torch.randn(*shape, generator=g) * std).contiguous()

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    rnd("model.embed_tokens.weight", cfg["vocab_size"], HIDDEN, std=1.0)
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        rnd(p + "self_attn.q_proj.weight", q, HIDDEN)
        rnd(p + "self_attn.k_proj.weight", kv, HIDDEN)
        rnd(p + "self_attn.v_proj.weight", kv, HIDDEN)
        rnd(p + "self_attn.o_proj.weight", HIDDEN, q)
        rnd(p + "mlp.gate_proj.weight", FFN, HIDDEN)
        rnd(p + "mlp.up_proj.weight", FFN, HIDDEN)
        rnd(p + "mlp.down_proj.weight", HIDDEN, FFN)
        for n in ("input_layernorm", "post_attention_layernorm"):
            w[p + n + ".weight"] = torch.ones(HIDDEN)
        for n in ("q_norm", "k_norm"):
            w[p + "self_attn." + n + ".weight"] = torch.ones(HEAD_DIM)
    w["model.norm.weight"] = torch.ones(HIDDEN)
    rnd("lm_head.weight", cfg["vocab_size"], HIDDEN, std=1.0)
    save_file(w, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def reference(folder: str, out: str, ids: list[int], steps: int = 16) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        res = model(torch.tensor([ids]), use_cache=True)
        cache = res.past_key_values
        if hasattr(cache, "layers"):
            kvs = [(layer.keys, layer.values) for layer in cache.layers]
        else:
            kvs = list(cache.to_legacy_cache())
        with open(out, "wb") as f:
            for k, v in kvs:
                assert tuple(k.shape) == (1, KV_HEADS, len(ids), HEAD_DIM), k.shape
                f.write(k.contiguous().numpy().astype(np.float32).tobytes())
                f.write(v.contiguous().numpy().astype(np.float32).tobytes())
        # Greedy continuation and its smallest top-2 margin (logprob of the first minus the second).
        seq, margin, toks, lps = list(ids), float("inf"), [], []
        for _ in range(steps):
            logits = model(torch.tensor([seq])).logits[0, -1].double()
            lp = torch.log_softmax(logits, -1)
            top = torch.topk(lp, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            toks.append(int(top.indices[0]))
            lps.append(float(top.values[0]))
            seq.append(toks[-1])
    print(json.dumps({"tokens": toks, "logprobs": lps, "min_margin": margin}))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    cmd = sys.argv[1]
    if cmd == "make-model":
        make_model(sys.argv[2])
    elif cmd == "reference":
        reference(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4:]])
    else:
        sys.exit(__doc__)
