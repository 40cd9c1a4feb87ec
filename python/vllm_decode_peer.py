#!/usr/bin/env python3
"""A vLLM-style decode worker in Python, for gonixl's interop tests: given P's kv_transfer_params it does what
vLLM's NixlConnector decode side does with the NIXL wheel's Python API, against any prefill engine (here gonixl's
Go prefill role):

  side channel: REQ, msgspec.msgpack.encode((GET_META_MSG, tp)) [0.16] or ((GET_META_MSG, pp, tp)) [0.33],
                RCVTIMEO 5000; the reply decoded with vLLM's NixlHandshakePayload / NixlAgentMetadata;
                the compatibility hash compared with vLLM's compute_nixl_compatibility_hash of this model
  NIXL:         add_remote_agent, get_xfer_descs + prep_xfer_dlist (local "NIXL_INIT_AGENT" and remote),
                [send_notif "HB:<id>" on 0.33], make_prepped_xfer("READ", ..., notif_msg="<id>:<tp>"),
                transfer, check_xfer_state until DONE

It verifies every byte against the test pattern and prints one JSON line. Exit codes: 0 ok, 2 transfer failed or
timed out, 3 handshake refused (hash or engine mismatch), 4 wrong bytes.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import zmq

import vllm_peer_common as c
import zmq_util


def main() -> int:
    ap = argparse.ArgumentParser()
    c.add_model_args(ap)
    ap.add_argument("--params", required=True, help="P's kv_transfer_params (JSON)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--num-blocks", type=int, default=16, help="local cache blocks")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--heartbeat", action="store_true", help="send an HB: heartbeat before reading (0.33)")
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()
    out = {"profile": args.profile}

    kv = json.loads(args.params)
    ids = kv["remote_block_ids"]
    remote_ids = ids if c.PARAMS_FLAT[args.profile] else ids[0]
    defs = c.vllm_defs(args.profile)
    local_hash, out["hash_source"] = c.compat_hash(defs, args)

    # Side channel.
    with zmq_util.socket(zmq.REQ, RCVTIMEO=5000) as sock:
        sock.connect(f"tcp://{kv['remote_host']}:{kv['remote_port']}")
        t0 = time.perf_counter()
        sock.send(c.request(args.profile, 0, 0))
        payload, _, clock = c.recv_reply(sock, args.profile)
    if clock is not None:
        out["clock"] = float(clock)
    remote_hash, md = c.decode_handshake(defs, payload)
    out["handshake_s"] = time.perf_counter() - t0
    out["remote_hash"], out["local_hash"] = remote_hash, local_hash
    if remote_hash != local_hash:
        out["error"] = f"compatibility hash mismatch: local {local_hash}, remote {remote_hash}"
        print(json.dumps(out), flush=True)
        return 3
    if md.engine_id != kv["remote_engine_id"]:
        out["error"] = f"engine id mismatch: expected {kv['remote_engine_id']}, got {md.engine_id}"
        print(json.dumps(out), flush=True)
        return 3

    # vLLM compares the label exactly (_validate_remote_agent_handshake): "Heterogeneous TP expects same
    # kv_cache_layout".
    if md.kv_cache_layout != c.LAYOUT_NAME[args.profile]:
        out["error"] = f"kv_cache_layout {md.kv_cache_layout!r} != local {c.LAYOUT_NAME[args.profile]!r}"
        print(json.dumps(out), flush=True)
        return 3

    regions, block_len = c.geometry(args)
    if len(md.kv_caches_base_addr) != regions or any(bl != block_len for bl in md.block_lens):
        out["error"] = f"remote geometry {len(md.kv_caches_base_addr)} regions × {md.block_lens[:1]} != local {regions} × {block_len}"
        print(json.dumps(out), flush=True)
        return 3

    # Local KV cache: one arena, regions back to back, registered as DRAM.
    cache = c.Arena(args, args.num_blocks)
    agent = cache.agent
    remote = agent.add_remote_agent(md.agent_metadata)
    out["remote_agent"] = remote.decode() if isinstance(remote, bytes) else remote
    local_h = agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                    agent.get_xfer_descs(c.block_descs(cache.bases, args.num_blocks, block_len), "DRAM"))
    remote_h = agent.prep_xfer_dlist(remote, agent.get_xfer_descs(
        c.block_descs(md.kv_caches_base_addr, md.num_blocks, md.block_lens[0], md.device_id), "DRAM"))
    local_blocks = list(range(1, 1 + len(remote_ids)))
    lidx = c.desc_ids(regions, args.num_blocks, local_blocks)
    ridx = c.desc_ids(regions, md.num_blocks, remote_ids)

    if args.heartbeat:
        agent.send_notif(remote, ("HB:" + kv["remote_request_id"]).encode())
    notif = f"{kv['remote_request_id']}:{args.tp_size}".encode()
    t1 = time.perf_counter()
    h = agent.make_prepped_xfer("READ", local_h, lidx, remote_h, ridx, notif_msg=notif)
    state = agent.transfer(h)
    deadline = time.monotonic() + args.timeout
    while state != "DONE":
        if state == "ERR" or time.monotonic() > deadline:
            out["error"] = f"transfer state {state}"
            print(json.dumps(out), flush=True)
            return 2
        state = agent.check_xfer_state(h)
    out["transfer_s"] = time.perf_counter() - t1
    out["bytes"] = len(lidx) * block_len
    out["blocks"] = len(local_blocks)
    out["notif"] = notif.decode()

    bad = 0
    for r in range(regions):
        for j, b in enumerate(local_blocks):
            if not np.array_equal(cache.block(r, b), c.pattern(args.seed, r, remote_ids[j], block_len)):
                bad += 1
    out["bad_blocks"] = bad
    agent.release_xfer_handle(h)
    agent.release_dlist_handle(local_h)
    agent.release_dlist_handle(remote_h)
    agent.remove_remote_agent(remote)
    agent.deregister_memory(cache.reg)
    out["ok"] = bad == 0
    print(json.dumps(out), flush=True)
    return 0 if bad == 0 else 4


if __name__ == "__main__":
    c.exit_now(main())
