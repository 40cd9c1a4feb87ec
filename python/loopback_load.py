"""Background load for the suite's busy-machine runs (issue 22): holds N idle TCP connections on loopback
(a listener of its own on 127.0.0.1, port chosen by the kernel) for at most SECONDS, then exits.

    python3 python/loopback_load.py 3000 3600 &

Loopback only, bounded in count and time; it sends nothing on the connections."""
import resource
import socket
import sys
import time


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 3600
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 2 * n + 64)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4096)
    held = []
    for _ in range(n):
        c = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        held += [c, a]
    print(f"holding {n} loopback connections to {srv.getsockname()[1]} for {secs:.0f} s", flush=True)
    time.sleep(secs)


if __name__ == "__main__":
    main()
