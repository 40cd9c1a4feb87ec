#!/usr/bin/env python3
"""pyzmq (libzmq) peers for gonixl's ZMTP interop tests: socket patterns and sizes beyond vLLM's framing.

  req:    REQ connects to --endpoint, optional heartbeats (libzmq sends PING; the peer must answer PONG), waits
          --sleep seconds, sends each --request (hex) in turn and prints one JSON line per reply: frame sizes
          and sha256 of each frame.
  dealer: DEALER connects, sends --pipeline messages ["", request] without reading, then reads all replies;
          prints one JSON line per reply (as req).
  router: ROUTER (or REP with --rep) binds loopback, prints its endpoint, answers every request with
          ["", payload of --payload-size bytes, --extra-frames more small frames], until stdin closes; prints
          {"served": n} on stderr. The payload is bytes(i % 251 for i in range(n)).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import zmq

import zmq_util


def describe(parts):
    return {"frames": len(parts), "sizes": [len(p) for p in parts], "sha256": [hashlib.sha256(p).hexdigest() for p in parts]}


def heartbeat(sock, on: bool):
    if on:
        sock.setsockopt(zmq.HEARTBEAT_IVL, 50)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 300)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 1000)


def run_req(a) -> int:
    with zmq_util.socket(zmq.REQ, RCVTIMEO=10000) as s:
        heartbeat(s, a.heartbeat)
        s.connect(a.endpoint)
        time.sleep(a.sleep)
        for r in a.request:
            s.send(bytes.fromhex(r))
            print(json.dumps(describe(s.recv_multipart())), flush=True)
    return 0


def run_dealer(a) -> int:
    with zmq_util.socket(zmq.DEALER, RCVTIMEO=10000) as s:
        s.connect(a.endpoint)
        for _ in range(a.pipeline):
            s.send_multipart([b"", bytes.fromhex(a.request[0])])
        for _ in range(a.pipeline):
            print(json.dumps(describe(s.recv_multipart())), flush=True)
    return 0


def run_router(a) -> int:
    stop = zmq_util.stdin_closed()
    payload = bytes(i % 251 for i in range(a.payload_size))
    extra = [b"extra-%d" % i for i in range(a.extra_frames)]
    served = 0
    with zmq_util.socket(zmq.REP if a.rep else zmq.ROUTER, RCVTIMEO=100) as s:
        heartbeat(s, a.heartbeat)
        print(zmq_util.bind_loopback(s), flush=True)
        while not stop.is_set():
            try:
                parts = s.recv_multipart()
            except zmq.Again:
                continue
            if a.rep:
                s.send_multipart([payload] + extra)
            else:
                s.send_multipart(parts[:-1] + [payload] + extra)
            served += 1
    print(json.dumps({"served": served}), file=sys.stderr, flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("req", "dealer"):
        c = sub.add_parser(name)
        c.add_argument("--endpoint", required=True)
        c.add_argument("--request", action="append", required=True, help="hex; repeat for several")
        c.add_argument("--heartbeat", action="store_true")
        c.add_argument("--sleep", type=float, default=0)
        c.add_argument("--pipeline", type=int, default=1)
    r = sub.add_parser("router")
    r.add_argument("--payload-size", type=int, default=1000)
    r.add_argument("--extra-frames", type=int, default=0)
    r.add_argument("--rep", action="store_true")
    r.add_argument("--heartbeat", action="store_true")
    a = ap.parse_args()
    return {"req": run_req, "dealer": run_dealer, "router": run_router}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
