"""vLLM NixlConnector's side-channel framing, per gonixl profile, as gonixl's Python peers speak it
(sidechannel_peer.py, vllm_prefill_peer.py, vllm_decode_peer.py): the decode side's request, the prefill side's
reply with its frames. The per-profile behaviour comes from the committed vectors (vllm_defs.profiles()), not from
code. msgspec and pyzmq only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_defs as _vd  # noqa: E402  (stdlib only; the wheel is opened lazily)

GET_META_MSG = b"get_meta_msg"

# Per profile, from the committed vectors (testdata/vllm/*/vectors.json; gen_vectors.py read them in the wheels).
PROFILES = _vd.profiles()
FRAMING = {k: v["framing"] for k, v in PROFILES.items()}
RELEASE = {k: v["release"] for k, v in PROFILES.items()}


def request(profile: str, pp: int, tp: int) -> bytes:
    """The decode side's request for rank (pp, tp): msgpack (GET_META_MSG, tp) [H2] or (GET_META_MSG, pp, tp)."""
    if FRAMING[profile] == "H2":
        return msgspec.msgpack.encode((GET_META_MSG, tp))
    return msgspec.msgpack.encode((GET_META_MSG, pp, tp))


def parse_request(profile: str, msg: bytes) -> tuple[bytes, int, int]:
    """(tag, pp, tp) of a request (pp is 0 in H2, which does not send it)."""
    if FRAMING[profile] == "H2":
        tag, tp = msgspec.msgpack.decode(msg)
        return tag, 0, tp
    tag, pp, tp = msgspec.msgpack.decode(msg)
    return tag, pp, tp


def reply(profile: str, identity: bytes, payload: bytes) -> list[bytes]:
    """The ROUTER's reply frames: (identity, "", payload), and in H4 the sender's clock, msgpack(perf_counter())."""
    parts = [identity, b"", payload]
    if FRAMING[profile] == "H4":
        parts.append(msgspec.msgpack.encode(time.perf_counter()))
    return parts


def recv_reply(sock, profile: str) -> tuple[bytes, int, float | None]:
    """(payload, frames, clock) of the reply on a REQ socket: in H4 exactly two frames, the second a msgpack float
    (vLLM asserts this); before, one frame (counted as two when more follow) and no clock."""
    if FRAMING[profile] == "H4":
        parts = sock.recv_multipart()
        assert len(parts) == 2, f"expected 2 frames, got {len(parts)}"
        return parts[0], 2, msgspec.msgpack.decode(parts[1])
    payload = sock.recv()
    return payload, 1 + (1 if sock.getsockopt(zmq.RCVMORE) else 0), None
