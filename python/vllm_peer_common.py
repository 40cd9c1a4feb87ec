"""What gonixl's Python NIXL peers (vllm_prefill_peer.py, vllm_decode_peer.py) share: the NIXL wheel's Python API,
vLLM's side-channel framing per profile, vLLM's own handshake classes and compatibility hash (from the release's
wheel via vllm_defs, when it is available locally), and the test KV pattern.

The peers do with NIXL what vLLM's NixlConnector does (spec §9): nixl_agent, get_reg_descs/register_memory,
get_agent_metadata, add_remote_agent, get_xfer_descs/prep_xfer_dlist, make_prepped_xfer, transfer,
check_xfer_state, send_notif, get_new_notifs. They are independent of gonixl's Go code: nothing here is
generated from it.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np

try:
    from nixl._api import nixl_agent, nixl_agent_config  # noqa: F401
except ImportError:  # the cu12/cu13 wheels install the module under this name
    from nixl_cu12._api import nixl_agent, nixl_agent_config  # noqa: F401

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The side channel's framing per profile (sidechannel_framing.py, shared with sidechannel_peer.py).
from sidechannel_framing import (FRAMING, GET_META_MSG, PROFILES as _PROFILES, RELEASE,  # noqa: E402,F401
                                 parse_request, recv_reply, reply, request)
# remote_block_ids flat ([1, 2]) or one list per KV-cache group ([[1, 2]]).
PARAMS_FLAT = {k: v["block_ids_flat"] for k, v in _PROFILES.items()}
# vLLM's kv_transfer_params keys of P's response, in request_finished's order.
PARAMS_KEYS = {k: v["params_keys"] for k, v in _PROFILES.items()}
LAYOUT = {k: v["layout"] for k, v in _PROFILES.items()}
LEASES = {k: v["leases"] for k, v in _PROFILES.items()}
# The kv_cache_layout name vLLM publishes for its default (heads-major) cache: NixlConnector's
# get_required_kvcache_layout, "HND" up to 0.28 and "LBHNC" from 0.29 (read in the wheels by gen_vectors.py).
LAYOUT_NAME = {k: v.get("required_layout") or "HND" for k, v in _PROFILES.items()}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def vllm_defs(profile: str):
    """vLLM's own definitions of the release, or None when its wheel is not available locally."""
    try:
        sys.path.insert(0, str(HERE))
        import vllm_defs as vd

        return vd.Defs(RELEASE[profile], wheel=vd.find_wheel(RELEASE[profile], download=False))
    except Exception as e:  # no wheel here
        log(f"vLLM {RELEASE[profile]} wheel not available ({e}); using the field list of testdata vectors")
        return None


def add_model_args(ap):
    ap.add_argument("--profile", required=True, choices=sorted(FRAMING))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--elem-size", type=int, default=2)  # bf16
    ap.add_argument("--model", default="gonixl/test-tiny")
    ap.add_argument("--dtype", default="torch.bfloat16")
    ap.add_argument("--attn", default="FLASH_ATTN")
    ap.add_argument("--cache-dtype", default="auto")
    ap.add_argument("--hash", default="", help="compatibility hash to use when the vLLM wheel is not available")
    ap.add_argument("--backends", default="UCX", help="comma-separated NIXL backends")


def geometry(args):
    """(regions, block_len) of vLLM's registration for the profile's FLASH_ATTN layout era:
    era A: K and V regions per layer, block_len = bs*H*D*e; eras B (K/V halves per block) and C (K/V packed):
    one region per layer, block_len = 2*bs*H*D*e."""
    per = args.block_size * args.heads * args.head_dim * args.elem_size
    if LAYOUT[args.profile] == "A":
        return 2 * args.layers, per
    return args.layers, 2 * per


def compat_hash(defs, args) -> tuple[str, str]:
    """vLLM's compute_nixl_compatibility_hash over the model's factors (source "vllm"), or --hash ("arg")."""
    if defs is None:
        return args.hash, "arg"

    class Dtype:
        def __str__(self):
            return args.dtype

    mc = SimpleNamespace(model=args.model, dtype=Dtype(), get_total_num_kv_heads=lambda: args.heads,
                         get_head_size=lambda: args.head_dim, get_total_num_hidden_layers=lambda: args.layers)
    cfg = SimpleNamespace(model_config=mc, cache_config=SimpleNamespace(cache_dtype=args.cache_dtype),
                          scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
                          speculative_config=None)
    return defs.compat_hash(cfg, args.attn, cross_layers_blocks=False, transfer_mode="pull"), "vllm"


def pattern(seed: int, region: int, block: int, length: int) -> np.ndarray:
    """The test KV content of one block (gonixl's Go tests compute the same: patternByte)."""
    i = np.arange(length, dtype=np.int64)
    return ((seed + region * 131 + block * 31 + i * 7) % 256).astype(np.uint8)


def metadata_fields(profile: str) -> list[str]:
    v = json.loads((HERE.parent / "testdata" / "vllm" / RELEASE[profile] / "vectors.json").read_text())
    return v["metadata_fields"]


def encode_handshake(defs, profile: str, hash_: str, values: dict) -> bytes:
    """msgspec-encode NixlHandshakePayload{hash, msgpack(NixlAgentMetadata)} with vLLM's classes when available."""
    if defs is not None:
        names = {f.name for f in defs.fields()}
        md = defs.NixlAgentMetadata(**{k: v for k, v in values.items() if k in names})
        inner = msgspec.msgpack.encode(md)
        return msgspec.msgpack.encode(defs.NixlHandshakePayload(compatibility_hash=hash_, agent_metadata_bytes=inner))
    inner = msgspec.msgpack.encode({k: values[k] for k in metadata_fields(profile)})
    return msgspec.msgpack.encode({"compatibility_hash": hash_, "agent_metadata_bytes": inner})


def decode_handshake(defs, payload: bytes):
    """(compatibility_hash, metadata as a namespace) from a handshake reply."""
    if defs is not None:
        hp = msgspec.msgpack.Decoder(defs.NixlHandshakePayload).decode(payload)
        return hp.compatibility_hash, msgspec.msgpack.Decoder(defs.NixlAgentMetadata).decode(hp.agent_metadata_bytes)
    outer = msgspec.msgpack.decode(payload)
    return outer["compatibility_hash"], SimpleNamespace(**msgspec.msgpack.decode(outer["agent_metadata_bytes"]))


def new_agent(name: str, backends: str):
    return nixl_agent(name, nixl_agent_config(backends=[b.strip().upper() for b in backends.split(",") if b.strip()]))


class Arena:
    """A local KV cache as vLLM registers one on the CPU platform: the profile's regions (geometry) back to back
    in one arena of num_blocks blocks each, registered as DRAM with a new agent."""

    def __init__(self, args, num_blocks: int):
        self.regions, self.block_len = geometry(args)
        self.num_blocks = num_blocks
        self.region_len = num_blocks * self.block_len
        self.arena = np.zeros(self.regions * self.region_len, dtype=np.uint8)
        self.bases = [self.arena.ctypes.data + r * self.region_len for r in range(self.regions)]
        self.agent = new_agent(str(uuid.uuid4()), args.backends)
        self.reg = self.agent.get_reg_descs([(b, self.region_len, 0, "") for b in self.bases], "DRAM")
        self.agent.register_memory(self.reg)

    def block(self, region: int, block: int) -> np.ndarray:
        """A view of one block of one region."""
        off = region * self.region_len + block * self.block_len
        return self.arena[off:off + self.block_len]


def block_descs(bases, num_blocks: int, block_len: int, dev: int = 0):
    """vLLM's descriptor list: for each region, for each block, (base + b*block_len, block_len, dev)."""
    return [(base + b * block_len, block_len, dev) for base in bases for b in range(num_blocks)]


def desc_ids(regions: int, num_blocks: int, blocks) -> list[int]:
    """vLLM's _get_block_descs_ids: region-major, r*num_blocks + b."""
    return [r * num_blocks + b for r in range(regions) for b in blocks]


def exit_now(code: int):
    """Exit without interpreter teardown: the nixl-cu12 1.5.1 wheel's Python API segfaults at interpreter exit
    once an agent was created (even `nixl_agent("x", ...)` alone), which would hide the peer's real exit code."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
