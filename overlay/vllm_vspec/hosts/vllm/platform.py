"""vspec's vLLM platform plugin: plain `vllm serve` runs vspec from a `vspec`
table in `--additional-config`, with no class flags, and refuses bad vspec
settings before any model loads.

vLLM picks its platform (`vllm.platforms.current_platform`) from its
built-in detectors and the `vllm.platform_plugins` entry points
(`vllm.platforms.resolve_current_platform_cls_qualname`): one activated
out-of-tree plugin wins over the built-in one. `detect` (the entry point)
answers the platform vLLM would pick itself, as vspec's subclass
(platform_cpu.VSpecCpuPlatform, platform_cuda.VSpecCudaPlatform), whose
`check_and_update_config` runs `before_host` and `after_host` around the
host's own. vLLM calls that hook while it builds the engine config
(`VllmConfig.__post_init__`), in the process that parses the command line,
before the engine core starts. Without a `vspec` table the subclass is the
host's platform, unchanged.

With a `vspec` table and a speculative config:
- the classes vspec runs are selected where the user named none: the
  scheduler (`scheduler_cls` unset), the worker (`worker_cls` `auto`) and,
  where the host runs its multiprocess executor, vspec's executor
  (wiring.SCHEDULER_CLS, WORKER_CLS, EXECUTOR_CLS: what `vllm-vspec serve`
  renders as flags);
- the settings are resolved (wiring.resolve, every check the engine would
  make later), and a refusal raises VSpecStartupError: one line naming the
  key, the value and what is allowed, and nothing more when uncaught.

`detect` answers None, leaving vLLM's choice alone, where vLLM resolves the
platform without plugins (VLLM_TARGET_DEVICE=cpu: the launcher's flags
still work there), where another platform plugin is installed (vLLM-Ascend
selects vspec's classes in its own platform, from the overlay), and on
platforms other than CPU and CUDA.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from vllm_vspec.config import VSpecConfigError

# Built-in platform -> vspec's subclass of it.
PLATFORM_CLS = {
    "cpu": "vllm_vspec.hosts.vllm.platform_cpu.VSpecCpuPlatform",
    "cuda": "vllm_vspec.hosts.vllm.platform_cuda.VSpecCudaPlatform",
}
LOGGER = "vllm.vspec"  # under vLLM's logger: its format and level
ENTRY_POINT_GROUP = "vllm.platform_plugins"
ENTRY_POINT_NAME = "vspec"  # the name of vspec's general plugin too (VLLM_PLUGINS)

_detected: list[str | None] = []  # one answer per process


def detect() -> str | None:
    """The `vllm.platform_plugins` entry point (module docstring)."""
    if not _detected:
        _detected.append(_detect())
    return _detected[0]


def _detect() -> str | None:
    from importlib.metadata import entry_points

    others = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name != ENTRY_POINT_NAME]
    if others:
        return None
    from vllm.platforms import builtin_platform_plugins

    active = []
    for name, probe in builtin_platform_plugins.items():
        try:
            if probe() is not None:
                active.append(name)
        except Exception:  # a failing probe is not active (as vLLM treats it)
            continue
    return PLATFORM_CLS.get(active[0]) if len(active) == 1 else None


class VSpecStartupError(RuntimeError):
    """vspec refused the engine's settings at start-up. Not a ValueError:
    vLLM builds its config in a pydantic dataclass, which would fold a
    ValueError into a multi-line validation report. Uncaught, the process
    prints its one-line message and no traceback (_one_line_hook). `error`
    is the VSpecConfigError; `key`, `value` and `allowed` are its."""

    def __init__(self, error: VSpecConfigError):
        self.error = error
        self.key, self.value, self.allowed = error.key, error.value, error.allowed
        super().__init__(f"vspec refused the engine's settings: {error}")


def _one_line_hook(previous):
    def hook(exc_type, exc, tb):
        if isinstance(exc, VSpecStartupError):
            print(f"{exc_type.__name__}: {exc}", file=sys.stderr, flush=True)
        else:
            previous(exc_type, exc, tb)
    hook.vspec = True
    return hook


def _raise(error: VSpecConfigError) -> None:
    if not getattr(sys.excepthook, "vspec", False):
        sys.excepthook = _one_line_hook(sys.excepthook)
    raise VSpecStartupError(error) from None


def _table(vllm_config: Any) -> Any:
    """The `vspec` table of an engine's config (None without one). None for
    the drafter's copy of the engine config (its model config is the
    draft's: vLLM's proposers build one in the worker), whose classes and
    settings were decided with the engine's."""
    extra = vllm_config.additional_config
    spec = vllm_config.speculative_config
    if spec is not None and vllm_config.model_config is getattr(spec, "draft_model_config", None):
        return None
    return extra.get("vspec") if isinstance(extra, dict) else None


def requested(vllm_config: Any) -> bool:
    """A `vspec` table beside a speculative config: the engine asks for vspec."""
    return _table(vllm_config) is not None and vllm_config.speculative_config is not None


def before_host(vllm_config: Any, device: str) -> list[str]:
    """Before the host's check_and_update_config (which fills `worker_cls`
    `auto` with its own worker): vspec's scheduler and worker where the user
    named none. Returns what it set, as `field=class` (for after_host's line)."""
    if not requested(vllm_config):
        return []
    from vllm_vspec.hosts import wiring

    chosen = []
    scheduler = vllm_config.scheduler_config
    if scheduler.scheduler_cls is None:
        scheduler.scheduler_cls = wiring.SCHEDULER_CLS
        chosen.append(f"scheduler_cls={wiring.SCHEDULER_CLS}")
    parallel = vllm_config.parallel_config
    worker = wiring.WORKER_CLS.get(device)
    if parallel.worker_cls == "auto" and worker is not None:
        parallel.worker_cls = worker
        chosen.append(f"worker_cls={worker}")
    return chosen


def after_host(vllm_config: Any, device: str, chosen: list[str]) -> None:
    """After the host's check_and_update_config (which settles the executor
    and async scheduling): vspec's executor in place of the host's
    multiprocess one, one line naming the classes vspec chose (with
    before_host's `chosen`), the version line, then every start-up check
    of the settings (wiring.resolve), refused in one line."""
    if _table(vllm_config) is None:
        return
    from vllm_vspec.hosts import wiring
    from vllm_vspec.hosts.vllm import releases

    parallel = vllm_config.parallel_config
    executor = wiring.EXECUTOR_CLS.get(device)
    if (requested(vllm_config) and executor is not None
            and parallel.distributed_executor_backend == "mp"
            and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"):
        parallel.distributed_executor_backend = executor
        chosen = [*chosen, f"distributed_executor_backend={executor}"]
    if chosen:
        logging.getLogger(LOGGER).info("vspec: the `vspec` table selects %s", ", ".join(chosen))
    line = releases.range_line()
    if line:
        print(line, file=sys.stderr, flush=True)
    try:
        _check_runner(vllm_config, device)
        wiring.resolve(vllm_config)
    except VSpecConfigError as e:
        _raise(e)


def _check_runner(vllm_config: Any, device: str) -> None:
    """vspec's CUDA worker builds vLLM's V1 model runner; vLLM 0.32 and 0.33
    default to the V2 runner on CUDA wherever it supports the method. The
    worker would refuse that after the engine core started; refused here
    instead, naming the switch (`vllm-vspec serve` sets it)."""
    from vllm_vspec.hosts import wiring

    worker = wiring.WORKER_CLS.get(device)
    if (device == "cuda" and vllm_config.parallel_config.worker_cls == worker
            and getattr(vllm_config, "use_v2_model_runner", False)):
        raise VSpecConfigError("worker_cls", worker, "vLLM's V1 model runner, which vspec's "
                               "worker extends: set VLLM_USE_V2_MODEL_RUNNER=0 in the "
                               "server's environment (vLLM picks V2 by default on CUDA)")


__all__ = ["detect", "before_host", "after_host", "VSpecStartupError", "PLATFORM_CLS"]
