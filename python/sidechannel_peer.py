#!/usr/bin/env python3
"""A Python side-channel peer that speaks vLLM NixlConnector's framing (pyzmq + msgspec), for gonixl's
cross-language tests.

  client: like vLLM's decode-side _nixl_handshake: one REQ socket, per rank send
          msgspec.msgpack.encode((GET_META_MSG, tp)) [0.16] or ((GET_META_MSG, pp, tp)) [0.33], RCVTIMEO 5000,
          then recv() [0.16] or recv_multipart() with exactly 2 frames, the second a msgpack float [0.33].
          Prints one JSON line per rank describing what it got.
  vllm-server: vLLM's own _nixl_handshake_listener, loaded from the release's wheel (python/vllm_defs.py).
  server: like vLLM's _nixl_handshake_listener: ROUTER, RCVTIMEO 1000, recv_multipart() -> (identity, "", msg),
          msgspec.msgpack.decode(msg) unpacked as (tag, tp) or (tag, pp, tp), reply (identity, "", payload[, ts])
          with ts = msgspec.msgpack.encode(time.perf_counter()). Prints its endpoint, serves until stdin closes.

The payloads are decoded with vLLM's own NixlHandshakePayload / NixlAgentMetadata when the release's wheel is
available locally (python/vllm_defs.py, $VLLM_WHEEL_DIR; never downloaded here), else untyped.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zmq_util  # noqa: E402
from sidechannel_framing import FRAMING, GET_META_MSG, RELEASE, parse_request, recv_reply, reply, request  # noqa: E402


def vllm_classes(profile: str):
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import vllm_defs

        d = vllm_defs.Defs(RELEASE[profile], wheel=vllm_defs.find_wheel(RELEASE[profile], download=False))
        return d.NixlHandshakePayload, d.NixlAgentMetadata
    except Exception:  # no wheel here: decode untyped only
        return None, None


def run_client(args) -> int:
    payload_cls, meta_cls = vllm_classes(args.profile)
    ranks = [tuple(int(x) for x in r.split(":")) for r in args.ranks.split(",")]
    with zmq_util.socket(zmq.REQ) as sock:
        sock.connect(args.endpoint)
        for pp, tp in ranks:
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.send(request(args.profile, pp, tp))
            out = {"pp": pp, "tp": tp}
            payload, out["frames"], clock = recv_reply(sock, args.profile)
            if clock is not None:
                out["clock"] = clock
            out["payload_hex"] = payload.hex()
            outer = msgspec.msgpack.decode(payload)
            inner = msgspec.msgpack.decode(outer["agent_metadata_bytes"])
            out["hash"] = outer["compatibility_hash"]
            out["metadata_keys"] = list(inner)
            out["engine_id"] = inner["engine_id"]
            out["typed"] = payload_cls is not None
            if payload_cls is not None:
                hp = msgspec.msgpack.Decoder(payload_cls).decode(payload)
                m = msgspec.msgpack.Decoder(meta_cls).decode(hp.agent_metadata_bytes)
                out["typed_engine_id"] = m.engine_id
                out["typed_num_blocks"] = m.num_blocks
            print(json.dumps(out), flush=True)
    return 0


def run_server(args) -> int:
    payloads = {tuple(int(x) for x in k.split(":")): bytes.fromhex(v)
                for k, v in json.loads(Path(args.payloads).read_text()).items()}
    stop = zmq_util.stdin_closed()
    served = 0
    with zmq_util.socket(zmq.ROUTER) as sock:
        endpoint = zmq_util.bind_loopback(sock)
        sock.setsockopt(zmq.RCVTIMEO, 1000 if not args.fast_poll else 100)
        print(endpoint, flush=True)
        while True:
            try:
                identity, _, msg = sock.recv_multipart()
            except zmq.Again:
                if stop.is_set():
                    break
                continue
            tag, pp, tp = parse_request(args.profile, msg)
            if tag != GET_META_MSG:
                print(f"unexpected tag {tag!r}", file=sys.stderr)
            sock.send_multipart(reply(args.profile, identity, payloads[(pp, tp)]))
            served += 1
    print(json.dumps({"served": served}), file=sys.stderr, flush=True)
    return 0


def run_vllm_server(args) -> int:
    """Run vLLM's own _nixl_handshake_listener (from the release's wheel) on a free loopback port."""
    import inspect
    import socket

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm_defs

    try:
        defs = vllm_defs.Defs(RELEASE[args.profile],
                              wheel=vllm_defs.find_wheel(RELEASE[args.profile], download=False))
        listener = vllm_defs.load_listener(defs)
    except FileNotFoundError as e:
        print(f"NO_WHEEL: {e}", file=sys.stderr, flush=True)
        return 3
    payloads = {tuple(int(x) for x in k.split(":")): bytes.fromhex(v)
                for k, v in json.loads(Path(args.payloads).read_text()).items()}
    encoded = {tp: b for (pp, tp), b in payloads.items()} if FRAMING[args.profile] == "H2" else payloads
    with socket.socket() as s:  # a free port (vLLM's listener takes a port number, not "*")
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready, stop = threading.Event(), threading.Event()
    params = inspect.signature(listener).parameters
    kw = dict(encoded_data=encoded, ready_event=ready, stop_event=stop, port=port)
    if "host" in params:
        kw["host"] = "127.0.0.1"
    else:
        import os
        os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
    t = threading.Thread(target=listener, kwargs=kw, daemon=True)
    t.start()
    ready.wait(10)
    print(f"tcp://127.0.0.1:{port}", flush=True)
    sys.stdin.read()
    stop.set()
    t.join(5)
    print(json.dumps({"listener_alive": t.is_alive()}), file=sys.stderr, flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("client")
    c.add_argument("--profile", required=True, choices=sorted(FRAMING))
    c.add_argument("--endpoint", required=True)
    c.add_argument("--ranks", required=True, help="pp:tp,pp:tp,...")
    s = sub.add_parser("server")
    s.add_argument("--profile", required=True, choices=sorted(FRAMING))
    s.add_argument("--payloads", required=True, help='JSON file {"pp:tp": "<hex>"}')
    s.add_argument("--fast-poll", action="store_true")
    v = sub.add_parser("vllm-server")
    v.add_argument("--profile", required=True, choices=sorted(FRAMING))
    v.add_argument("--payloads", required=True, help='JSON file {"pp:tp": "<hex>"}')
    args = ap.parse_args()
    return {"client": run_client, "server": run_server, "vllm-server": run_vllm_server}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
