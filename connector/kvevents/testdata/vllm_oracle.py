#!/usr/bin/env python3
"""The oracle of connector/kvevents' tests, run by TestVLLMOracle with a vLLM release's venv: vLLM's own classes
judge what gonixl's Go publisher sends.

  1. A pyzmq SUB (subscribed to the topic) and DEALER connect to the Go publisher; "ready" on stdout.
  2. The test publishes (some batches before we connected, a burst that overflows our queue at the Go side) and
     writes "published <n>" on stdin. We drain the SUB until it has been quiet for a second.
  3. Recovery as a vLLM consumer does it: a replay request from the first sequence number we missed, over the
     DEALER ([b"", start as 8 bytes big-endian]); replies until the end marker.
  4. Every payload is decoded with msgspec into vLLM's KVEventBatch, re-encoded (must give the same bytes), and
     printed as JSON for the test to compare with what it published.
  5. Reference: vLLM's own ZmqEventPublisher (this release's) publishes the decoded batches; the replay it
     answers for the same requests must equal the Go publisher's frame for frame.
Output: one JSON object on stdout (the last line). Errors: a traceback on stderr and exit status 1.
"""
import argparse
import json
import struct
import sys
import time

import msgspec
import zmq

from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher

from kvcanon import canon

END = (-1).to_bytes(8, "big", signed=True)


def replay(ctx, endpoint, start, timeout_ms=30000):
    """A replay request over a DEALER; returns the reply messages, end marker included."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        if not d.poll(timeout_ms):
            raise SystemExit("replay from %s: no end marker within %d ms (got %d messages)" % (endpoint, timeout_ms, len(out)))
        msg = d.recv_multipart()
        out.append(msg)
        if END in msg:
            break
    d.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pub", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--ipc", required=True, help="ipc:// endpoint for the reference publisher's PUB socket")
    a = ap.parse_args()
    topic = a.topic.encode()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 100000)
    sub.connect(a.pub)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    print("ready", flush=True)

    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "published":
        raise SystemExit("expected 'published <n>' on stdin, got %r" % line)
    n = int(line[1])

    live = {}
    bad_live = []
    while sub.poll(1000):
        msg = sub.recv_multipart()
        if len(msg) != 3 or msg[0] != topic or len(msg[1]) != 8:
            bad_live.append([f.hex() for f in msg])
            continue
        live[int.from_bytes(msg[1], "big")] = msg[2]
    missing = [s for s in range(n) if s not in live]
    first = missing[0] if missing else n

    go_replays = {start: replay(ctx, a.replay, start) for start in sorted({first, 0, n // 2})}
    payloads = dict(live)
    for start, msgs in go_replays.items():
        for m in msgs[:-1]:
            seq, payload = int.from_bytes(m[-2], "big"), m[-1]
            if seq in payloads and payloads[seq] != payload:
                raise SystemExit("seq %d: replayed payload differs from the live one" % seq)
            payloads[seq] = payload

    dec = msgspec.msgpack.Decoder(KVEventBatch)
    enc = msgspec.msgpack.Encoder()
    batches, reencode_diff = {}, []
    for seq in sorted(payloads):
        b = dec.decode(payloads[seq])
        if enc.encode(b) != payloads[seq]:
            reencode_diff.append(seq)
        batches[seq] = b

    # The reference: vLLM's own publisher, given the decoded batches, in order.
    ref = ZmqEventPublisher(data_parallel_rank=0, endpoint=a.ipc, replay_endpoint="tcp://127.0.0.1:0",
                            buffer_steps=10000, topic=a.topic)
    ref_ep = ref._replay.getsockopt_string(zmq.LAST_ENDPOINT)
    for seq in range(n):
        ref.publish(batches[seq])
    deadline = time.time() + 30
    while len(ref._buffer) < n and time.time() < deadline:
        time.sleep(0.05)
    ref_replays = {start: replay(ctx, ref_ep, start) for start in go_replays}
    ref_payloads = dict(ref._buffer)
    ref.shutdown()

    out = {
        "n": n,
        "live": sorted(live),
        "bad_live": bad_live,
        "first_missing": first,
        "recovered": sorted(payloads),
        "reencode_diff": reencode_diff,
        "ref_payload_diff": [s for s in range(n) if ref_payloads.get(s) != payloads.get(s)],
        "replay_equal": {str(s): go_replays[s] == ref_replays[s] for s in go_replays},
        "replay_frames": {str(s): [[f.hex() for f in m] for m in go_replays[s][:2] + go_replays[s][-1:]] for s in go_replays},
        "ref_replay_frames": {str(s): [[f.hex() for f in m] for m in ref_replays[s][:2] + ref_replays[s][-1:]] for s in ref_replays},
        "batches": {str(s): {"ts": struct.pack(">d", b.ts).hex(), "events": canon(b.events),
                             "data_parallel_rank": b.data_parallel_rank} for s, b in batches.items()},
        "zmq": zmq.zmq_version(),
    }
    sub.close()
    ctx.term()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
