"""vLLM platform plugin: vLLM's own CpuPlatform when VLLM_TARGET_DEVICE=cpu, else not activated."""
import os


def cpu_platform():
    if os.environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu":
        return "vllm.platforms.cpu.CpuPlatform"
    return None
