"""Load vLLM's own NixlConnector wire definitions from a vLLM wheel, without importing vllm (which needs torch).

The wheel is opened as a zip; the module that defines NixlAgentMetadata is parsed with `ast`, and only these
top-level definitions are executed, unchanged, in a stub namespace:

  NixlAgentMetadata, NixlHandshakePayload            (the msgspec-encoded dataclasses)
  compute_nixl_compatibility_hash                    (+ _get_speculative_compatibility_factors where present)
  NIXL_CONNECTOR_VERSION, GET_META_MSG
  vllm/config/utils.py: hash_factors                 (sha256 over json.dumps(sort_keys=True))
  vllm/_version.py: __version__
  _nixl_handshake_listener (the prefill-side listener, a staticmethod of the scheduler class), zmq_ctx and
  vllm/utils/network_utils.py: make_zmq_path; make_zmq_socket is stubbed (socket options are not protocol)

So the field order, defaults and hash factors are vLLM's, read at generation time; nothing is copied into
this repository. Used by gen_vectors.py and the interop tests' Python peers.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import types
import typing
import zipfile
from pathlib import Path

METADATA_MODULES = [
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py",  # 0.20+ package layout
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py",  # single-module layout
]
WANTED = {
    "NixlAgentMetadata",
    "NixlHandshakePayload",
    "compute_nixl_compatibility_hash",
    "_get_speculative_compatibility_factors",
    "NIXL_CONNECTOR_VERSION",
    "GET_META_MSG",
}


def wheel_dirs() -> list[Path]:
    env = os.environ.get("VLLM_WHEEL_DIR", "")
    dirs = [Path(p) for p in env.split(os.pathsep) if p]
    dirs.append(Path.home() / ".cache" / "gonixl" / "vllm-wheels")
    return dirs


def find_wheel(version: str, download: bool = True) -> Path:
    """Return the path of vllm-<version>-*.whl, downloading it with pip (no deps) if allowed."""
    for d in wheel_dirs():
        for w in sorted(d.glob(f"vllm-{version}-*.whl")) if d.is_dir() else []:
            return w
    if not download:
        raise FileNotFoundError(f"vllm {version} wheel not found in {wheel_dirs()}; set VLLM_WHEEL_DIR")
    dest = wheel_dirs()[-1]
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         f"vllm=={version}", "-d", str(dest)],
        check=True,
    )
    return find_wheel(version, download=False)


def _top_level(src: str, names: set[str]) -> list[ast.stmt]:
    out = []
    for node in ast.parse(src).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names:
            out.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                out.append(node)
    return out


class Defs:
    """vLLM's wire definitions of one release."""

    def __init__(self, version: str, wheel: Path | None = None):
        self.wheel = wheel or find_wheel(version)
        with zipfile.ZipFile(self.wheel) as z:
            names = set(z.namelist())
            self.module_path = next(m for m in METADATA_MODULES if m in names)
            src = z.read(self.module_path).decode()
            utils_src = z.read("vllm/config/utils.py").decode()
            version_src = z.read("vllm/_version.py").decode()
        ns: dict = {}
        exec(compile(ast.Module(_top_level(version_src, {"__version__"}) or [], []), "_version", "exec", dont_inherit=True), ns)
        self.version = ns.get("__version__", version)
        assert self.version == version, (self.version, version)

        # Stub modules for the function-local imports of compute_nixl_compatibility_hash.
        self._utils = types.ModuleType("vllm.config.utils")
        self._utils.__dict__.update(hashlib=hashlib, json=json)
        exec(compile(ast.Module(_top_level(utils_src, {"hash_factors"}), []), "vllm/config/utils.py", "exec", dont_inherit=True),
             self._utils.__dict__)

        mod = types.ModuleType(f"gonixl_vllm_defs_{version.replace('.', '_')}")

        class KVConnectorHandshakeMetadata:  # an empty ABC in vLLM
            pass

        mod.__dict__.update(
            dataclass=dataclasses.dataclass, field=dataclasses.field, Any=typing.Any,
            KVConnectorHandshakeMetadata=KVConnectorHandshakeMetadata, VllmConfig=typing.Any,
            BlockIds=typing.Any, EngineId=str, ReqId=str, logger=logging.getLogger("vllm_defs"),
        )
        sys.modules[mod.__name__] = mod
        nodes = _top_level(src, WANTED)
        exec(compile(ast.Module(nodes, []), self.module_path, "exec", dont_inherit=True), mod.__dict__)
        self.mod = mod
        self.NixlAgentMetadata = mod.NixlAgentMetadata
        self.NixlHandshakePayload = mod.NixlHandshakePayload
        self.connector_version = mod.NIXL_CONNECTOR_VERSION
        self.get_meta_msg = mod.GET_META_MSG

    def fields(self) -> list[dataclasses.Field]:
        return list(dataclasses.fields(self.NixlAgentMetadata))

    def compat_hash(self, vllm_config, attn_backend_name: str, vllm_version: str | None = None, **kw) -> str:
        """Run vLLM's compute_nixl_compatibility_hash with stub modules for its local imports."""
        import inspect

        fake_vllm = types.ModuleType("vllm")
        fake_vllm.__version__ = vllm_version or self.version
        fake_config = types.ModuleType("vllm.config")
        fake_config.utils = self._utils
        saved = {k: sys.modules.get(k) for k in ("vllm", "vllm.config", "vllm.config.utils")}
        sys.modules.update({"vllm": fake_vllm, "vllm.config": fake_config, "vllm.config.utils": self._utils})
        try:
            fn = self.mod.compute_nixl_compatibility_hash
            params = inspect.signature(fn).parameters
            args = {k: v for k, v in kw.items() if k in params}
            return fn(vllm_config, attn_backend_name, **args)
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v

    def factor_json(self, vllm_config, attn_backend_name: str, vllm_version: str | None = None, **kw) -> str:
        """The json.dumps text that compat_hash hashes (captured by wrapping hash_factors)."""
        captured = {}
        orig = self._utils.hash_factors

        def spy(items):
            captured["json"] = json.dumps(items, sort_keys=True)
            return orig(items)

        self._utils.hash_factors = spy
        try:
            h = self.compat_hash(vllm_config, attn_backend_name, vllm_version, **kw)
        finally:
            self._utils.hash_factors = orig
        assert hashlib.sha256(captured["json"].encode()).hexdigest() == h
        return captured["json"]


def profiles() -> dict[str, dict]:
    """gonixl's profiles as the committed vectors describe them (testdata/vllm/<release>/vectors.json):
    profile name -> {"release": the oldest release with vectors, "framing", "block_ids_flat", "notif", "leases",
    "layout", "params_keys"}. The Python peers take their per-profile behaviour from here, not from code."""
    out: dict[str, dict] = {}
    root = Path(__file__).resolve().parent.parent / "testdata" / "vllm"

    def key(p: Path):
        return tuple(int(x) for x in p.parent.name.split("."))

    for f in sorted(root.glob("*/vectors.json"), key=key):
        v = json.loads(f.read_text())
        if v["profile"] not in out and "wire" in v:
            out[v["profile"]] = {"release": v["vllm_version"], **v["wire"]}
    return out


def wire_facts(defs: "Defs") -> dict:
    """Protocol facts read from the release's own connector source with `ast` (nothing executed):

      framing:     "H2" when _nixl_handshake_listener decodes (msg, tp_rank), "H3" for (msg, pp_rank, tp_rank),
                   "H4" when it also sends msgpack(time.perf_counter()) as a second reply frame
      params_keys: the keyword order of the dict(...) that the pull-mode request_finished returns as
                   kv_transfer_params
      leases:      whether P's notification handling knows "HB:" heartbeats
                   then the keys vllm/v1/core/sched/scheduler.py adds to it (kv_transfer_params["..."] = ...,
                   0.31+: remote_prefill_cached_tokens), in that order
      layout:      FLASH_ATTN get_kv_cache_shape: "A" (2, nb, ...), "B" (nb, 2, ...), "C" (nb, H, bs, 2*D);
                   None where the shape is not defined there (0.29+: vllm/v1/kv_cache_layout.py)
      layout_names: the kv_cache_layout names the release knows: KVCacheLayout's members
                   (vllm/v1/kv_cache_layout.py, 0.29+) or KVCacheLayoutType's Literal (v1/attention/backends/utils.py)
      required_layout: the string NixlConnector.get_required_kvcache_layout returns (what vLLM publishes)
      layout_expr: the expression the worker assigns to self.kv_cache_layout
      hma_default: is_hma_enabled for an ordinary model with NixlConnector and no HMA flag: VllmConfig keeps the
                   hybrid KV cache manager on only where it asks the connector (supports_hma / supports_hma_config,
                   vllm/config/vllm.py) and NixlConnector subclasses SupportsHMA; before that (0.18-0.21) any
                   --kv-transfer-config turns it off
    """
    base = "vllm/distributed/kv_transfer/kv_connector/v1/"
    order = [base + "nixl/pull_scheduler.py", base + "nixl/scheduler.py", base + "nixl/base_scheduler.py",
             base + "nixl_connector.py"]
    out: dict = {"framing": None, "params_keys": None, "leases": False, "layout": None, "layout_names": None,
                 "required_layout": None, "layout_expr": None, "hma_default": None}
    with zipfile.ZipFile(defs.wheel) as z:
        names = set(z.namelist())
        conn = [n for n in sorted(names) if n.startswith(base + "nixl") and n.endswith(".py")]
        srcs = {n: z.read(n).decode() for n in conn}
        fa = "vllm/v1/attention/backends/flash_attn.py"
        fa_src = z.read(fa).decode() if fa in names else ""

        def read(n):
            return z.read(n).decode() if n in names else ""

        sched_src = read("vllm/v1/core/sched/scheduler.py")
        config_src = read("vllm/config/vllm.py")
        enum_src = read("vllm/v1/kv_cache_layout.py")
        utils_src = read("vllm/v1/attention/backends/utils.py")
    if enum_src:
        for node in ast.walk(ast.parse(enum_src)):
            if isinstance(node, ast.ClassDef) and node.name == "KVCacheLayout":
                out["layout_names"] = [t.id for st in node.body if isinstance(st, ast.Assign)
                                       for t in st.targets if isinstance(t, ast.Name)]
    elif utils_src:
        for node in ast.parse(utils_src).body:
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KVCacheLayoutType" for t in node.targets)
                    and isinstance(node.value, ast.Subscript)):
                sl = node.value.slice
                out["layout_names"] = [e.value for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl])]
    for src in srcs.values():
        for fn in ast.walk(ast.parse(src)):
            if isinstance(fn, ast.FunctionDef) and fn.name == "get_required_kvcache_layout":
                rets = [r.value.value for r in ast.walk(fn) if isinstance(r, ast.Return)
                        and isinstance(r.value, ast.Constant) and isinstance(r.value.value, str)]
                out["required_layout"] = rets[-1] if rets else None
            if isinstance(fn, ast.Assign) and ast.unparse(fn.targets[0]) == "self.kv_cache_layout":
                out["layout_expr"] = ast.unparse(fn.value)
    # NixlConnector itself up to 0.25; from 0.26 NixlBaseConnector, which the pull/push connectors subclass.
    nixl_hma = any(isinstance(n, ast.ClassDef) and n.name in ("NixlConnector", "NixlBaseConnector")
                   and any(ast.unparse(b) == "SupportsHMA" for b in n.bases)
                   for src in srcs.values() for n in ast.walk(ast.parse(src)))
    out["hma_default"] = nixl_hma and ("supports_hma" in config_src)
    sched_keys = []
    for node in ast.walk(ast.parse(sched_src)) if sched_src else []:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                and ast.unparse(node.targets[0].value) == "kv_transfer_params"
                and isinstance(node.targets[0].slice, ast.Constant)):
            sched_keys.append(node.targets[0].slice.value)
    out["leases"] = any('"HB:"' in s for s in srcs.values())
    for path in order:
        if path not in srcs:
            continue
        tree = ast.parse(srcs[path])
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == "_nixl_handshake_listener" and out["framing"] is None:
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                            and ast.unparse(node.value.func) == "msgspec.msgpack.decode"
                            and isinstance(node.targets[0], ast.Tuple)):
                        out["framing"] = {2: "H2", 3: "H3"}[len(node.targets[0].elts)]
                if out["framing"] == "H3" and "time.perf_counter()" in ast.unparse(fn):
                    out["framing"] = "H4"
            if isinstance(fn, ast.FunctionDef) and fn.name == "request_finished" and out["params_keys"] is None:
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
                        keys = [k.arg for k in node.keywords]
                        if "remote_engine_id" in keys:
                            out["params_keys"] = keys
    if out["params_keys"] is not None:
        out["params_keys"] = out["params_keys"] + [k for k in sched_keys if k not in out["params_keys"]]
    for node in ast.walk(ast.parse(fa_src)) if fa_src else []:
        if isinstance(node, ast.FunctionDef) and node.name == "get_kv_cache_shape":
            for r in ast.walk(node):
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple):
                    e = [ast.unparse(x) for x in r.value.elts]
                    if e[:2] == ["2", "num_blocks"]:
                        out["layout"] = "A"
                    elif e[:2] == ["num_blocks", "2"]:
                        out["layout"] = "B"
                    elif e[0] == "num_blocks" and e[-1] == "2 * head_size":
                        out["layout"] = "C"
    return out


def _find_method(src: str, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    item.decorator_list = []  # @staticmethod
                    return item
    return None


def load_listener(defs: Defs):
    """vLLM's own _nixl_handshake_listener of this release, runnable with pyzmq and msgspec only."""
    import contextlib
    import time

    import msgspec
    import zmq

    with zipfile.ZipFile(defs.wheel) as z:
        names = set(z.namelist())
        candidates = [
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py",
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py",
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py",
        ]
        listener = ctx_fn = None
        for path in candidates:
            if path in names:
                src = z.read(path).decode()
                listener = listener or _find_method(src, "_nixl_handshake_listener")
        for path in ["vllm/distributed/kv_transfer/kv_connector/v1/nixl/utils.py",
                     "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py"]:
            if path in names and ctx_fn is None:
                nodes = _top_level(z.read(path).decode(), {"zmq_ctx"})
                ctx_fn = nodes[0] if nodes else None
        net = _top_level(z.read("vllm/utils/network_utils.py").decode(), {"make_zmq_path", "is_valid_ipv6_address"})
    if listener is None or ctx_fn is None:
        raise RuntimeError(f"no _nixl_handshake_listener/zmq_ctx in {defs.wheel.name}")

    def make_zmq_socket(ctx, path, socket_type, bind=None, **_):  # stub: no HWM/buffer tuning
        sock = ctx.socket(socket_type)
        if path.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        (sock.bind if bind else sock.connect)(path)
        return sock

    ns = dict(contextlib=contextlib, Iterator=typing.Iterator, Any=typing.Any, zmq=zmq, msgspec=msgspec, time=time,
              threading=__import__("threading"), ipaddress=__import__("ipaddress"),
              make_zmq_socket=make_zmq_socket, GET_META_MSG=defs.get_meta_msg,
              logger=logging.getLogger("vllm_listener"),
              envs=types.SimpleNamespace(VLLM_NIXL_SIDE_CHANNEL_HOST=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST",
                                                                                    "localhost")))
    exec(compile(ast.Module(net + [ctx_fn, listener], []), defs.module_path, "exec", dont_inherit=True), ns)
    return ns["_nixl_handshake_listener"]
