"""The warm-start key of a vLLM engine (core/warm_state.py): what its
learned step costs and acceptance are valid for.

Step costs depend on the machine and on how the engine runs the models
(device, parallelism, dtype, graphs, versions); acceptance on the model
pair and the method. A change in any of them is another key, so another
file: a server never starts from what another configuration learned.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
from pathlib import Path
from typing import Any

from vllm_vspec.core.warm_state import WarmKey

# The distributions that install vLLM-Ascend (the overlay wheel, or stock).
ASCEND_DISTRIBUTIONS = ("vllm-ascend-vspec", "vllm-ascend", "vllm_ascend")


def _versions() -> dict[str, str]:
    """vLLM's and torch's versions, and vLLM-Ascend's where installed."""
    import torch

    from vllm_vspec.hosts.vllm import releases

    found = releases.installed()
    out = {"vllm": "-" if found is None else found[1], "torch": str(torch.__version__)}
    ascend = [d for d in md.distributions() if d.metadata["Name"] in ASCEND_DISTRIBUTIONS]
    if ascend:
        out["vllm_ascend"] = ascend[0].version
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device_name(device_type: str) -> str:
    """The accelerator's name, where asking does not start a device context
    in this (scheduler) process: CUDA's through NVML; elsewhere the type."""
    if device_type != "cuda":
        return device_type
    try:
        from vllm.platforms import current_platform

        return current_platform.get_device_name()
    except Exception:  # noqa: BLE001 -- a name is a label: any failure leaves the type
        return device_type


def host_description(vllm_config: Any) -> dict[str, Any]:
    device = vllm_config.device_config.device_type
    parallel = vllm_config.parallel_config
    graphs = getattr(vllm_config, "compilation_config", None)
    return {
        "device": device,
        "device_name": _device_name(device),
        "cpu": _cpu_model(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "tensor_parallel": parallel.tensor_parallel_size,
        "pipeline_parallel": parallel.pipeline_parallel_size,
        "dtype": str(vllm_config.model_config.dtype).removeprefix("torch."),
        "enforce_eager": bool(vllm_config.model_config.enforce_eager),
        "cudagraph_mode": str(getattr(graphs, "cudagraph_mode", None)),
        **_versions(),
    }


def _model(name: str) -> str:
    """A model as the key names it: a local directory by its absolute path
    (the same models, whatever directory the server starts in), a hub name
    as given."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def warm_key(vllm_config: Any) -> WarmKey:
    spec = vllm_config.speculative_config
    return WarmKey(host=host_description(vllm_config),
                   target=_model(str(vllm_config.model_config.model)),
                   drafter=_model(str(spec.model)) if spec.model else spec.method,
                   method=str(spec.method), k=int(spec.num_speculative_tokens))
