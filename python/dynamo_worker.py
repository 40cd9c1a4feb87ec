"""A thin NVIDIA Dynamo worker in front of a gonixl Go worker (prefill or decode).

Dynamo's frontend discovers this process, tokenizes, routes (KV-aware) and calls `generate` with token ids; the
worker forwards each request to the Go worker's OpenAI-shaped HTTP API (examples/internal/demo) and hands the
answer back. The Go worker does the real work: the prefill computes and holds the KV blocks and answers vLLM's
kv_transfer_params, the decode READs them over NIXL (vLLM's ZMQ side channel between the two Go workers) and
verifies them. Dynamo passes the prefill's `disaggregated_params` to the decode worker under the same request
id. They take the shape Dynamo's own vLLM workers use, {"kv_transfer_params": <vLLM's kv_transfer_params>}, so a
gonixl worker pairs with a Dynamo vLLM worker of the other role; the params inside go unchanged both ways.

Built on Dynamo's documented Python backend API (`dynamo.common.backend`, Dynamo 1.6): its Rust `Worker` owns
discovery registration, the request plane, cancellation monitoring, health canaries and graceful shutdown
(unregister, grace period, drain, `cleanup`). Uses only Dynamo's own dependencies (aiohttp, pyzmq, tokenizers).

KV-aware routing: a Go prefill worker with a prefix cache publishes vLLM-format KV events (BlockStored,
BlockRemoved, AllBlocksCleared) on a ZMQ PUB socket and reports its address in GET /version. The prefill role
declares it to Dynamo as a `ZmqSource` (Dynamo README, "KV Event Publishing"): Dynamo's Worker subscribes to
it and relays the events, under this worker's id, to the KV router, which then sends a prompt to the worker
that holds its longest cached prefix.

Subcommands:
  serve       the worker (--role prefill|decode --gonixl-url http://127.0.0.1:PORT --model-path DIR ...)
  make-model  write a tiny model folder the frontend can load (word-level tokenizer "w0".."w4095", chat
              template, a Qwen3-0.6B-shaped config.json): the demo moves KV, it runs no model
  broker      a ZMQ XSUB/XPUB forwarder on loopback for Dynamo's event plane, so that no publisher binds
              every interface (Dynamo's direct ZMQ mode binds 0.0.0.0); point DYN_ZMQ_BROKER_URL at it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import time
from typing import Any, Optional

log = logging.getLogger("gonixl.dynamo")

VOCAB = 4096  # words "w0".."w{VOCAB-1}" after the three special tokens
FIRST_WORD_ID = 3

# vLLM's kv_transfer_params that ask a prefill worker to keep the KV for a remote decode (vLLM's proxy sends
# the same); the Go prefill answers with the params the decode worker needs.
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def make_model(folder: str, context_length: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(VOCAB):
        vocab[f"w{i}"] = FIRST_WORD_ID + i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    files = {
        "tokenizer_config.json": {
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": context_length,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
        },
        # The KV shape the Go demo moves (Qwen/Qwen3-0.6B: 28 layers, 8 KV heads of 128, bf16).
        "config.json": {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024,
            "max_position_embeddings": context_length, "vocab_size": len(vocab), "bos_token_id": 1,
            "eos_token_id": 2, "torch_dtype": "bfloat16",
        },
    }
    for name, content in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f, indent=1)


def broker(xsub: str, xpub: str) -> None:
    import zmq

    ctx = zmq.Context.instance()
    front, back = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    front.bind(xsub)
    back.bind(xpub)
    print(f"READY xsub={front.getsockopt_string(zmq.LAST_ENDPOINT)} xpub={back.getsockopt_string(zmq.LAST_ENDPOINT)}",
          flush=True)
    try:
        zmq.proxy(front, back)
    except (KeyboardInterrupt, zmq.ContextTerminated):
        pass


class GonixlError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"gonixl worker: HTTP {status}: {message}")
        self.status = status


def _engine_cls():
    # Imported here so that make-model and broker run without Dynamo's runtime.
    from dynamo.common.backend import EngineConfig, LLMEngine, LlmRegistration, WorkerConfig
    from dynamo.common.backend.health_check import build_health_check_payload, is_probe
    from dynamo.common.backend.publisher import ZmqSource
    from dynamo.common.constants import DisaggregationMode
    from dynamo.llm import exceptions as dx

    class GonixlEngine(LLMEngine):
        def __init__(self, args: argparse.Namespace):
            self.args = args
            self.mode = DisaggregationMode(args.role)
            self.url = args.gonixl_url.rstrip("/")
            self.session = None
            self.inflight: dict[str, asyncio.Task] = {}
            self.record = open(args.record, "a", buffering=1) if args.record else None
            self.worker_id: Optional[int] = None
            self.kv_source: Optional[ZmqSource] = None

        @classmethod
        async def from_args(cls, argv=None):
            args = parse_serve(argv)
            engine = cls(args)
            cfg = WorkerConfig(
                namespace=args.namespace, component=args.component or ("prefill" if args.role == "prefill" else "backend"),
                endpoint="generate", model_name=args.model_path, served_model_name=args.model_name,
                endpoint_types="chat,completions", discovery_backend=args.discovery_backend,
                request_plane=args.request_plane, event_plane=args.event_plane,
                disaggregation_mode=engine.mode,
            )
            return engine, cfg

        async def start(self, worker_id: int) -> EngineConfig:
            import aiohttp

            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.args.timeout))
            async with self.session.get(self.url + "/version") as r:  # the Go worker must be up
                info = await r.json()
            self.worker_id = worker_id
            log.info("gonixl %s worker at %s speaks vLLM %s; Dynamo worker id %s", self.args.role, self.url, info["version"], worker_id)
            self.kv_source = self._kv_source(info)
            return EngineConfig(model=self.args.model_path, served_model_name=self.args.model_name,
                                llm=LlmRegistration(context_length=self.args.context_length,
                                                    kv_cache_block_size=self.args.kv_block_size,
                                                    total_kv_blocks=self.args.kv_blocks, max_num_seqs=self.args.max_seqs))

        def _kv_source(self, info: dict) -> Optional[ZmqSource]:
            """The Go prefill's KV-event stream as a ZmqSource: --kv-events-endpoint, or with "auto" the
            endpoint the Go worker reports in GET /version (none when it publishes no events). Dynamo's router
            hashes the event's token ids in blocks of the registered kv_cache_block_size, so the Go worker's
            block size must be the one registered here."""
            endpoint = self.args.kv_events_endpoint
            if endpoint == "auto":
                endpoint = (info.get("kv_events") or {}).get("endpoint") or "none"
            if endpoint == "none":
                return None
            if self.mode != DisaggregationMode.PREFILL:
                raise ValueError("--kv-events-endpoint: only a prefill worker's blocks are reused; the decode role publishes no KV events")
            block = info.get("block_size")
            if block is not None and int(block) != self.args.kv_block_size:
                raise ValueError(f"the Go worker's KV block size is {block}, --kv-block-size is {self.args.kv_block_size}:"
                                 " Dynamo's router would hash other blocks than the worker caches")
            topic = self.args.kv_events_topic
            if topic is None:
                topic = (info.get("kv_events") or {}).get("topic") or ""
            log.info("KV events of the gonixl prefill at %s: subscribing to %s (topic %r, block size %d)",
                     self.url, endpoint, topic, self.args.kv_block_size)
            return ZmqSource(endpoint=endpoint, topic=topic, dp_rank=0)

        async def kv_event_sources(self):
            return [self.kv_source] if self.kv_source is not None else []

        async def health_check_payload(self):
            return build_health_check_payload(bos_token_id=1)

        async def _post(self, body: dict, request_id: str) -> dict:
            async with self.session.post(self.url + "/v1/completions", json=body,
                                         headers={"X-Request-Id": request_id}) as r:
                data = await r.json(content_type=None)
                if r.status != 200:
                    raise GonixlError(r.status, data.get("message", str(data)) if isinstance(data, dict) else str(data))
                return data

        async def _forward(self, body: dict, context) -> dict:
            """POSTs to the Go worker and waits for the answer or for Dynamo to cancel the request (client gone,
            stop), whichever comes first; abort() cancels it too. Cancelling closes the connection, which
            cancels the Go request's context (the prefill stops staging, the decode stops its READ)."""
            request_id = context.id()
            task = asyncio.ensure_future(self._post(body, request_id))
            self.inflight[request_id] = task
            stopped = asyncio.ensure_future(context.async_killed_or_stopped())
            try:
                await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():
                    log.info("request %s cancelled by Dynamo: cancelling the gonixl call", request_id)
                    task.cancel()
                return await task
            except GonixlError as e:  # 4xx: the request (bad params, duplicate id); 503: out of KV blocks, stopping
                if e.status == 503:
                    raise dx.WorkerUnavailable(str(e))
                raise (dx.InvalidArgument if 400 <= e.status < 500 else dx.Unknown)(str(e))
            except asyncio.TimeoutError:
                raise dx.ConnectionTimeout(f"gonixl worker at {self.url} did not answer within {self.args.timeout}s")
            except OSError as e:  # aiohttp's connection errors derive from OSError
                raise dx.CannotConnect(f"gonixl worker at {self.url}: {e}")
            finally:
                stopped.cancel()
                self.inflight.pop(request_id, None)

        async def generate(self, request, context):
            rid = context.id()
            ids = [int(t) for t in request["token_ids"]]
            usage = lambda n: {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            if is_probe(request):  # the canary checks the Go worker, not a cross-worker transfer
                async with self.session.get(self.url + "/health") as r:
                    if r.status != 200:
                        raise dx.EngineShutdown(f"gonixl worker at {self.url} is unhealthy: HTTP {r.status}")
                yield {"token_ids": [ids[0]], "index": 0, "finish_reason": "length", "completion_usage": usage(1)}
                return
            t0 = time.monotonic()
            try:
                if self.mode == DisaggregationMode.PREFILL:
                    body = {"model": self.args.model_name, "prompt": ids, "max_tokens": 1, "stream": False,
                            "kv_transfer_params": PREFILL_PARAMS}
                    resp = await self._forward(body, context)
                    handoff = {"kv_transfer_params": resp["kv_transfer_params"]}
                    self._record(rid, ids, "emitted", handoff, resp, t0)
                    # The prefill's one token: the demo runs no model, so it echoes the prompt's last token.
                    yield {"token_ids": [ids[-1]], "index": 0, "finish_reason": "length", "completion_usage": usage(1),
                           "disaggregated_params": handoff}
                    return
                handoff = (request.get("prefill_result") or {}).get("disaggregated_params") or {}
                params = handoff.get("kv_transfer_params")
                if not isinstance(params, dict):
                    raise dx.InvalidArgument("decode worker got no prefill_result.disaggregated_params.kv_transfer_params:"
                                             " the frontend routes through a prefill worker only once one is registered")
                max_new = int((request.get("stop_conditions") or {}).get("max_tokens") or 16)
                body = {"model": self.args.model_name, "prompt": ids, "max_tokens": max_new, "stream": False,
                        "kv_transfer_params": params}
                resp = await self._forward(body, context)
                self._record(rid, ids, "received", handoff, resp, t0)
            except asyncio.CancelledError:
                if not context.is_stopped() and not context.is_killed():
                    raise
                yield {"token_ids": [], "index": 0, "finish_reason": "cancelled", "completion_usage": usage(0)}
                return
            # The KV arrived and was verified byte for byte by the Go decode worker. It runs no model: its
            # "generation" echoes the prompt's words, one token per chunk, so that streaming and the frontend's
            # detokenizer see real tokens.
            for i in range(max_new):
                if context.is_stopped():
                    yield {"token_ids": [], "index": 0, "finish_reason": "cancelled", "completion_usage": usage(i)}
                    return
                chunk: dict[str, Any] = {"token_ids": [ids[i % len(ids)]], "index": 0}
                if i == max_new - 1:
                    chunk.update(finish_reason="length", completion_usage=usage(max_new))
                yield chunk
                await asyncio.sleep(0)

        def _record(self, rid, ids, key, params, resp, t0):
            if self.record is None:
                return
            self.record.write(json.dumps({"role": self.args.role, "worker": self.args.name or self.url,
                                         "dynamo_worker_id": self.worker_id, "request_id": rid,
                                         "prompt_tokens": len(ids), key: params, "gonixl": resp.get("gonixl"),
                                         "ms": round((time.monotonic() - t0) * 1000, 3)}) + "\n")

        async def abort(self, context):
            task = self.inflight.get(context.id())
            if task is not None:
                log.info("request %s aborted: cancelling the gonixl call", context.id())
                task.cancel()

        async def is_quiescent(self) -> Optional[bool]:
            """Drain (prefill): quiescent once the Go prefill holds no KV blocks for decode peers."""
            try:
                async with self.session.get(self.url + "/metrics") as r:
                    m = re.search(r"^gonixl_blocks_held (\d+)$", await r.text(), re.M)
                    return m is not None and int(m.group(1)) == 0
            except Exception:
                return True  # the Go worker is gone: nothing left to drain

        async def cleanup(self):
            for t in list(self.inflight.values()):
                t.cancel()
            if self.session is not None:
                await self.session.close()
                self.session = None
            if self.record is not None:
                self.record.close()
                self.record = None

    return GonixlEngine


def parse_serve(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dynamo_worker.py serve")
    p.add_argument("--role", choices=["prefill", "decode"], required=True)
    p.add_argument("--gonixl-url", required=True, help="base URL of the Go worker (examples/prefill or examples/decode)")
    p.add_argument("--model-path", required=True, help="model folder (tokenizer, config) the frontend loads")
    p.add_argument("--model-name", default="gonixl-demo", help="served model name")
    p.add_argument("--namespace", default="dynamo")
    p.add_argument("--component", default="", help="default: prefill for the prefill role, backend for decode")
    env = os.environ.get
    p.add_argument("--discovery-backend", default=env("DYN_DISCOVERY_BACKEND", "file"),
                   help="file (one host, $DYN_FILE_KV), etcd or kubernetes (default $DYN_DISCOVERY_BACKEND or file)")
    p.add_argument("--request-plane", default=env("DYN_REQUEST_PLANE", "tcp"))
    p.add_argument("--event-plane", default=env("DYN_EVENT_PLANE", "zmq"))
    p.add_argument("--context-length", type=int, default=3072)
    p.add_argument("--kv-blocks", type=int, default=640, help="the Go worker's -num-blocks")
    p.add_argument("--kv-block-size", type=int, default=16, help="tokens per KV block (vLLM's block_size)")
    p.add_argument("--max-seqs", type=int, default=4)
    p.add_argument("--timeout", type=float, default=120, help="bound on one call to the Go worker (seconds)")
    p.add_argument("--record", default="", help="append one JSON line per request (params, gonixl timings) here")
    p.add_argument("--name", default="", help="this worker's name in its --record lines (default: --gonixl-url)")
    p.add_argument("--kv-events-endpoint", default="auto",
                   help="prefill: the Go worker's KV-events PUB socket (tcp://127.0.0.1:PORT), declared to Dynamo as a"
                        " ZmqSource for KV-aware routing; auto: the one its GET /version reports (none if it"
                        " publishes none); none: no KV events")
    p.add_argument("--kv-events-topic", default=None, help="ZMQ topic to subscribe to (default: the Go worker's, else all)")
    return p.parse_args(argv)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "make-model", "broker"):
        sys.exit(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "make-model":
        p = argparse.ArgumentParser(prog="dynamo_worker.py make-model")
        p.add_argument("folder")
        p.add_argument("--context-length", type=int, default=3072)
        a = p.parse_args(argv)
        make_model(a.folder, a.context_length)
    elif cmd == "broker":
        p = argparse.ArgumentParser(prog="dynamo_worker.py broker")
        p.add_argument("--xsub", default="tcp://127.0.0.1:*")
        p.add_argument("--xpub", default="tcp://127.0.0.1:*")
        a = p.parse_args(argv)
        broker(a.xsub, a.xpub)
    else:
        from dynamo.common.backend.run import run

        run(_engine_cls(), argv)


if __name__ == "__main__":
    main()
