"""Runs vLLM's OWN NixlConnector (scheduler side and worker side) on vLLM's CPU platform with the real NIXL
wheel, driven the way vLLM's engine drives it, for gonixl's real-vLLM test tier (connector/vllm_real_test.go).

No imitation of vLLM's worker: the scheduler-side connector serves the ZMQ side channel and decides what to
send and when to free; the worker-side connector registers the KV cache with NIXL, handshakes, READs,
notifies, heartbeats and expires leases. This file only does what vLLM's engine core and model runner do
around them: build the VllmConfig (EngineArgs, as `vllm serve` does) and the KVCacheConfig (vLLM's own
planner), allocate the KV cache tensors (vLLM's allocator where the release has one), hand the worker's
handshake metadata to the scheduler side, and step: build_connector_meta -> bind_connector_metadata ->
start_load_kv -> get_finished -> update_connector_output, every few milliseconds.

Roles:
  --role decode   vLLM is the decode instance: for each "pull" command it takes the kv_transfer_params a
                  gonixl prefill produced, schedules the request (get_num_new_matched_tokens,
                  update_state_after_alloc) and steps until get_finished reports it received; it then hashes
                  every block it received.
  --role prefill  vLLM is the prefill instance: for each "prefill" command it allocates blocks, fills the KV
                  cache tensors there with random bytes, finishes the request (request_finished) and prints
                  the kv_transfer_params; it reports when get_finished says the request is done sending (a
                  decode peer's notification, or the lease / abort timeout).

Protocol: JSON lines. Commands on stdin, events on the original stdout (fd 1 at start); everything vLLM,
torch and NIXL print goes to stderr.
"""

import argparse
import hashlib
import json
import logging
import os
import queue
import sys
import threading
import time

# Keep the JSON channel clean: fd 1 becomes stderr for everything else (vLLM's logger, NIXL's C++ logs).
_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit(**kw):
    _out.write(json.dumps(kw) + "\n")
    _out.flush()


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["decode", "prefill"], required=True)
    ap.add_argument("--model", required=True, help="folder holding config.json (no weights)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=64)
    ap.add_argument("--engine-id", default=None)
    ap.add_argument("--lease", type=int, default=0, help="kv_lease_duration (releases with leases); 0 = vLLM's default")
    ap.add_argument("--dist-port", type=int, default=0)
    ap.add_argument("--tp-size", type=int, default=1, help="tensor parallel size: one driver process per rank")
    ap.add_argument("--tp-rank", type=int, default=0, help="rank 0 runs the scheduler side and reads commands")
    ap.add_argument("--side-port", type=int, default=0,
                    help="VLLM_NIXL_SIDE_CHANNEL_PORT (every vLLM instance serves one, the decode one too); 0 = a free port")
    return ap.parse_args()


class HeartbeatCounter(logging.Handler):
    """Counts vLLM's own log records about leases (observation only)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.extended = 0
        self.received = 0
        self.expired = 0

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Heartbeat extended lease"):
            self.extended += 1
        elif msg.startswith("Releasing expired KV blocks"):
            self.expired += 1


def main():
    args = parse_args()
    t_import = time.perf_counter()
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(args.side_port or _free_port())
    import torch
    import vllm
    from vllm.config import KVTransferConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request, RequestStatus

    try:  # the connector module moved into a package in 0.20
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector
    except ImportError:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector import NixlConnector
    try:
        from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    version = vllm.__version__
    if current_platform.device_type != "cpu":
        emit(event="error", error=f"vLLM {version} did not select its CPU platform (got {current_platform.device_type!r}); "
             "set VLLM_TARGET_DEVICE=cpu (and, for wheels that ignore it, install the platform plugin: scripts/vllm-venv.sh)")
        return 2

    # vLLM logs a lease extension at debug level only: let those records of its NIXL worker through to our
    # counter (attached to vLLM's root logger, where they propagate), keeping vLLM's own handlers at INFO.
    hb = HeartbeatCounter()
    root = logging.getLogger("vllm")
    for h in root.handlers:
        h.setLevel(max(h.level, logging.INFO))
    root.addHandler(hb)
    for name in ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker",
                 "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector"):
        logging.getLogger(name).setLevel(logging.DEBUG)

    extra = {"backends": ["UCX"]}
    if args.lease:
        extra["kv_lease_duration"] = args.lease
    engine_id = args.engine_id or f"vllm-{args.role}-{os.getpid()}"
    # kv_buffer_device="cpu": the KV cache is in DRAM (releases before ~0.2x default to "cuda" and refuse it on CPU).
    kvt = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both", engine_id=engine_id, kv_buffer_device="cpu",
                           kv_connector_extra_config=extra)
    # What `vllm serve <model> --block-size 32 --kv-transfer-config ...` builds.
    eargs = EngineArgs(model=args.model, skip_tokenizer_init=True, dtype="bfloat16", block_size=args.block_size,
                       max_model_len=4096, enforce_eager=True, kv_transfer_config=kvt,
                       tensor_parallel_size=args.tp_size,
                       num_gpu_blocks_override=args.num_blocks)
    vllm_config = eargs.create_engine_config()
    mc = vllm_config.model_config

    with set_current_vllm_config(vllm_config):
        dist_port = args.dist_port or _free_port()
        init_distributed_environment(world_size=args.tp_size, rank=args.tp_rank, local_rank=args.tp_rank,
                                     distributed_init_method=f"tcp://127.0.0.1:{dist_port}", backend="gloo")
        ensure_model_parallel_initialized(args.tp_size, 1)
        from vllm.distributed.parallel_state import get_world_group
        group = Group(get_world_group().cpu_group, args.tp_size, args.tp_rank)

        num_layers = mc.get_num_layers(vllm_config.parallel_config)
        layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
        spec = FullAttentionSpec(block_size=args.block_size, num_kv_heads=mc.get_num_kv_heads(vllm_config.parallel_config),
                                 head_size=mc.get_head_size(), dtype=torch.bfloat16)
        groups = [KVCacheGroupSpec(layer_names, spec)]
        resolve_layout(vllm_config, spec, num_layers)
        kv_cache_config = get_kv_cache_config_from_groups(vllm_config, groups, spec.page_size_bytes * num_layers * args.num_blocks)
        num_blocks = kv_cache_config.num_blocks

        # The scheduler side lives in the engine core (rank 0's process here), the worker side in every rank.
        sched = NixlConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config) if args.tp_rank == 0 else None
        worker = NixlConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        kv_caches, regions = allocate(torch, vllm_config, kv_cache_config, worker, num_blocks)
        worker.register_kv_caches(kv_caches)
        # The engine collects every rank's handshake metadata and hands it to the scheduler side.
        mds = group.gather(worker.get_handshake_metadata())
        if sched is not None:
            _rebind_on_eaddrinuse(sched.connector_scheduler)
            try:
                sched.set_xfer_handshake_metadata_pp_aware({(0, r): md for r, md in enumerate(mds)})
            except AttributeError:
                sched.set_xfer_handshake_metadata(dict(enumerate(mds)))

        cw = worker.connector_worker
        cs = sched.connector_scheduler if sched is not None else None
        emit(event="ready", version=version, engine_id=engine_id, role=args.role, tp_rank=args.tp_rank,
             port=int(cs.side_channel_port) if cs else 0, host=str(cs.side_channel_host) if cs else "",
             compat_hash=getattr(cw, "compat_hash", None), backend=cw.backend_name,
             kv_cache_layout=str(getattr(cw, "kv_cache_layout", "")), num_blocks=num_blocks,
             num_regions=len(regions), block_len=len(block_bytes(regions[0], 0)),
             import_s=round(time.perf_counter() - t_import, 3), lease=args.lease)

        eng = Engine(sched, worker, SchedulerOutput, KVConnectorOutput, hb, group)
        if args.tp_rank > 0:
            follow(eng, regions, group)
            worker.shutdown()
            return 0
        cmds = queue.Queue()
        threading.Thread(target=_read_stdin, args=(cmds,), daemon=True).start()
        free = list(range(1, num_blocks))  # block 0 is vLLM's null block
        reqs = {}  # prefill role: req_id -> {"blocks", "t_finished"}
        waiting = {}  # decode role: req_id -> case

        while True:
            try:
                # While a READ is pending, step without waiting (as vLLM's engine steps while it has requests),
                # so the step loop adds no latency to the transfer timings.
                cmd = cmds.get_nowait() if waiting else cmds.get(timeout=0.005)
            except queue.Empty:
                cmd = None
            if cmd is not None:
                op = cmd.get("cmd")
                if op == "quit":
                    break
                try:
                    if op == "prefill":
                        n = int(cmd["num_tokens"])
                        nb = -(-n // args.block_size)
                        blocks, free = free[:nb], free[nb:]
                        seed = int(cmd.get("seed", 1))
                        # What the model's forward pass leaves in every rank's KV cache at the scheduled blocks.
                        group.call(("fill", blocks, seed), lambda: fill(regions, blocks, seed + 1000 * args.tp_rank))
                        req = make_request(Request, SamplingParams, cmd["req_id"], n, {"do_remote_decode": True})
                        if hasattr(sched, "on_new_request"):
                            sched.on_new_request(req)
                        kvb = KVCacheBlocks(([KVCacheBlock(block_id=b) for b in blocks],))
                        sched.update_state_after_alloc(req, kvb, 0)
                        eng.step()  # the step that ran the prefill: the request is in the worker's batch
                        req.num_computed_tokens = n
                        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                        if "abort_timeout" in cmd:  # releases without leases read it when the request finishes
                            os.environ["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] = str(cmd["abort_timeout"])
                        delay, params = sched.request_finished(req, blocks)
                        eng.step()  # hands reqs_to_send (the expiry) to the worker
                        rank_hashes = group.call(("hash", blocks), lambda: hashes(regions, blocks))
                        reqs[req.request_id] = {"blocks": blocks, "t": time.perf_counter()}  # published below
                        emit(event="params", req_id=req.request_id, delay_free=bool(delay), kv_transfer_params=params,
                             hashes=rank_hashes[0], rank_hashes=rank_hashes)
                    elif op == "pull":
                        params = dict(cmd["kv_transfer_params"])
                        params["do_remote_prefill"] = True
                        params["do_remote_decode"] = False
                        n = int(cmd["num_tokens"])
                        req = make_request(Request, SamplingParams, cmd["req_id"], n, params)
                        if hasattr(sched, "on_new_request"):
                            sched.on_new_request(req)  # 0.22+: starts heartbeats to the prefill engine
                        waiting[req.request_id] = {"req": req, "n": n, "t": time.perf_counter(),
                                                   "hold_until": time.perf_counter() + float(cmd.get("hold_s", 0)),
                                                   "scheduled": False, "hb0": eng.heartbeats_sent()}
                    else:
                        emit(event="error", error=f"unknown command {op!r}")
                except Exception as e:  # report and keep serving the other cases
                    logging.getLogger("gonixl").exception("command failed")
                    emit(event="error", req_id=cmd.get("req_id"), error=f"{type(e).__name__}: {e}")

            # Decode role: schedule the held requests whose hold ended (a request waiting in vLLM's queue).
            for rid, c in list(waiting.items()):
                if c["scheduled"] or time.perf_counter() < c["hold_until"]:
                    continue
                req = c["req"]
                count, is_async = sched.get_num_new_matched_tokens(req, 0)
                nb = -(-int(count or 0) // args.block_size)
                blocks, free = free[:nb], free[nb:]
                c["blocks"] = blocks
                sched.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(block_id=b) for b in blocks],)), count or 0)
                c["scheduled"] = True
                c["t_sched"] = time.perf_counter()

            sending, recving, failed = eng.step()
            for rid in sending:
                if rid in reqs:
                    r = reqs.pop(rid)
                    free.extend(r["blocks"])
                    emit(event="finished_sending", req_id=rid, after_s=round(time.perf_counter() - r["t"], 3),
                         expired=eng.expired, lease_extended=hb.extended,
                         heartbeats_received=hb.received)
            for rid in recving:
                c = waiting.pop(rid, None)
                if c is None:
                    continue
                req = c["req"]
                ok = rid not in failed
                t_recv = time.perf_counter()
                timing = eng.take_timings(c["t_sched"])
                rank_hashes = group.call(("hash", c["blocks"]), lambda: hashes(regions, c["blocks"]))
                emit(event="pulled", req_id=rid, ok=ok, blocks=c["blocks"], hashes=rank_hashes[0], rank_hashes=rank_hashes,
                     seconds=round(t_recv - c["t_sched"], 6), **timing,
                     heartbeats=eng.heartbeats_sent() - c["hb0"],
                     load_errors=sorted(eng.load_errors))
                free.extend(c["blocks"])
        group.call(("quit",), lambda: None)
        sched.shutdown()
        worker.shutdown()
    return 0


class Group:
    """The engine's messages to its workers (SchedulerOutput broadcast, outputs gathered), over the ranks' gloo
    group. With one rank everything stays local."""

    def __init__(self, pg, size, rank):
        self.pg, self.size, self.rank = pg, size, rank

    def gather(self, obj):
        if self.size == 1:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.pg)
        return out

    def broadcast(self, obj=None):
        if self.size == 1:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    def call(self, msg, local):
        """Rank 0: send msg to every rank, run local, gather every rank's answer."""
        self.broadcast(msg)
        return self.gather(local())


def follow(eng, regions, group):
    """A worker rank > 0: executes what rank 0 (the engine) sends."""
    while True:
        msg = group.broadcast()
        if msg[0] == "step":
            group.gather(eng.worker_step(msg[1]))
        elif msg[0] == "hash":
            group.gather(hashes(regions, msg[1]))
        elif msg[0] == "fill":
            group.gather(fill(regions, msg[1], msg[2] + 1000 * group.rank))
        else:
            return


class Engine:
    """One engine step as vLLM's scheduler and model runner make it, reduced to the connector calls."""

    def __init__(self, sched, worker, SchedulerOutput, KVConnectorOutput, hb, group):
        self.sched, self.worker, self.group = sched, worker, group
        self.counts = {}  # (kind, req_id) -> ranks that reported it (vLLM's KVOutputAggregator)
        self.SchedulerOutput, self.KVConnectorOutput = SchedulerOutput, KVConnectorOutput
        self.load_errors = set()
        self.expired = 0  # vLLM's own counter (NixlKVConnectorStats num_kv_expired_reqs, vllm:nixl_num_kv_expired_reqs)
        self.hb = hb
        self._hb_sent = 0
        cw = worker.connector_worker
        self._observe_timings(cw)
        # Count the heartbeats vLLM's worker sends (observation only: wraps its send_notif).
        if hasattr(cw, "_send_heartbeats"):
            wrapper = cw.nixl_wrapper
            orig = wrapper.send_notif

            def send_notif(agent, notif_msg, *a, **kw):
                m = notif_msg if isinstance(notif_msg, bytes) else str(notif_msg).encode()
                if m.startswith(b"HB:"):
                    self._hb_sent += 1
                return orig(agent, notif_msg, *a, **kw)

            wrapper.send_notif = send_notif

        # Count the leases vLLM's worker extends on a heartbeat (observation only: wraps its handler; vLLM
        # logs this at debug level only).
        if hasattr(cw, "_handle_heartbeat"):
            handle = cw._handle_heartbeat

            def handle_heartbeat(payload, *a, **kw):
                hb.received += 1
                before = dict(cw._reqs_to_send)
                out = handle(payload, *a, **kw)
                hb.extended += sum(1 for r, t in cw._reqs_to_send.items() if r in before and t > before[r])
                return out

            cw._handle_heartbeat = handle_heartbeat

    def _observe_timings(self, cw):
        """Times vLLM's handshakes and READs (observation only: wraps its _nixl_handshake and its NIXL wrapper's
        transfer and check_xfer_state), for the side-by-side comparison (connector/vllm_sidebyside_test.go)."""
        self._hs = []  # seconds of each handshake
        self._posts = []  # (time, handle) of each READ posted
        self._done = {}  # handle -> time its state was first seen DONE
        if hasattr(cw, "_nixl_handshake"):
            handshake = cw._nixl_handshake

            def timed_handshake(*a, **kw):
                t = time.perf_counter()
                try:
                    return handshake(*a, **kw)
                finally:
                    self._hs.append(time.perf_counter() - t)

            cw._nixl_handshake = timed_handshake
        w = cw.nixl_wrapper
        transfer, check = w.transfer, w.check_xfer_state

        def timed_transfer(handle, *a, **kw):
            self._posts.append((time.perf_counter(), handle))
            return transfer(handle, *a, **kw)

        def timed_check(handle, *a, **kw):
            st = check(handle, *a, **kw)
            if st == "DONE" and handle not in self._done:
                self._done[handle] = time.perf_counter()
            return st

        w.transfer, w.check_xfer_state = timed_transfer, timed_check

    def take_timings(self, since):
        """The handshakes and READs since the last call: handshake_s (their sum), read_s (first post to the
        last completion seen), xfers (READ requests posted)."""
        posts = [(t, h) for t, h in self._posts if t >= since]
        read_s = 0.0
        if posts and all(h in self._done for _, h in posts):
            read_s = max(self._done[h] for _, h in posts) - min(t for t, _ in posts)
        out = {"handshake_s": round(sum(self._hs), 6), "read_s": round(read_s, 6), "xfers": len(posts)}
        self._hs, self._posts, self._done = [], [], {}
        return out

    def heartbeats_sent(self):
        return self._hb_sent

    def worker_step(self, meta):
        """What each worker does in a step (the model runner's KV connector calls)."""
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self.worker.wait_for_save()
        sending, recving = self.worker.get_finished(set())
        self.worker.clear_connector_metadata()
        sending, recving = set(sending or ()), set(recving or ())
        failed = set()
        cw = self.worker.connector_worker
        if hasattr(cw, "_recv_failures"):
            failed = set(cw._recv_failures) & recving
        errs = self.worker.get_block_ids_with_load_errors()
        stats = self.worker.get_kv_connector_stats()  # the engine collects (and resets) them every step
        expired = len(stats.data.get("num_kv_expired_reqs", ())) if stats is not None else 0
        return sending, recving, failed, set(errs or ()), expired

    def step(self):
        meta = self.sched.build_connector_meta(self.SchedulerOutput.make_empty())
        outs = self.group.call(("step", meta), lambda: self.worker_step(meta))
        done = {"s": set(), "r": set()}
        failed = set()
        for sending, recving, f, errs, expired in outs:
            self.load_errors |= errs
            self.expired += expired
            failed |= f
            for kind, ids in (("s", sending), ("r", recving)):
                for rid in ids:  # finished once every rank reported it
                    n = self.counts.get((kind, rid), 0) + 1
                    if n >= self.group.size:
                        self.counts.pop((kind, rid), None)
                        done[kind].add(rid)
                    else:
                        self.counts[(kind, rid)] = n
        sending, recving = done["s"], done["r"]
        if hasattr(self.sched, "update_connector_output"):
            self.sched.update_connector_output(self.KVConnectorOutput(finished_sending=sending, finished_recving=recving))
        return sending, recving, failed


def resolve_layout(vllm_config, spec, num_layers):
    """What the engine core does before planning the KV cache (0.29+): resolve one kv cache layout from what
    the workers' attention backends support and the connector prefers, and record it on the workers."""
    try:
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
        from vllm.v1.worker.worker_base import WorkerBase  # noqa: F401  (the RPCs below are its methods)
        import vllm.v1.worker.worker_base as wb
    except ImportError:
        return
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    supported = [layout.name for layout in wb.get_supported_kv_cache_layouts(get_current_attn_backends(vllm_config))]
    layout = resolve_kv_cache_layout(vllm_config, [supported], [spec] * num_layers)
    wb.record_kv_cache_layout(vllm_config.cache_config, layout.name)


def make_request(Request, SamplingParams, req_id, n, params):
    sp = SamplingParams(max_tokens=1)
    sp.extra_args = {"kv_transfer_params": params}
    kw = dict(request_id=req_id, prompt_token_ids=[7] * n, sampling_params=sp, pooling_params=None)
    try:
        req = Request(eos_token_id=None, **kw)
    except TypeError:
        req = Request(**kw)
    if req.kv_transfer_params is None:
        req.kv_transfer_params = params
    return req


def allocate(torch, vllm_config, kv_cache_config, worker, num_blocks):
    """The KV cache tensors the model runner would give register_kv_caches, and the NIXL regions' views
    (one tensor per region, block-major: region[b] is block b)."""
    try:
        from vllm.v1.worker.utils import allocate_kv_cache  # 0.29+: vLLM's own allocator
    except ImportError:
        allocate_kv_cache = None
    if allocate_kv_cache is not None:
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
        bs = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        kv = allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout, [bs])
    else:
        # What GPUModelRunner._allocate_kv_cache_tensors/_reshape_kv_cache_tensors do up to 0.28.
        kv = {}
        backend = worker.connector_worker.attn_backends[0] if hasattr(worker.connector_worker, "attn_backends") \
            else worker.connector_worker.attn_backend
        for t in kv_cache_config.kv_cache_tensors:
            raw = torch.zeros(t.size, dtype=torch.int8)
            group = kv_cache_config.kv_cache_groups[0]
            spec = group.kv_cache_spec
            shape = backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
            try:
                order = backend.get_kv_cache_stride_order()
            except (AttributeError, NotImplementedError):
                order = tuple(range(len(shape)))
            phys = tuple(shape[i] for i in order)
            inv = [order.index(i) for i in range(len(order))]
            view = raw.view(spec.dtype).view(phys).permute(*inv)
            for name in t.shared_by:
                kv[name] = view
    regions = []
    seen = set()
    for name in sorted(kv, key=_layer_index):
        t = kv[name]
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:  # [2, blocks, ...]: K and V regions
            regions += [t[0], t[1]]
        elif t.shape[0] == num_blocks:
            regions.append(t)
        else:
            raise RuntimeError(f"unexpected KV cache tensor shape {tuple(t.shape)} for {name}")
    return kv, regions


def _layer_index(name):
    parts = [p for p in name.split(".") if p.isdigit()]
    return (int(parts[0]) if parts else 0, name)


def block_view(region, b):
    """Block b of a region as a uint8 tensor view (contiguous in every layout the tier uses)."""
    v = region[b]
    if not v.is_contiguous():
        raise RuntimeError("block view is not contiguous")
    return v.view(-1).view(__import__("torch").uint8)


def block_bytes(region, b):
    return block_view(region, b).numpy().tobytes()


def fill(regions, blocks, seed):
    """Random bytes (seeded) into the blocks of every region."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    for r in regions:
        for b in blocks:
            v = block_view(r, b)
            v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, generator=gen))


def hashes(regions, blocks):
    """Per block (in token order): sha256 over the block's bytes in every region, region by region."""
    out = []
    for b in blocks:
        h = hashlib.sha256()
        for r in regions:
            h.update(block_bytes(r, b))
        out.append(h.hexdigest())
    return out


def _read_stdin(q):
    for line in sys.stdin:
        line = line.strip()
        if line:
            try:
                q.put(json.loads(line))
            except ValueError:
                emit(event="error", error=f"bad command line {line!r}")
    q.put({"cmd": "quit"})


def _rebind_on_eaddrinuse(cs):
    """vLLM's side-channel listener thread binds VLLM_NIXL_SIDE_CHANNEL_PORT, picked free before the imports;
    on a busy machine another program may have taken it since, and the thread then dies while vLLM waits for it
    forever (ready_event.wait() has no timeout). Wrap the thread's function (a static method, looked up on the
    instance; its last argument is the port in every supported release): on EADDRINUSE before the socket is
    ready, pick a fresh port, record it where vLLM reads it for kv_transfer_params and the ready event
    (side_channel_port), and bind again."""
    import errno
    import zmq
    listen = cs._nixl_handshake_listener

    def listener(*args):
        args = list(args)
        ready = args[1]
        for _ in range(20):
            try:
                return listen(*args)
            except zmq.ZMQError as e:
                if e.errno != errno.EADDRINUSE or ready.is_set():
                    raise
                logging.getLogger("gonixl").warning("side-channel port %s taken meanwhile; binding a fresh one", args[-1])
                args[-1] = cs.side_channel_port = _free_port()
        return listen(*args)

    cs._nixl_handshake_listener = listener


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:
        logging.getLogger("gonixl").exception("driver failed")
        emit(event="error", error=f"{type(e).__name__}: {e}")
        rc = 1
    _out.flush()
    os._exit(rc or 0)  # NIXL/UCX threads; libnl-route's exit-time crash (see bench_nixl_read.py)
