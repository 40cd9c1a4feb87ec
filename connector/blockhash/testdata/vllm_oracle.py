"""The oracle of connector/blockhash: vLLM's own block hasher, from the venv it runs in.

Reads a JSON list of cases on stdin, {"algo", "seed" (PYTHONHASHSEED or null), "block_size", "tokens",
"cache_salt" (or null)}, and writes one JSON object on stdout: the release's defaults and, per case, the
NONE_HASH vLLM's init_none_hash derives, the hashes its request block hasher returns for a request with those
tokens and salt, and whether two init_none_hash calls agreed (false: NONE_HASH is random per process).
"""

import json
import os
import sys
from types import SimpleNamespace

from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as kcu
import vllm
from vllm.config.cache import CacheConfig


def default_algo():
    fields = getattr(CacheConfig, "__dataclass_fields__", {})
    if "prefix_caching_hash_algo" in fields:
        return fields["prefix_caching_hash_algo"].default
    return CacheConfig.model_fields["prefix_caching_hash_algo"].default


def run(case):
    if case["seed"] is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = case["seed"]
    fn = get_hash_fn_by_name(case["algo"])
    kcu.init_none_hash(fn)
    first = kcu.NONE_HASH
    kcu.init_none_hash(fn)
    tokens = case["tokens"]
    request = SimpleNamespace(
        block_hashes=[],
        num_tokens=len(tokens),
        all_token_ids=tokens,
        mm_features=[],
        lora_request=None,
        cache_salt=case["cache_salt"],
        prompt_embeds=None,
    )
    hashes = kcu.get_request_block_hasher(case["block_size"], fn)(request)
    if first != kcu.NONE_HASH:  # random per process: nothing to record
        return {"none_hash": "", "hashes": [], "deterministic": False}
    return {
        "none_hash": kcu.NONE_HASH.hex(),
        "hashes": [h.hex() for h in hashes],
        "deterministic": first == kcu.NONE_HASH,
    }


def main():
    cases = json.load(sys.stdin)
    out = {
        "vllm_version": vllm.__version__,
        "default_algo": default_algo(),
        "default_seed": getattr(kcu, "DEFAULT_NONE_HASH_SEED", ""),
        "results": [run(c) for c in cases],
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
