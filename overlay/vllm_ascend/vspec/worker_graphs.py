"""The engine core adopts the graph mode its workers actually run (not yet
run on NPU).

Why: the scheduler decides which decode steps are padded to 1 + K verify
slots (vllm_vspec/hosts/vllm/verify_width.py, `VerifyWidth.of`) from the
engine core's `vllm_config`. A worker makes its compilation config final
only when its KV cache is initialised: vLLM-Ascend 0.23.0.post1's
`NPUModelRunner._check_and_update_cudagraph_mode` (worker/
model_runner_v1.py lines 5040-5099) calls vLLM's
`CompilationConfig.resolve_cudagraph_mode_and_sizes`, which can downgrade
the mode (vllm/config/compilation.py line 1470 assigns `cudagraph_mode`) and
rounds the capture sizes (line 1517 assigns `max_cudagraph_capture_size`).
With one worker (vLLM's uniproc executor, the TP 1 default) the worker holds
the engine core's own `vllm_config` object (vllm/v1/executor/
uniproc_executor.py line 51), so the scheduler, built after the workers
(vllm/v1/engine/core.py lines 131-136), reads the final values. With several
workers (TP > 1: multiproc or Ray) each has its own copy, and vLLM sends the
engine core back only compilation times (vllm/v1/executor/abstract.py lines
118-137, "With TP>1, compilation happens in worker processes, so the main
process config is never updated").

What this does: it extends `Executor.initialize_from_config` (the one
definition, vllm/v1/executor/abstract.py line 118; in vLLM 0.23 it also
captures, in 0.32 capture is a separate call, but the mode is final after
the KV cache init either way): after the host's method, one
`collective_rpc` asks every worker for its final `cudagraph_mode`,
`cudagraph_capture_sizes` and `max_cudagraph_capture_size`, and writes them
into the engine core's compilation config, as TP 1 sees them. Workers that
disagree (not expected: same config, same backends) give the weakest: the
first mode without a full decode graph, else the first one, and the
smallest capture range. It acts only where the padding decision reads it
(vLLM-Ascend, vspec on, `ascend_pad_verify_width`); everywhere else it
returns after the host's method without a call.

Installed once per process by the vspec general plugin on an installed
overlay wheel (vllm_vspec/hosts/ascend_wheel.py `adopt_worker_graphs`);
vLLM runs general plugins in the engine-core process before it builds the
executor (vllm/v1/engine/core.py, `load_general_plugins()` at the top of
EngineCore.__init__). `VLLM_PLUGINS` without `vspec` skips it: then the NPU
proposer's first-step warning (proposers.py) is what says that a worker has
no full decode graph.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from vllm.config import CUDAGraphMode
from vllm.logger import init_logger

# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")

FIELDS = ("cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size")


def worker_graph_state(worker: Any) -> dict:
    """Run on each worker (collective_rpc with a callable: vLLM calls it with
    the worker, or its WorkerWrapperBase, which forwards attributes to the
    worker): its final graph fields. The model runner's compilation config
    is the one `_check_and_update_cudagraph_mode` resolved (the runner keeps
    the worker's vllm_config)."""
    runner = getattr(worker, "model_runner", None)
    compilation = getattr(runner, "compilation_config", None)
    if compilation is None:
        compilation = worker.vllm_config.compilation_config
    mode = compilation.cudagraph_mode
    sizes = getattr(compilation, "cudagraph_capture_sizes", None)
    return {"cudagraph_mode": None if mode is None else mode.name,
            "cudagraph_capture_sizes": None if sizes is None else list(sizes),
            "max_cudagraph_capture_size": getattr(compilation, "max_cudagraph_capture_size",
                                                  None)}


def _has_full_decode(state: dict) -> bool:
    name = state["cudagraph_mode"]
    return name is not None and CUDAGraphMode[name].decode_mode() == CUDAGraphMode.FULL


def weakest(states: Sequence[dict]) -> dict:
    """One state for the engine core from every worker's."""
    base = next((s for s in states if not _has_full_decode(s)), states[0])
    out = dict(base)
    ranges = [s["max_cudagraph_capture_size"] for s in states]
    if all(r is not None for r in ranges):
        out["max_cudagraph_capture_size"] = min(ranges)
    return out


def adopt(vllm_config: Any, states: Sequence[dict]) -> bool:
    """Write the workers' final graph fields into the engine core's
    compilation config; True when that changed anything."""
    if not states:
        return False
    state = weakest(states)
    compilation = vllm_config.compilation_config
    before = worker_graph_state(_ConfigOnly(vllm_config))
    if before == state:
        return False
    name = state["cudagraph_mode"]
    compilation.cudagraph_mode = None if name is None else CUDAGraphMode[name]
    compilation.cudagraph_capture_sizes = state["cudagraph_capture_sizes"]
    compilation.max_cudagraph_capture_size = state["max_cudagraph_capture_size"]
    logger.info("vspec: the workers run cudagraph_mode=%s, capture sizes up to %s (the engine "
                "core's copy said %s, up to %s); the verify padding is decided on theirs",
                name, state["max_cudagraph_capture_size"], before["cudagraph_mode"],
                before["max_cudagraph_capture_size"])
    return True


class _ConfigOnly:
    """worker_graph_state's view of a bare vllm_config (no model runner)."""

    def __init__(self, vllm_config: Any):
        self.vllm_config = vllm_config


def applies(vllm_config: Any) -> bool:
    """Whether the padding decision reads these fields for this engine."""
    from vllm_ascend.vspec.routing import vspec_settings

    if getattr(vllm_config, "speculative_config", None) is None:
        return False
    if vllm_config.device_config.device_type != "npu":
        return False
    settings = vspec_settings(vllm_config)
    return settings is not None and settings.ascend_pad_verify_width


def install(executor_cls: Any = None) -> bool:
    """Extend `executor_cls.initialize_from_config` (default vLLM's Executor)
    once; False when it already was."""
    if executor_cls is None:
        from vllm.v1.executor.abstract import Executor as executor_cls
    host = executor_cls.initialize_from_config
    if getattr(host, "_vspec_adopts_worker_graphs", False):
        return False

    @functools.wraps(host)
    def initialize_from_config(self, *args: Any, **kwargs: Any) -> Any:
        out = host(self, *args, **kwargs)
        if applies(self.vllm_config):
            adopt(self.vllm_config, self.collective_rpc(worker_graph_state))
        return out

    initialize_from_config._vspec_adopts_worker_graphs = True  # type: ignore[attr-defined]
    executor_cls.initialize_from_config = initialize_from_config
    return True
