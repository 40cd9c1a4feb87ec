#!/usr/bin/env python3
"""A vLLM KV-event subscriber for connector's TestPrefixEventsVLLM (run from connector/): pyzmq's SUB socket and vLLM's own
KVEventBatch (vllm.distributed.kv_events, from the release's venv) judge what a gonixl prefill role publishes.

  1. Connect a SUB to --endpoint, subscribe to --topic, print "ready".
  2. Read "expect <n>" on stdin, then receive n messages [topic, seq, payload] (30 s at most each).
  3. Decode every payload with msgspec into KVEventBatch (strict: a field vLLM does not know, or a value of the
     wrong type, fails), re-encode it (must give the same bytes), and print one JSON line: per message its
     sequence number and the batch's events with every field vLLM decoded.
Errors: a traceback on stderr and exit status 1.
"""
import argparse
import json
import sys

import msgspec
import zmq

from vllm.distributed.kv_events import KVEventBatch

from kvcanon import canon


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--topic", default="")
    a = ap.parse_args()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, a.topic)
    sub.connect(a.endpoint)
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "expect":
        raise SystemExit("want 'expect <n>' on stdin, got %r" % line)
    n = int(line[1])
    dec = msgspec.msgpack.Decoder(type=KVEventBatch)
    enc = msgspec.msgpack.Encoder()
    out = []
    for i in range(n):
        if not sub.poll(30000):
            raise SystemExit("message %d of %d: nothing within 30 s" % (i, n))
        topic, seq, payload = sub.recv_multipart()
        batch = dec.decode(payload)
        again = enc.encode(batch)
        if again != payload:
            raise SystemExit("message %d: msgspec re-encodes the batch to other bytes:\n%s\n%s" % (i, payload.hex(), again.hex()))
        out.append({"topic": topic.decode(), "seq": int.from_bytes(seq, "big"), "ts": batch.ts,
                    "events": [canon(e) for e in batch.events], "data_parallel_rank": batch.data_parallel_rank})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
