#!/usr/bin/env python3
"""Record what vLLM's own NixlConnector emits, for gonixl's vector tests: testdata/vllm/<release>/real.json.

gen_vectors.py encodes fixed values with vLLM's classes loaded from the wheel; this records the real thing. It
runs vLLM's scheduler-side and worker-side NixlConnector on vLLM's CPU platform with the real NIXL wheel, through
the real-vLLM tier's driver (python/vllm_real_driver.py, in the release's venv ~/.cache/gonixl/venvs/vllm-<v>),
with Qwen3-0.6B's geometry (a config.json, no weights) and block size 32, and records:

  handshake: the side channel's reply to the row's get_meta_msg request (vLLM's scheduler serves the
             NixlHandshakePayload its worker built: compatibility hash + msgpack(NixlAgentMetadata), with the
             worker's kv_cache_layout, block_lens, attn_backend_name, ...), and the H4 clock frame's presence
  compat_hash, attn_backend_name, kv_cache_layout: what the worker computed / detected
  kv_transfer_params: request_finished's dict for a 70-token prefill, json.dumps'd (as vLLM's API returns it;
             the scheduler's own additions such as remote_prefill_cached_tokens are not part of it)
  model:     the hash inputs of the model side (model path string as given, dtype, KV heads, head size, layers)
  notification: the NIXL notification vLLM's decode worker sends after READing a request, as a NIXL agent on
             the prefill side receives it: vLLM's decode (the driver, --role decode) pulls from the interop
             tests' Python prefill peer (python/vllm_prefill_peer.py, which only serves blocks and collects
             notifications), so the bytes are vLLM's

Usage: python/gen_vectors_real.py [--driver PATH] 0.33.0 [0.16.0 ...]   (the repo's venv python: msgspec, pyzmq)
Releases whose venv is missing are skipped with a message; the agent metadata blob differs on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import zmq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "testdata" / "vllm"
VENVS = Path(os.environ.get("GONIXL_VLLM_VENVS", Path.home() / ".cache" / "gonixl" / "venvs"))
MODEL_DIR = Path("/tmp/gonixl-vectors/Qwen3-0.6B")  # hashed as given: keep it fixed
# Qwen3-0.6B's architecture (public config.json values); no weights are needed.
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "torch_dtype": "bfloat16", "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
BLOCK_SIZE = 32  # CPU_ATTN needs a multiple of 32
TOKENS = 70


def framing(release: str) -> str:
    v = json.loads((OUT / release / "vectors.json").read_text())
    return v["wire"]["framing"]


def record(release: str, driver: Path, timeout: float) -> dict | None:
    py = VENVS / f"vllm-{release}" / "bin" / "python"
    if not py.exists():
        print(f"vllm {release}: no venv at {py.parent.parent}; skipped", file=sys.stderr)
        return None
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    (MODEL_DIR / "config.json").write_text(json.dumps(QWEN3_06B, indent=1))
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.Popen([str(py), str(driver), "--role", "prefill", "--model", str(MODEL_DIR),
                             "--block-size", str(BLOCK_SIZE), "--num-blocks", "16",
                             "--engine-id", f"vllm-{release}-vectors"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    events: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [events.put(json.loads(line)) for line in proc.stdout], daemon=True).start()

    def wait(kind: str) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                e = events.get(timeout=1)
            except queue.Empty:
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm {release}: the driver exited with {proc.returncode}")
                continue
            if e.get("event") == "error":
                raise RuntimeError(f"vllm {release}: {e['error']}")
            if e.get("event") == kind:
                return e
        raise TimeoutError(f"vllm {release}: no {kind!r} event in {timeout} s")

    try:
        ready = wait("ready")
        # The handshake, as vLLM's decode side asks for it (the row's framing).
        ctx = zmq.Context()
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.RCVTIMEO, 10000)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{ready['port']}")
        fr = framing(release)
        req = (b"get_meta_msg", 0) if fr == "H2" else (b"get_meta_msg", 0, 0)
        sock.send(msgspec.msgpack.encode(req))
        frames = sock.recv_multipart()
        sock.close()
        ctx.term()
        proc.stdin.write(json.dumps({"cmd": "prefill", "req_id": "cmpl-vectors-0", "num_tokens": TOKENS, "seed": 7}) + "\n")
        proc.stdin.flush()
        params = wait("params")
        proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        proc.stdin.flush()
    finally:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "comment": "Recorded from vLLM's own NixlConnector by python/gen_vectors_real.py; do not edit.",
        "vllm_version": ready["version"],
        "source": "vLLM scheduler + worker NixlConnector, CPU platform, real NIXL (python/vllm_real_driver.py)",
        "platform": "cpu",
        "model": {"model": str(MODEL_DIR), "dtype": "torch.bfloat16", "num_kv_heads": QWEN3_06B["num_key_value_heads"],
                  "head_size": QWEN3_06B["head_dim"], "num_hidden_layers": QWEN3_06B["num_hidden_layers"],
                  "block_size": BLOCK_SIZE},
        "engine_id": ready["engine_id"],
        "compat_hash": ready["compat_hash"],
        "attn_backend_name": ready["backend"],
        "kv_cache_layout": ready["kv_cache_layout"],
        "num_regions": ready["num_regions"],
        "block_len": ready["block_len"],
        "handshake": {"framing": fr, "frames": len(frames), "payload_hex": frames[0].hex()},
        "kv_transfer_params": json.dumps(params["kv_transfer_params"]),
        "tokens": TOKENS,
    }


def record_notification(release: str, driver: Path, timeout: float) -> dict | None:
    """vLLM's decode worker READs one request from the Python prefill peer; returns the notification it sent."""
    py = VENVS / f"vllm-{release}" / "bin" / "python"
    if not py.exists():
        return None
    profile = json.loads((OUT / release / "vectors.json").read_text())["profile"]
    rid = "cmpl-vectors-1"
    peer = subprocess.Popen([sys.executable, str(HERE / "vllm_prefill_peer.py"), "--profile", profile,
                             "--layers", str(QWEN3_06B["num_hidden_layers"]), "--heads", str(QWEN3_06B["num_key_value_heads"]),
                             "--head-dim", str(QWEN3_06B["head_dim"]), "--block-size", str(BLOCK_SIZE),
                             "--model", str(MODEL_DIR), "--attn", "CPU_ATTN", "--tokens", str(TOKENS), "--seed", "3",
                             "--num-blocks", "16", "--request-id", rid, "--timeout", str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(json.loads(x)) for x in peer.stdout if x.startswith("{")],
                     daemon=True).start()
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    dec = None
    try:
        first = lines.get(timeout=120)
        dec = subprocess.Popen([str(py), str(driver), "--role", "decode", "--model", str(MODEL_DIR),
                                "--block-size", str(BLOCK_SIZE), "--num-blocks", "16"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                               env=env)
        dec.stdin.write(json.dumps({"cmd": "pull", "req_id": "d-vectors-1", "num_tokens": TOKENS,
                                    "kv_transfer_params": first["kv_transfer_params"]}) + "\n")
        dec.stdin.flush()
        done = lines.get(timeout=timeout + 30)
    finally:
        if dec is not None:
            try:
                dec.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                dec.stdin.flush()
                dec.wait(timeout=60)
            except Exception:
                dec.kill()
        try:
            peer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            peer.kill()
    if not done.get("notified"):
        raise RuntimeError(f"vllm {release}: the decode worker sent no notification ({done})")
    return {"text": done["msg"], "hex": done["msg"].encode().hex(), "request_id": rid, "heartbeats": done["heartbeats"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("releases", nargs="+")
    ap.add_argument("--driver", default=str(HERE / "vllm_real_driver.py"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--no-notifications", dest="notifications", action="store_false",
                    help="skip the decode-side run (vLLM's decode worker reading from the Python prefill peer)")
    args = ap.parse_args()
    rc = 0
    for release in args.releases:
        try:
            doc = record(release, Path(args.driver), args.timeout)
        except Exception as e:  # report, keep going
            print(f"vllm {release}: {e}", file=sys.stderr)
            rc = 1
            continue
        if doc is None:
            continue
        if args.notifications:
            try:
                doc["notification"] = record_notification(release, Path(args.driver), args.timeout)
            except Exception as e:
                print(f"vllm {release}: notification: {e}", file=sys.stderr)
                rc = 1
                continue
        path = OUT / release / "real.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
