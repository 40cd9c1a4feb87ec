"""canon: a decoded vLLM KV-event value as JSON (bytes as {"bytes": hex}, structs as dicts with their type);
shared by vllm_oracle.py and kv_events_sub.py, which Python finds here (the script's folder is on sys.path)."""
import msgspec


def canon(v):
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, (list, tuple)):
        return [canon(x) for x in v]
    if isinstance(v, msgspec.Struct):
        d = {"type": type(v).__name__}
        for f in v.__struct_fields__:
            d[f] = canon(getattr(v, f))
        return d
    return v
