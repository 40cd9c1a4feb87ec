"""The READ workload of nixl's Go benchmark, through the NIXL wheel's own Python API (what vLLM calls).

Two agents in one process, UCX, 64 MiB of DRAM split into descriptors of --desc bytes; one prepared READ
reposted --iters times. Prints one JSON line: {"desc": ..., "bytes": ..., "seconds": ..., "gbps": ...}.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:  # the cu12/cu13 wheels install the module under this name
    from nixl_cu12._api import nixl_agent, nixl_agent_config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--total", type=int, default=64 << 20)
    p.add_argument("--desc", type=int, required=True)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    cfg = nixl_agent_config(backends=["UCX"])
    pid = os.getpid()
    init = nixl_agent(f"pybench-init-{pid}", cfg)
    target = nixl_agent(f"pybench-target-{pid}", cfg)
    src = np.zeros(a.total, dtype=np.uint8)
    dst = np.arange(a.total, dtype=np.uint64).view(np.uint8)[: a.total].copy()
    init.register_memory(init.get_reg_descs([(src.ctypes.data, a.total, 0, "")], "DRAM"))
    target.register_memory(target.get_reg_descs([(dst.ctypes.data, a.total, 0, "")], "DRAM"))
    name = init.add_remote_agent(target.get_agent_metadata())
    n = a.total // a.desc
    local = init.prep_xfer_dlist("", [(src.ctypes.data + i * a.desc, a.desc, 0) for i in range(n)], "DRAM")
    remote = init.prep_xfer_dlist(name, [(dst.ctypes.data + i * a.desc, a.desc, 0) for i in range(n)], "DRAM")
    idx = list(range(n))
    x = init.make_prepped_xfer("READ", local, idx, remote, idx)

    def once():
        st = init.transfer(x)
        while st != "DONE":
            if st == "ERR":
                raise RuntimeError("transfer failed")
            st = init.check_xfer_state(x)

    once()  # warm-up (connection set-up)
    t0 = time.perf_counter()
    for _ in range(a.iters):
        once()
    dt = time.perf_counter() - t0
    if not np.array_equal(src, dst):
        raise RuntimeError("READ moved the wrong bytes")
    init.release_xfer_handle(x)
    init.release_dlist_handle(local)
    init.release_dlist_handle(remote)
    print(json.dumps({"desc": a.desc, "bytes": a.total * a.iters, "seconds": dt, "gbps": a.total * a.iters / dt / 1e9}))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # Leave without running C-level exit handlers: libnl-route-3 (loaded by UCX's IB transport modules in the
    # NIXL wheel) crashes in its ELF destructor at exit() on machines without InfiniBand.
    os._exit(0)
