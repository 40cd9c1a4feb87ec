#!/usr/bin/env python3
"""A vLLM-style prefill worker in Python, for gonixl's interop tests: it does what vLLM's NixlConnector prefill
side does with the NIXL wheel's Python API, for one request, against any decode engine (here gonixl's Go decode
role):

  NIXL:         nixl_agent, get_reg_descs + register_memory (DRAM regions), get_agent_metadata
  side channel: ROUTER, (identity, "", msg) with msg msgspec-decoded as (tag, tp) [0.16] or (tag, pp, tp) [0.33];
                reply (identity, "", payload) [+ msgspec float clock frame on 0.33]; the payload is vLLM's own
                NixlHandshakePayload{compute_nixl_compatibility_hash, msgpack(NixlAgentMetadata)}
  completion:   get_new_notifs() until "<request_id>:<n>" arrives ("HB:" heartbeats are counted)

It fills the request's blocks with the test pattern, prints one JSON line {"endpoint", "kv_transfer_params"},
serves until the notification arrives, then prints {"notified": ...}. Exit codes: 0 notified, 2 timed out.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import zmq

import vllm_peer_common as c
import zmq_util


def main() -> int:
    ap = argparse.ArgumentParser()
    c.add_model_args(ap)
    ap.add_argument("--engine-id", default="")
    ap.add_argument("--request-id", default="py-req-0")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--num-blocks", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    engine_id = args.engine_id or str(uuid.uuid4())
    defs = c.vllm_defs(args.profile)
    hash_, hash_source = c.compat_hash(defs, args)

    cache = c.Arena(args, args.num_blocks)
    regions, block_len, agent = cache.regions, cache.block_len, cache.agent

    # The request's blocks: every other id from 3 (not contiguous, not starting at 1), in token order.
    n = (args.tokens + args.block_size - 1) // args.block_size
    blocks = list(range(3, 3 + 2 * n, 2))
    assert blocks[-1] < args.num_blocks, "num_blocks too small for the request"
    for r in range(regions):
        for b in blocks:
            cache.block(r, b)[:] = c.pattern(args.seed, r, b, block_len)

    values = dict(
        engine_id=engine_id, agent_metadata=agent.get_agent_metadata(), kv_caches_base_addr=cache.bases, device_id=0,
        num_blocks=args.num_blocks, block_lens=[block_len] * regions, block_strides=[block_len] * regions,
        kv_cache_layout=c.LAYOUT_NAME[args.profile], block_size=args.block_size, ssm_sizes=(0, 0), attn_backend_name=args.attn,
        physical_blocks_per_logical_kv_block=1, region_num_blocks=None, region_group_ids=None, region_names=None,
        region_mem_types=None, dcp_size=1, pcp_size=1, ple_block_len=None, region_members=[],
        packed_member_layouts={},
    )
    payload = c.encode_handshake(defs, args.profile, hash_, values)

    with zmq_util.socket(zmq.ROUTER) as sock:
        endpoint = zmq_util.bind_loopback(sock)
        port = int(endpoint.rsplit(":", 1)[1])
        vals = {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": blocks if c.PARAMS_FLAT[args.profile] else [blocks],
                "remote_engine_id": engine_id, "remote_request_id": args.request_id, "remote_host": "127.0.0.1",
                "remote_port": port, "tp_size": 1, "dcp_size": 1, "pp_size": 1, "remote_num_tokens": args.tokens,
                "remote_blocks_expiry_time": None, "remote_registration_generation": 1, "transfer_mode": "pull",
                "remote_prefill_cached_tokens": 0}
        kv = {k: vals[k] for k in c.PARAMS_KEYS[args.profile]}  # the release's keys, in its order
        print(json.dumps({"endpoint": endpoint, "engine_id": engine_id, "hash": hash_, "hash_source": hash_source,
                          "kv_transfer_params": kv}), flush=True)

        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        served, heartbeats, others = 0, 0, []
        notified = None
        deadline = time.monotonic() + args.timeout
        while notified is None and time.monotonic() < deadline:
            if poller.poll(20):
                identity, _, msg = sock.recv_multipart()
                tag, _pp, tp = c.parse_request(args.profile, msg)
                served_payload = payload if tag == c.GET_META_MSG and tp == 0 else b""
                sock.send_multipart(c.reply(args.profile, identity, served_payload))
                served += 1
            for sender, msgs in agent.get_new_notifs().items():
                for m in msgs:
                    s = m.decode()
                    if s.startswith("HB:"):
                        heartbeats += 1
                        continue
                    rid, _, count = s.rpartition(":")
                    if rid == args.request_id:
                        notified = {"msg": s, "from": sender.decode() if isinstance(sender, bytes) else sender,
                                    "count": int(count)}
                    else:
                        others.append(s)
    agent.deregister_memory(cache.reg)
    print(json.dumps({"notified": notified is not None, **(notified or {}), "served": served,
                      "heartbeats": heartbeats, "others": others}), flush=True)
    return 0 if notified is not None else 2


if __name__ == "__main__":
    c.exit_now(main())
