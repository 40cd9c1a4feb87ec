#!/usr/bin/env python3
"""Captures what libzmq (through pyzmq) sends to the KV-events publisher, as seeds for connector/kvevents' fuzz
targets (FuzzReplayStream, FuzzSubscriberStream). Run from the repository root:
    .venv/bin/python connector/kvevents/testdata/capture.py

  replay_dealer.bin: a DEALER's replay requests as vLLM's consumers send them, [b"", start as 8 bytes], for 0 and 5.
  replay_req.bin:    the same request from a REQ socket (which adds the empty frame itself).
  sub_kv.bin:        a SUB subscribing to "kv@", then "", then cancelling "kv@" (ZMTP 3.1 commands).
The raw-socket peer and the capture itself are internal/zmtp/testdata/capture.py's.
"""
import sys
from pathlib import Path

import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "internal" / "zmtp" / "testdata"))
import capture as zc  # noqa: E402

zc.OUT = HERE


def subscribe(s):
    s.setsockopt(zmq.SUBSCRIBE, b"kv@")
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.UNSUBSCRIBE, b"kv@")


def main():
    zc.capture_client(zmq.DEALER, b"ROUTER", 1,
                      lambda s: [s.send_multipart([b"", n.to_bytes(8, "big")]) for n in (0, 5)], "replay_dealer.bin")
    zc.capture_client(zmq.REQ, b"ROUTER", 1, lambda s: s.send((0).to_bytes(8, "big")), "replay_req.bin")
    zc.capture_client(zmq.SUB, b"PUB", 1, subscribe, "sub_kv.bin")


if __name__ == "__main__":
    main()
