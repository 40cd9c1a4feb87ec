"""The pyzmq plumbing gonixl's Python ZMQ peers share (zmtp_peer.py, sidechannel_peer.py, vllm_prefill_peer.py,
vllm_decode_peer.py): a socket that never lingers, a ROUTER bound to a free loopback port, and stdin closing as
the signal to stop serving (how the Go tests stop a peer). pyzmq only.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import zmq


@contextlib.contextmanager
def socket(kind: int, **options):
    """A socket of kind in a context of its own, LINGER 0 and the given options (e.g. RCVTIMEO=5000), closed
    and the context terminated on exit."""
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        ctx.term()


def bind_loopback(sock) -> str:
    """Bind sock to a free port on 127.0.0.1 and return its endpoint (tcp://127.0.0.1:PORT)."""
    sock.bind("tcp://127.0.0.1:*")
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def stdin_closed() -> threading.Event:
    """An event set once stdin closes."""
    stop = threading.Event()

    def watch():
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop
