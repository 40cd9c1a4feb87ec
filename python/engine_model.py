"""The engine tier's models (connector/vllm_engine_test.go): small Qwen3 and Llama models with random weights and
a word-level tokenizer, written locally (no hub), and their reference KV computed by transformers.

  make-model DIR SPEC      write config.json, model.safetensors and the tokenizer (words "w0".."w4095") of SPEC,
                           a JSON object: arch ("qwen3" or "llama"), layers, heads (query heads), kv_heads,
                           head_dim, dtype ("float32" or "bfloat16")
  reference DIR OUTDIR     read a JSON list of prompts (lists of token ids) from stdin; for prompt i run
                           transformers' forward pass and write OUTDIR/kv-<i>.bin: every layer's K then V as
                           transformers' past_key_values hold them — (1, kv_heads, seq, head_dim) in the model's
                           dtype, post-RoPE: NxDI's BHSD layout — layer after layer; print one JSON line per
                           prompt
  cpu-attn CASES           CASES: a JSON list of [dtype, block_size, head_dim]; print one JSON list: per case
                           the kernel ISA vLLM's CPU_ATTN backend picks on this CPU (its own _get_attn_isa),
                           whether the CPU has AMX tiles (torch's check, the one vLLM asks), and "kernel": null
                           when the release's op library packs a cache with that ISA, else its error

Weights are random but scaled (std 0.15 instead of 0.02, lm_head 1.0) so that the next-token distribution is
peaked: greedy decoding is decided by the model, not by float noise (the test requires a margin between the
top two logprobs of every token the engine generates alone). One process computes every prompt's reference (importing torch costs seconds on the 2-core
machine). Runs in an engine venv (torch, transformers, tokenizers, safetensors).
"""
from __future__ import annotations

import json
import os
import sys

HIDDEN, FFN = 256, 512
SEED = 20
ARCHS = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "llama": ("LlamaForCausalLM", "llama")}


def config(spec: dict) -> dict:
    from dynamo_worker import VOCAB  # the demo's word-level vocabulary: 3 special tokens + VOCAB words
    arch, model_type = ARCHS[spec["arch"]]
    return {
        "architectures": [arch], "model_type": model_type, "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"], "num_key_value_heads": spec["kv_heads"], "head_dim": spec["head_dim"],
        "hidden_size": HIDDEN, "intermediate_size": FFN, "vocab_size": VOCAB + 3, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": spec["dtype"], "dtype": spec["dtype"],
    }


def make_model(folder: str, spec: dict) -> None:
    import torch
    from safetensors.torch import save_file
    from dynamo_worker import make_model as write_tokenizer

    write_tokenizer(folder, 2048)  # tokenizer.json, tokenizer_config.json (and a config.json replaced below)
    cfg = config(spec)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    dtype = getattr(torch, spec["dtype"])
    g = torch.Generator().manual_seed(SEED)
    w = {}

    def rnd(name, *shape, std=0.15):
        w[name] = (torch.randn(*shape, generator=g) * std).to(dtype).contiguous()

    def ones(name, n):
        w[name] = torch.ones(n, dtype=dtype)

    q, kv = spec["heads"] * spec["head_dim"], spec["kv_heads"] * spec["head_dim"]
    rnd("model.embed_tokens.weight", cfg["vocab_size"], HIDDEN, std=1.0)
    for l in range(spec["layers"]):
        p = f"model.layers.{l}."
        rnd(p + "self_attn.q_proj.weight", q, HIDDEN)
        rnd(p + "self_attn.k_proj.weight", kv, HIDDEN)
        rnd(p + "self_attn.v_proj.weight", kv, HIDDEN)
        rnd(p + "self_attn.o_proj.weight", HIDDEN, q)
        rnd(p + "mlp.gate_proj.weight", FFN, HIDDEN)
        rnd(p + "mlp.up_proj.weight", FFN, HIDDEN)
        rnd(p + "mlp.down_proj.weight", HIDDEN, FFN)
        for n in ("input_layernorm", "post_attention_layernorm"):
            ones(p + n + ".weight", HIDDEN)
        if spec["arch"] == "qwen3":
            for n in ("q_norm", "k_norm"):
                ones(p + "self_attn." + n + ".weight", spec["head_dim"])
    ones("model.norm.weight", HIDDEN)
    rnd("lm_head.weight", cfg["vocab_size"], HIDDEN, std=1.0)
    save_file(w, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def reference(folder: str, outdir: str, prompts: list[list[int]]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    if not torch.cuda.is_available():
        # The engine venvs run PyPI's CUDA build of torch on the CUDA stand-ins of torch_cuda_stubs.py; newer
        # transformers (5.2x) ask torch.cuda.is_current_stream_capturing() on every forward, which reaches
        # into those stand-ins and crashes. Without a CUDA device nothing can be capturing.
        torch.cuda.is_current_stream_capturing = lambda: False
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(folder, "config.json")))
    dtype = getattr(torch, cfg["torch_dtype"])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    model.eval()
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            res = model(torch.tensor([ids]), use_cache=True)
            cache = res.past_key_values
            if hasattr(cache, "layers"):
                kvs = [(layer.keys, layer.values) for layer in cache.layers]
            else:
                kvs = list(cache.to_legacy_cache())
            with open(os.path.join(outdir, f"kv-{i}.bin"), "wb") as f:
                for k, v in kvs:
                    want = (1, cfg["num_key_value_heads"], len(ids), cfg["head_dim"])
                    assert tuple(k.shape) == want and k.dtype == dtype, (k.shape, k.dtype)
                    # raw bytes in the model's dtype (a bf16 tensor viewed as int16: numpy has no bf16)
                    f.write(k.contiguous().view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy().tobytes())
                    f.write(v.contiguous().view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy().tobytes())
        print(json.dumps({"tokens": len(ids)}), flush=True)


def cpu_attn(cases: list) -> None:
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends import cpu_attn as ca

    if hasattr(current_platform, "import_kernels"):
        current_platform.import_kernels()  # the op library vLLM itself loads on this CPU
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None) or torch._C._cpu._is_amx_tile_supported
    op = torch.ops._C.cpu_attn_reshape_and_cache
    extra = (1.0, 1.0, "auto") if len(op.default._schema.arguments) > 6 else ()
    out = []
    for dtype, bs, hd in cases:
        dt = getattr(torch, dtype)
        isa = ca._get_attn_isa(dt, bs, hd)
        key = torch.zeros(2, 1, hd, dtype=dt)
        kc, vc = torch.zeros(2, 2, 1, bs, hd, dtype=dt).unbind(0)
        try:
            op(key, key.clone(), kc, vc, torch.arange(2), isa, *extra)
            err = None
        except Exception as e:
            err = str(e).splitlines()[0]
        out.append({"isa": isa, "amx": bool(amx()), "kernel": err})
    print(json.dumps(out))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "make-model" and len(sys.argv) == 4:
        make_model(sys.argv[2], json.loads(sys.argv[3]))
    elif cmd == "reference" and len(sys.argv) == 4:
        reference(sys.argv[2], sys.argv[3], json.load(sys.stdin))
    elif cmd == "cpu-attn" and len(sys.argv) == 3:
        cpu_attn(json.loads(sys.argv[2]))
    else:
        sys.exit(__doc__)
