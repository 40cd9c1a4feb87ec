#!/usr/bin/env python3
"""Captures the bytes libzmq (through pyzmq) writes on the wire, as seeds for the zmtp fuzz targets and as
vectors for its tests. Run from the repository root: .venv/bin/python internal/zmtp/testdata/capture.py

  req_*.bin:    what a pyzmq REQ socket sends to a ROUTER: greeting, READY, then a request ["", body].
  router_*.bin: what a pyzmq ROUTER sends to a REQ: greeting, READY, then a reply ["", payload, clock] (H4).
  dealer_*.bin: what a pyzmq DEALER sends: greeting, READY (with an Identity), then a 3-frame message with a
                long (300-byte) frame.
  heartbeat_req.bin: a REQ with ZMQ_HEARTBEAT_IVL set: greeting, READY, then PING commands (ZMTP 3.1).
  sub_zmtp31.bin, sub_to_zmtp30.bin: what a pyzmq SUB sends to a PUB peer speaking ZMTP 3.1 or 3.0: greeting,
                READY, then subscriptions to "kv" and "" and the cancel of "kv" (commands or 3.0 messages).
The "peer" side of each capture is a raw socket that writes a ZMTP 3.1 greeting and READY of the matching
socket type, so libzmq completes its handshake.
"""
import socket
import struct
import sys
import time
from pathlib import Path

import zmq

OUT = Path(__file__).resolve().parent


def greeting(minor=1):
    return b"\xff" + b"\x00" * 7 + b"\x01\x7f" + bytes([3, minor]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def ready(socket_type: bytes, identity: bytes = b""):
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    body += b"\x08Identity" + struct.pack(">I", len(identity)) + identity
    return b"\x04" + bytes([len(body)]) + body


def frame(body: bytes, more: bool):
    flags = 1 if more else 0
    if len(body) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def drain(conn, seconds=0.5):
    conn.settimeout(0.05)
    data = b""
    end = time.time() + seconds
    while time.time() < end:
        try:
            b = conn.recv(65536)
            if not b:
                break
            data += b
        except socket.timeout:
            pass
    return data


def capture_client(kind, peer_type, minor, send, name, opts=()):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    ctx = zmq.Context()
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    for k, v in opts:
        s.setsockopt(k, v)
    s.connect("tcp://127.0.0.1:%d" % srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.sendall(greeting(minor) + ready(peer_type))
    send(s)
    data = drain(conn, 1.0 if opts else 0.5)
    (OUT / name).write_bytes(data)
    print(name, len(data), data[:80].hex(), file=sys.stderr)
    s.close()
    ctx.term()
    conn.close()
    srv.close()


def capture_router(name):
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    c = socket.create_connection(("127.0.0.1", port))
    req = bytes.fromhex("93c40c6765745f6d6574615f6d73670000")
    # In steps: libzmq 4.3.5 stalls its handshake when the end of the greeting, READY and a message arrive in
    # one read (a peer that waits for each step, as ours does, never sends them together).
    c.sendall(greeting())
    head = drain(c, 0.2)
    c.sendall(ready(b"REQ"))
    time.sleep(0.2)
    c.sendall(frame(b"", True) + frame(req, False))
    r.setsockopt(zmq.RCVTIMEO, 5000)
    ident, empty, msg = r.recv_multipart()
    r.send_multipart([ident, b"", b"\x81\xa1k\xa1v" * 100, b"\xcb" + struct.pack(">d", 12.5)])
    data = head + drain(c)
    (OUT / name).write_bytes(data)
    print(name, len(data), data[:80].hex(), file=sys.stderr)
    c.close()
    r.close()
    ctx.term()


def subscribe(s):
    s.setsockopt(zmq.SUBSCRIBE, b"kv")
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.UNSUBSCRIBE, b"kv")


def capture_sub():
    capture_client(zmq.SUB, b"PUB", 1, subscribe, "sub_zmtp31.bin")
    capture_client(zmq.SUB, b"PUB", 0, subscribe, "sub_to_zmtp30.bin")


def main():
    req = bytes.fromhex("93c40c6765745f6d6574615f6d73670001")
    capture_client(zmq.REQ, b"ROUTER", 1, lambda s: s.send(req), "req_zmtp31.bin")
    capture_client(zmq.REQ, b"ROUTER", 0, lambda s: s.send(req), "req_to_zmtp30.bin")
    capture_client(zmq.DEALER, b"ROUTER", 1, lambda s: s.send_multipart([b"a", b"", b"x" * 300]), "dealer_multiframe.bin",
                   opts=[(zmq.ROUTING_ID, b"dealer-1")])
    capture_client(zmq.REQ, b"ROUTER", 1, lambda s: None, "heartbeat_req.bin",
                   opts=[(zmq.HEARTBEAT_IVL, 100), (zmq.HEARTBEAT_TTL, 2000), (zmq.HEARTBEAT_TIMEOUT, 5000)])
    capture_router("router_reply_h4.bin")
    capture_sub()
    print("pyzmq", zmq.pyzmq_version(), "libzmq", zmq.zmq_version(), file=sys.stderr)


if __name__ == "__main__":
    main()
