#!/usr/bin/env python3
"""Generate gonixl's vLLM NixlConnector test vectors under testdata/vllm/.

Run with the repo's venv (`make vectors`). For every supported vLLM release it loads vLLM's own definitions of
NixlAgentMetadata / NixlHandshakePayload / compute_nixl_compatibility_hash from the release's wheel (see
vllm_defs.py; the wheel is found via $VLLM_WHEEL_DIR or ~/.cache/gonixl/vllm-wheels, else downloaded with pip,
no deps) and encodes fixed values with the real msgspec.

What comes from where:
  metadata, payload, metadata_decode, hash: vLLM's classes/functions from the wheel + real msgspec.
  requests, clock:   msgspec.msgpack.encode of the tuples/floats vLLM's handshake code builds
                     ((GET_META_MSG, tp) in H2, (GET_META_MSG, pp, tp) + perf_counter frame in H4).
  params:            the key order of the pull-mode request_finished dict, read from the wheel with ast
                     (vllm_defs.wire_facts), values of the types it assigns, dumped with json.
  notifications:     reproduced from the release's f-string / "HB:" construction (read in the wheel).
  wire:              the row's facts for the Python peers (framing, block-id shape, leases, layout era), with
                     framing/leases/layout checked against the wheel's source.

`python/gen_vectors.py 0.32.0 0.31.0` regenerates only those releases.
  pyjson.json:       Python's json.dumps(sort_keys=True) on tricky values (floats, escapes, nesting).
"""

from __future__ import annotations

import dataclasses as dc
import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_defs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "testdata" / "vllm"

# vLLM release -> gonixl profile (connector/protocol.Profiles) and the facts of that row that the Python peers
# need. framing, layout and leases are cross-checked against the wheel's own source (vllm_defs.wire_facts);
# remote_block_ids' shape and the notification count's meaning were read in the release's request_finished and
# notification code ("tp_size": D's world size, "consumers": the number of expected consumers).
# Several releases share a row where their connector sources are identical; one vector file per row's first
# release, plus 0.17.0 (the 0.16 row spans 0.16-0.17).
def _row(profile, framing, flat, notif, leases, layout):
    return dict(profile=profile, framing=framing, block_ids_flat=flat, notif=notif, leases=leases, layout=layout)


RELEASES = {
    "0.16.0": _row("0.16", "H2", True, "tp_size", False, "A"),
    "0.17.0": _row("0.16", "H2", True, "tp_size", False, "A"),
    "0.18.0": _row("0.18", "H2", False, "tp_size", False, "A"),
    "0.20.0": _row("0.20", "H2", False, "tp_size", False, "A"),
    "0.21.0": _row("0.21", "H2", False, "tp_size", False, "A"),
    "0.22.0": _row("0.22", "H2", False, "tp_size", True, "A"),
    "0.23.0": _row("0.23", "H2", False, "tp_size", True, "B"),
    "0.26.0": _row("0.26", "H4", False, "tp_size", True, "C"),
    "0.28.0": _row("0.28", "H4", False, "tp_size", True, "C"),
    "0.29.0": _row("0.29", "H4", False, "consumers", True, "C"),
    "0.30.0": _row("0.30", "H4", False, "consumers", True, "C"),
    "0.31.0": _row("0.31", "H4", False, "consumers", True, "C"),
    "0.32.0": _row("0.32", "H4", False, "consumers", True, "C"),
    "0.33.0": _row("0.33", "H4", False, "consumers", True, "C"),
}

def blob(n: int, seed: int) -> bytes:
    """Deterministic pseudo-random bytes standing in for a NIXL agent blob."""
    out = bytearray()
    h = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    while len(out) < n:
        out += h
        h = hashlib.sha256(h).digest()
    return bytes(out[:n])


def jsonable(v):
    if isinstance(v, bytes):  # long blobs by digest, to keep the vector files small
        return v.hex() if len(v) <= 4096 else "sha256:" + hashlib.sha256(v).hexdigest()
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


_FACTS: dict = {}


def _facts(defs: vllm_defs.Defs) -> dict:
    if defs.version not in _FACTS:
        _FACTS[defs.version] = vllm_defs.wire_facts(defs)
    return _FACTS[defs.version]


def meta_values(defs: vllm_defs.Defs, case: str) -> dict:
    """Field values for one metadata case, restricted to this release's fields (defaults left to vLLM). The
    kv_cache_layout names are the release's own (wire_facts: "HND"/"NHD" up to 0.28, "LBHNC"/"LBNHC" from 0.29)."""
    facts = _facts(defs)
    hnd = facts["required_layout"]
    nhd = [n for n in facts["layout_names"] if n != hnd][0]
    n = 56  # 28 layers x (K, V): >15 elements, so the array header is array16
    base = 0x7F3A00000000
    common = {
        "typical": dict(
            engine_id="7c1e6a0e-2d5b-4b7e-9a57-1f6e7a1c0b11",
            agent_metadata=blob(200, 1),
            kv_caches_base_addr=[base + i * 0x10000000 for i in range(n)],
            device_id=0, num_blocks=8192, block_lens=[32768] * n, block_strides=[32768] * n,
            kv_cache_layout=hnd, block_size=16, ssm_sizes=(0, 0), attn_backend_name="FLASH_ATTN",
            physical_blocks_per_logical_kv_block=1,
        ),
        "int_widths": dict(
            engine_id="e0", agent_metadata=blob(300, 2),  # bin16
            kv_caches_base_addr=[0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
                                 2**64 - 1],
            device_id=-1, num_blocks=2**32, block_lens=[0, 1, 127, 128, 255, 256, 65535, 65536, 2**31],
            block_strides=[-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)],
            kv_cache_layout=nhd, block_size=-33, ssm_sizes=(-129, 2**40), attn_backend_name="FLASHINFER",
            physical_blocks_per_logical_kv_block=2,
        ),
        "long_strings": dict(
            engine_id="engine-\u00e9-\u5f15\u64ce-\U0001f600-" + "x" * 20,  # str8, non-ASCII
            agent_metadata=blob(65536, 3),  # bin32 (> 65535)
            kv_caches_base_addr=[base], device_id=3, num_blocks=1, block_lens=[1 << 20], block_strides=[1 << 20],
            kv_cache_layout="L" * 300,  # str16
            block_size=128, ssm_sizes=(4096, 1 << 20), attn_backend_name="A" * 31,  # fixstr max
            physical_blocks_per_logical_kv_block=8,
        ),
        "empty": dict(
            engine_id="", agent_metadata=b"", kv_caches_base_addr=[], device_id=0, num_blocks=0, block_lens=[],
            block_strides=[], kv_cache_layout="", block_size=0, ssm_sizes=(0, 0), attn_backend_name="",
            physical_blocks_per_logical_kv_block=0,
        ),
        "optionals_set": dict(
            engine_id="p-engine", agent_metadata=blob(64, 4), kv_caches_base_addr=[base, base + 4096],
            device_id=1, num_blocks=100, block_lens=[4096, 4096], block_strides=[8192, 8192],
            kv_cache_layout=hnd, block_size=16, ssm_sizes=(0, 0), attn_backend_name="FLASH_ATTN",
            physical_blocks_per_logical_kv_block=1, region_num_blocks=[100, 50], region_group_ids=[0, 1],
            region_names=["model.layers.0.self_attn", "model.layers.1.mamba"], region_mem_types=["DRAM", "VRAM"],
            dcp_size=2, pcp_size=1, ple_block_len=512,
            region_members=[["model.layers.0.self_attn", "model.layers.2.self_attn"], []],
            packed_member_layouts={"model.layers.0.self_attn": (0, 2048), "model.layers.2.self_attn": (2048, 2048)},
        ),
        "optionals_empty": dict(
            engine_id="p", agent_metadata=b"\x00", kv_caches_base_addr=[1], device_id=0, num_blocks=1,
            block_lens=[1], block_strides=[1], kv_cache_layout=hnd, block_size=16, ssm_sizes=(0, 0),
            attn_backend_name="FLASH_ATTN", physical_blocks_per_logical_kv_block=1, region_num_blocks=[],
            region_group_ids=[], region_names=[], region_mem_types=[], ple_block_len=0,
        ),
    }[case]
    names = {f.name for f in defs.fields()}
    if case.startswith("optionals") and "region_names" not in names:
        return {}
    return {k: v for k, v in common.items() if k in names}


CASES = ["typical", "int_widths", "long_strings", "empty", "optionals_set", "optionals_empty"]


def metadata_vectors(defs):
    out = []
    for case in CASES:
        vals = meta_values(defs, case)
        if not vals:
            continue
        m = defs.NixlAgentMetadata(**vals)
        enc = msgspec.msgpack.encode(m)
        # Sanity: vLLM's decoder reads it back equal.
        assert msgspec.msgpack.Decoder(defs.NixlAgentMetadata).decode(enc) == m
        fields = {f.name: jsonable(getattr(m, f.name)) for f in defs.fields()}
        out.append({"name": case, "fields": fields, "hex": enc.hex()})
    return out


def decode_vectors(defs):
    """Inputs that are not canonical encodings, and what vLLM's decoder makes of them."""
    dec = msgspec.msgpack.Decoder(defs.NixlAgentMetadata)
    typical = meta_values(defs, "typical")
    required = [f.name for f in defs.fields() if f.default is dc.MISSING and f.default_factory is dc.MISSING]
    cases = []

    def add(name, raw: bytes):
        try:
            m = dec.decode(raw)
            # The decoded values (defaults filled in). Not a re-encoding: msgspec leaves absent
            # simple-default fields out of the instance __dict__, so re-encoding a decoded object omits them.
            fields = {f.name: jsonable(getattr(m, f.name)) for f in defs.fields()}
            cases.append({"name": name, "hex": raw.hex(), "error": None, "fields": fields})
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            cases.append({"name": name, "hex": raw.hex(), "error": str(e), "fields": None})

    rev = dict(reversed(list(typical.items())))
    rev["future_field"] = {"nested": [1, {"a": None, "b": [b"\x01", 2.5, True]}]}
    add("reordered_unknown_keys", msgspec.msgpack.encode(rev))
    add("only_required", msgspec.msgpack.encode({k: typical[k] for k in required}))
    for missing in (required[0], required[-1]):
        add(f"missing_{missing}", msgspec.msgpack.encode({k: v for k, v in typical.items() if k != missing}))
    add("bytes_as_str", msgspec.msgpack.encode({**typical, "agent_metadata": "deadbeef"}))
    add("int_as_float", msgspec.msgpack.encode({**typical, "num_blocks": 8192.0}))
    add("int_as_bool", msgspec.msgpack.encode({**typical, "device_id": True}))
    add("str_as_bin", msgspec.msgpack.encode({**typical, "engine_id": b"e0"}))
    add("list_as_map", msgspec.msgpack.encode({**typical, "block_lens": {"a": 1}}))
    add("not_a_map", msgspec.msgpack.encode([1, 2, 3]))
    add("trailing_bytes", msgspec.msgpack.encode(typical) + b"\xc0")
    add("truncated", msgspec.msgpack.encode(typical)[:-3])
    add("non_str_key", bytes([0x81, 0x01, 0x02]))
    # A repeated key: msgspec keeps the last value.
    items = list(typical.items()) + [("engine_id", "second")]
    raw = bytearray()
    count = len(items)
    raw += bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big")
    for k, v in items:
        raw += msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v)
    add("duplicate_key_last_wins", bytes(raw))
    if "ssm_sizes" in typical:
        add("tuple_wrong_length", msgspec.msgpack.encode({**typical, "ssm_sizes": [0, 0, 0]}))
        add("optional_null", msgspec.msgpack.encode({**typical, "region_names": None, "ple_block_len": None}))
        add("default_not_nullable", msgspec.msgpack.encode({**typical, "dcp_size": None}))
    return cases


def stub_config(model="Qwen/Qwen3-0.6B", dtype="torch.bfloat16", kv_heads=8, head=128, layers=28, cache="auto",
                hma=True, spec=None):
    class Dtype:  # str(torch.bfloat16) == "torch.bfloat16"
        def __str__(self):
            return dtype

    mc = SimpleNamespace(model=model, dtype=Dtype(), get_total_num_kv_heads=lambda: kv_heads,
                         get_head_size=lambda: head, get_total_num_hidden_layers=lambda: layers)
    return SimpleNamespace(model_config=mc, cache_config=SimpleNamespace(cache_dtype=cache),
                           scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=not hma),
                           speculative_config=spec)


def eagle_spec(aux=(2, 16, 29), kv_cache_dtype=None):
    draft = SimpleNamespace(model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", revision=None, code_revision="main",
                            hf_config=SimpleNamespace(eagle_aux_hidden_state_layer_ids=list(aux)))
    return SimpleNamespace(use_eagle=lambda: True, draft_model_config=draft, method="eagle3",
                           parallel_drafting=False, kv_cache_dtype=kv_cache_dtype)


def hash_vectors(defs):
    out = []
    cases = [
        ("typical", {}, dict(attn="FLASH_ATTN")),
        ("dev_version_unicode_model", dict(model="/models/\u6a21\u578b-\u00e9 \"q\"\\n", cache="fp8_e4m3"),
         dict(attn="FLASHINFER", version=defs.version + "rc2.dev265+gdd6b3a5ef")),
        ("cross_layers_no_hma", dict(hma=False, dtype="torch.float16", kv_heads=2, head=64, layers=2),
         dict(attn="TRITON_ATTN", cross=True)),
        ("speculative_eagle", dict(spec=eagle_spec()), dict(attn="FLASH_ATTN")),
        ("push_mode", {}, dict(attn="FLASH_ATTN", mode="push")),
        # The release's defaults for an ordinary model (Qwen3-0.6B geometry): HMA as VllmConfig resolves it with
        # NixlConnector configured (wire_facts' hma_default), the platform's attention backend, cache dtype
        # "auto", no speculative decoding, pull mode.
        ("defaults_cuda", dict(hma=_facts(defs)["hma_default"]), dict(attn="FLASH_ATTN")),
        ("defaults_cpu", dict(hma=_facts(defs)["hma_default"]), dict(attn="CPU_ATTN")),
    ]
    for name, cfg_kw, kw in cases:
        cfg = stub_config(**cfg_kw)
        version = kw.get("version", defs.version)
        args = dict(cross_layers_blocks=kw.get("cross", False), transfer_mode=kw.get("mode", "pull"))
        text = defs.factor_json(cfg, kw["attn"], version, **args)
        factors = json.loads(text)
        inputs = {
            "vllm_version": version, "model": cfg.model_config.model, "dtype": str(cfg.model_config.dtype),
            "num_kv_heads": cfg.model_config.get_total_num_kv_heads(), "head_size": cfg.model_config.get_head_size(),
            "num_hidden_layers": cfg.model_config.get_total_num_hidden_layers(), "attn_backend_name": kw["attn"],
            "cache_dtype": cfg.cache_config.cache_dtype, "cross_layers_blocks": args["cross_layers_blocks"],
            "is_hma_enabled": not cfg.scheduler_config.disable_hybrid_kv_cache_manager,
            "speculative_config": factors.get("speculative_config"), "transfer_mode": args["transfer_mode"],
        }
        out.append({"name": name, "inputs": inputs, "factor_keys": sorted(factors), "json": text,
                    "sha256": hashlib.sha256(text.encode()).hexdigest()})
    return out


def request_vectors(defs, row):
    out = []
    if row["framing"] == "H2":  # (GET_META_MSG, tp_rank)
        for tp in (0, 3, 127, 200, 70000):
            out.append({"pp": 0, "tp": tp, "hex": msgspec.msgpack.encode((defs.get_meta_msg, tp)).hex()})
    else:  # (GET_META_MSG, pp_rank, tp_rank)
        for pp, tp in ((0, 0), (1, 2), (0, 300), (3, 70000)):
            out.append({"pp": pp, "tp": tp, "hex": msgspec.msgpack.encode((defs.get_meta_msg, pp, tp)).hex()})
    return out


def clock_vectors():
    return [{"value": v.hex(), "hex": msgspec.msgpack.encode(v).hex()}
            for v in (12345.5, 0.0, 1e-9, 987654.321, 3.0e7)]


def params_vectors(row, keys):
    """kv_transfer_params as the release's pull-mode request_finished builds them: its dict keys in its order
    (read from the wheel), values of the types that code assigns, then json.dumps."""
    common = dict(do_remote_prefill=True, do_remote_decode=False)

    def make(blocks, **vals):
        vals = {**common, **vals, "remote_block_ids": blocks[0] if row["block_ids_flat"] else tuple(blocks)}
        return {k: vals[k] for k in keys}

    base = dict(remote_engine_id="7c1e6a0e-2d5b", remote_request_id="cmpl-8f0c-0-1a2b3c4d", remote_host="10.0.0.5",
                remote_port=5600, tp_size=1, dcp_size=1, pp_size=1, remote_num_tokens=40,
                remote_blocks_expiry_time=None, remote_registration_generation=1, transfer_mode="pull",
                remote_prefill_cached_tokens=0)
    cases = {
        "prefill_response": make([[1, 2, 3]], **base),
        "tp2_many_blocks": make([list(range(100, 140))], **{**base, "remote_engine_id": "e\u00e9",
                                "remote_request_id": "chatcmpl-x:y-0-deadbeef", "remote_host": "localhost",
                                "remote_port": 5601, "tp_size": 2, "remote_num_tokens": 632}),
    }
    if not row["block_ids_flat"]:
        cases["hybrid_two_groups"] = make([[5, 6, 7, 8], [9]], **{
            **base, "remote_engine_id": "e1", "remote_request_id": "r-1", "remote_host": "::1", "remote_port": 5602,
            "tp_size": 4, "dcp_size": 2, "pp_size": 2, "remote_num_tokens": 50, "remote_blocks_expiry_time": 1234.5,
            "remote_registration_generation": 3, "remote_prefill_cached_tokens": 32})
    out = [{"name": k, "json": json.dumps(v)} for k, v in cases.items()]
    out.append({"name": "proxy_to_prefill", "json": json.dumps(dict(
        do_remote_decode=True, do_remote_prefill=False, remote_engine_id=None, remote_block_ids=None,
        remote_host=None, remote_port=None))})
    return out


def notif_vectors(row):
    out = []
    # D: notif_id = f"{remote_request_id}:{n}".encode(); n = D's TP size or the expected consumers.
    for rid, n in (("cmpl-8f0c-0-1a2b3c4d", 1), ("chatcmpl-a:b:c-7", 4), ("\u8bf7\u6c42-\u00e9", 2)):
        s = f"{rid}:{n}"
        out.append({"text": s, "hex": s.encode().hex(), "request_id": rid, "count": n, "heartbeat": None})
    if row["leases"]:
        ids = ["reqA", "reqB-1a2b3c4d"]
        s = "HB:" + ",".join(ids)  # D's heartbeat: ("HB:" + ",".join(req_ids)).encode()
        out.append({"text": s, "hex": s.encode().hex(), "request_id": "", "count": 0, "heartbeat": ids})
    return out


def typed(v):
    """A JSON description of a Python value that keeps int/float/str apart (floats as float.hex())."""
    if v is None:
        return {"null": True}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": str(v)}
    if isinstance(v, float):
        return {"float": v.hex()}
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, (list, tuple)):
        return {"list": [typed(x) for x in v]}
    if isinstance(v, dict):
        return {"dict": [[k, typed(x)] for k, x in v.items()]}
    raise TypeError(type(v))


def pyjson_vectors():
    floats = [0.0, -0.0, 1.0, 0.1, 1 / 3, 1e16, 1e15, 123456789012345678.0, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308,
              -2.5e-7, 100.0, 1e22, float("inf"), float("-inf"), float("nan"), 2.0**53, 9.999999999999999e15]
    values = [
        {"floats": floats},
        {"s": "plain ascii ~!@#$%^&*()_+{}|:<>?`-=[]\\;',./", "ctl": "\x00\x01\x08\x09\x0a\x0c\x0d\x1f\x7f\x80",
         "bmp": "\u00e9\u2028\u2029\ufeff\uffff", "astral": "\U0001f600\U00010000\U0010ffff", "q": "\"'"},
        {"z": 1, "a": {"y": [], "b": {}, "\u00e9": 2, "B": 3, "_": 4, "\U0001f600": 5, "\uffff": 6},
         "ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1], "bools": [True, False, None]},
        [1, "two", [3.5, [None]], {}],
    ]
    return [{"typed": typed(v), "json": json.dumps(v, sort_keys=True)} for v in values]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[1:])
    for release, row in RELEASES.items():
        if only and release not in only:
            continue
        profile = row["profile"]
        defs = vllm_defs.Defs(release)
        facts = _facts(defs)
        for k in ("framing", "leases", "layout"):
            if facts[k] is not None and facts[k] != row[k]:
                raise SystemExit(f"vllm {release}: the wheel says {k}={facts[k]!r}, RELEASES says {row[k]!r}")
        doc = {
            "comment": "Generated by python/gen_vectors.py (make vectors); do not edit.",
            "vllm_version": defs.version,
            "profile": profile,
            "source": {"wheel": defs.wheel.name, "metadata_module": defs.module_path,
                       "msgspec": msgspec.__version__},
            "connector_version": defs.connector_version,
            "get_meta_msg": defs.get_meta_msg.decode(),
            "metadata_fields": [f.name for f in defs.fields()],
            "metadata": metadata_vectors(defs),
            "metadata_decode": decode_vectors(defs),
            "wire": {"framing": row["framing"], "block_ids_flat": row["block_ids_flat"], "notif": row["notif"],
                     "leases": row["leases"], "layout": row["layout"], "layout_from_wheel": facts["layout"] is not None,
                     "params_keys": facts["params_keys"], "layout_names": facts["layout_names"],
                     "required_layout": facts["required_layout"], "layout_expr": facts["layout_expr"],
                     "hma_default": facts["hma_default"]},
            "requests": request_vectors(defs, row),
            "clock": clock_vectors(),
            "hash": hash_vectors(defs),
            "params": params_vectors(row, facts["params_keys"]),
            "notifications": notif_vectors(row),
        }
        meta = {v["name"]: bytes.fromhex(v["hex"]) for v in doc["metadata"]}
        doc["payload"] = []
        for name, h in (("zero_hash", "0" * 64), ("real_hash", doc["hash"][0]["sha256"])):
            p = defs.NixlHandshakePayload(compatibility_hash=h, agent_metadata_bytes=meta["typical"])
            doc["payload"].append({"name": name, "hash": h, "metadata": "typical",
                                   "hex": msgspec.msgpack.encode(p).hex()})
        big = defs.NixlHandshakePayload(compatibility_hash=doc["hash"][0]["sha256"],
                                        agent_metadata_bytes=meta["long_strings"])
        doc["payload"].append({"name": "bin32_metadata", "hash": big.compatibility_hash,
                               "metadata": "long_strings", "hex": msgspec.msgpack.encode(big).hex()})
        d = OUT / release
        d.mkdir(parents=True, exist_ok=True)
        (d / "vectors.json").write_text(json.dumps(doc, indent=1, ensure_ascii=True) + "\n")
        print(f"wrote {d / 'vectors.json'} ({len(doc['metadata'])} metadata, {len(doc['hash'])} hash vectors)")
    (OUT / "pyjson.json").write_text(json.dumps(
        {"comment": "Python json.dumps(v, sort_keys=True); generated by python/gen_vectors.py",
         "cases": pyjson_vectors()}, indent=1) + "\n")
    print(f"wrote {OUT / 'pyjson.json'}")


if __name__ == "__main__":
    main()
