"""Which vspec class replaces which vLLM-Ascend class, decided once from the
engine config. The patched host files call these functions and fall back to
their own class when one returns None, so with `vspec.enabled = false` the host
runs exactly as shipped.

The settings come from `vllm_vspec.hosts.wiring.resolve`, the one resolver every
host shares; what is Ascend's own stays here. PROPOSERS maps a speculative
method to our proposer; a method absent from it (ngram, suffix, ...) keeps the
host's proposer, scheduler and a static K. KEEP_HOST names, per method, the
host's own tests under which its get_spec_decode_method builds a proposer
other than the one ours extends (vLLM-Ascend's step3p5 MTP proposer, and on
0.30 its gemma4 and multi-KV-cache-group MTP proposers): an engine for which
one holds keeps the host's proposer and scheduler, with vspec off, as for an
unrouted method (a scheduler choosing gamma for a proposer that drafts K
every step would be wrong either way). The ABI check
(vllm_vspec/tools/abi_check.py, `keep_host`) reads the host's
get_spec_decode_method and fails when a test guarding a routed method is
not listed, or a listed one is not there.

Which classes a host gets is that host's choice, not a branch here: the build
copies patches/vllm-ascend/<version>/overlay.toml into the tree as
`vllm_ascend/vspec/host.toml`, whose `[routing]` table names the proposer of
each method and the lossy sampler (vLLM-Ascend 0.23: proposers.py, which
carries the per-step gamma itself; 0.30: native_gamma.py over the host's own
per-step K), and its `[defaults]` table may turn vspec off unless a launch
or the environment turns it on (off_by_host_default: 0.30.0rc2, whose
defaults would be slower than stock). Without that file (a checkout, the
unit tests) the defaults below, the default pin's, apply.

The NPU worker's model runner (patch 0004, 0.23 only) is the host's unless
`ascend_verify_width_graphs` is on and the engine can run a FULL target graph
per verify width (width_graphs_on, the rule the scheduler's padding reads too);
which widths get graphs is `width_graph_plan`'s (graph_budget.py), from the
engine config alone, so the scheduler pads exactly the widths the workers
skip.

An engine whose configuration vspec cannot drive (another Ascend scheduler
selected here; wiring.stock_reason's cases) runs as stock with one warning
naming why; a launch that sets `"enabled": true` fails instead, naming it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import tomllib
from pathlib import Path
from typing import Any, Callable

from vllm_ascend.vspec import graph_budget
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core import install_state
from vllm_vspec.hosts.wiring import SCHEDULER_CLS, resolve, run_stock

# This host's overlay selection (see the module docstring); absent in a checkout.
HOST_FILE = Path(__file__).with_name("host.toml")
_HOST: dict[str, Any] = tomllib.loads(HOST_FILE.read_text()) if HOST_FILE.is_file() else {}
_ROUTING: dict[str, Any] = _HOST.get("routing", {})
# This host's defaults: `enabled = false` turns vspec off unless a launch sets
# `vspec.enabled` (off_by_host_default); `reason` says why.
_DEFAULTS: dict[str, Any] = _HOST.get("defaults", {})

# speculative method -> "module:Class" of our proposer (imported on demand:
# routing is imported by platform.py before torch_npu is initialised).
PROPOSERS: dict[str, str] = dict(_ROUTING.get("proposers") or {
    "eagle": "vllm_ascend.vspec.proposers:VSpecEagleProposer",
    "eagle3": "vllm_ascend.vspec.proposers:VSpecEagleProposer",
    "mtp": "vllm_ascend.vspec.proposers:VSpecEagleProposer",
    "draft_model": "vllm_ascend.vspec.proposers:VSpecDraftModelProposer",
})

# speculative method -> the host's tests that send it elsewhere: each
# "<module>:<function>" (called with the engine config) or an attribute path
# from the engine config whose last part is called ("speculative_config.<method>").
KEEP_HOST: dict[str, list[str]] = dict(_ROUTING.get("keep_host") or {
    m: ["speculative_config.use_step3p5_mtp"] for m in ("eagle", "eagle3", "mtp")})

# Under "vllm.": vLLM configures only its own logger tree (and this module
# imports nothing of vLLM: platform.py imports it before torch_npu is set up).
logger = logging.getLogger(f"vllm.{__name__}")
_said: set[tuple[str, str]] = set()

# vLLM's own schedulers: replacing them by ours loses nothing.
STOCK_SCHEDULERS = ("vllm.v1.core.sched.scheduler.Scheduler",
                    "vllm.v1.core.sched.async_scheduler.AsyncScheduler")

SAMPLER: str = _ROUTING.get("sampler", "vllm_ascend.vspec.sampler:VSpecAscendRejectionSampler")

# The NPU worker's model runner with a FULL target graph per verify width, or
# None where this host has none (a host.toml without `model_runner`: 0.30).
MODEL_RUNNER: str | None = _ROUTING.get("model_runner") if HOST_FILE.is_file() else \
    "vllm_ascend.vspec.width_graphs:VSpecNPUModelRunner"


def vspec_settings(vllm_config: Any) -> VSpecConfig | None:
    """The engine's vspec settings (wiring.resolve), or None when vspec does
    not apply: it is off (by the launch, or by this host's default), the
    method is one we do not drive, or the engine selects another Ascend
    scheduler (only one scheduler class can run; the engine runs as stock
    with one warning, wiring.run_stock)."""
    spec = vllm_config.speculative_config
    if spec is not None and (spec.method not in PROPOSERS
                             or keeps_host(spec.method, vllm_config) is not None):
        return None
    if spec is not None and off_by_host_default(vllm_config):
        return None
    settings = resolve(vllm_config)
    why = None if settings is None else other_scheduler(vllm_config)
    if why is not None:
        return run_stock((vllm_config.additional_config or {}).get("vspec"), why)
    return settings


def other_scheduler(vllm_config: Any) -> str | None:
    """Why vspec's scheduler cannot run here: another Ascend scheduler is
    selected (dynamic batch, profiling chunk, recompute), or None."""
    current = vllm_config.scheduler_config.scheduler_cls
    if current in (None, SCHEDULER_CLS, *STOCK_SCHEDULERS):
        return None
    return f"scheduler_cls={current!r} is selected (vspec needs its own {SCHEDULER_CLS!r})"


def off_by_host_default(vllm_config: Any) -> bool:
    """True when this host's overlay turns vspec off by default
    (host.toml `[defaults] enabled = false`, with its `reason`) and neither
    the launch (`vspec.enabled`) nor the environment (`vllm-vspec manage
    enable`) chose: one start-up line says so, and how to turn it on."""
    if _DEFAULTS.get("enabled", True):
        return False
    raw = (vllm_config.additional_config or {}).get("vspec")
    if isinstance(raw, dict) and "enabled" in raw or "enabled" in install_state.read_state():
        return False
    if ("defaults", "enabled") not in _said:
        _said.add(("defaults", "enabled"))
        logger.warning("vspec: off by default on this vLLM-Ascend (%s); the engine runs as "
                       "stock. --additional-config '{\"vspec\": {\"enabled\": true}}' turns "
                       "it on for a launch, `vllm-vspec manage enable` for this environment",
                       _DEFAULTS.get("reason", "see docs/ascend.md"))
    return True


def keeps_host(method: str, vllm_config: Any) -> str | None:
    """The first KEEP_HOST test of `method` that holds for this engine (it
    then keeps the host's proposer, vspec off), or None."""
    for test in KEEP_HOST.get(method, ()):
        if _holds(test, vllm_config):
            if (method, test) not in _said:
                _said.add((method, test))
                logger.warning("vspec: method %s with %s: vLLM-Ascend drafts with a proposer "
                               "of its own here (a fixed K every step), so vspec is off for "
                               "this engine", method, test)
            return test
    return None


def _holds(test: str, vllm_config: Any) -> bool:
    module, sep, function = test.partition(":")
    if sep:
        return bool(getattr(importlib.import_module(module), function)(vllm_config))
    *path, name = test.split(".")
    # A config without the method cannot be such an engine (stand-in
    # configs; the ABI check makes sure the host's vLLM has it).
    method = getattr(functools.reduce(getattr, path, vllm_config), name, None)
    return method is not None and bool(method())


def scheduler_cls_for(vllm_config: Any) -> str | None:
    """Class path of our scheduler for NPUPlatform.check_and_update_config, or
    None to keep the host's choice (vspec off; another Ascend scheduler
    already selected is never overridden: vspec_settings)."""
    if vspec_settings(vllm_config) is None:
        return None
    # One class path for both modes: VSpecScheduler builds its async
    # subclass when the engine schedules asynchronously.
    return SCHEDULER_CLS


def proposer_cls_for(method: str, vllm_config: Any) -> type | None:
    """Our proposer class for get_spec_decode_method, or None for the host's."""
    if vspec_settings(vllm_config) is None:
        return None
    return _load(PROPOSERS[method])


def rejection_sampler_factory(vllm_config: Any, default: type,
                              runner: Any = None) -> Callable[[Any], Any]:
    """What the NPU runner calls with its sampler to build the rejection
    sampler: ours, bound to the settings and to the runner (both hosts'
    patch 0003 pass `self`: the sampler counts each request's generated
    tokens from the runner's input batch), when a lossy acceptance rule is configured; the
    host's for strict greedy acceptance, which it already implements exactly
    (entropy-stop cuts arrive as invalid draft ids, which every sampler
    rejects)."""
    settings = vspec_settings(vllm_config)
    if settings is None or settings.lossless:
        return default
    # Only a runner that was passed: a patch 0003 that passes none keeps its
    # sampler's own signature.
    bound = {"settings": settings} if runner is None else {"settings": settings, "runner": runner}
    return functools.partial(_load(SAMPLER), **bound)


def width_graphs_on(vllm_config: Any, settings: VSpecConfig | None) -> bool:
    """Whether the target keeps a FULL decode graph per verify width
    (width_graphs.py): vspec drives the engine with `ascend_verify_width_graphs`
    on, this host has the runner, width_graphs_refusal finds nothing, and
    the memory budget admits at least one width below 1 + K
    (width_graph_plan). The one rule for both sides: the worker builds its
    runner by it (model_runner_cls_for) and the scheduler pads only the
    widths it skips (verify_width.VerifyWidth.of)."""
    if settings is None or not settings.ascend_verify_width_graphs or MODEL_RUNNER is None:
        return False
    why = width_graphs_refusal(vllm_config)
    if why is None and not width_graph_plan(vllm_config, settings).kept:
        why = (f"ascend_width_graph_budget_mib={settings.ascend_width_graph_budget_mib:g} "
               "fits no verify width below 1 + K (graph_budget.py's estimate)")
    if why is not None and ("width_graphs", why) not in _said:
        _said.add(("width_graphs", why))
        logger.warning("vspec: ascend_verify_width_graphs is on but %s, so the target keeps its "
                       "1 + K decode graphs and the verify width is padded as without it", why)
    return why is None


def width_graph_plan(vllm_config: Any, settings: VSpecConfig) -> graph_budget.WidthGraphPlan:
    """Which verify widths get FULL target graphs within
    `ascend_width_graph_budget_mib` (graph_budget.plan_widths, from the
    engine config alone: the scheduler and every worker reach the same)."""
    return graph_budget.engine_width_plan(vllm_config, settings.ascend_width_graph_budget_mib)


def width_graph_gammas(vllm_config: Any, settings: VSpecConfig | None) -> tuple[int, ...]:
    """The gammas whose verify width 1 + gamma has a FULL target graph: K's
    only (stock's) unless width_graphs_on holds."""
    k = vllm_config.speculative_config.num_speculative_tokens
    if not width_graphs_on(vllm_config, settings):
        return (k,)
    return width_graph_plan(vllm_config, settings).captured


def width_graphs_refusal(vllm_config: Any) -> str | None:
    """Why per-width target graphs cannot run on this engine, or None."""
    compilation = vllm_config.compilation_config
    mode = compilation.cudagraph_mode
    # CUDAGraphMode by name: this module imports nothing of vLLM (module docstring).
    if mode is None or mode.decode_mode().name != "FULL" or not mode.separate_routine():
        return (f"cudagraph_mode={getattr(mode, 'name', mode)} has no separate FULL decode "
                "graphs (FULL_DECODE_ONLY or FULL_AND_PIECEWISE)")
    dp = vllm_config.parallel_config.data_parallel_size
    if dp > 1:
        return (f"data_parallel_size={dp}: ranks at different widths cannot agree on one "
                "graph")
    if getattr(vllm_config.model_config, "use_mla", False):
        return "the model uses MLA, whose metadata pads by 1 + K"
    if getattr(compilation, "cudagraph_mm_encoder", False):
        return "cudagraph_mm_encoder is on (a capture per width would capture the encoder again)"
    if _sequence_parallel(vllm_config):
        return ("sequence parallelism (flashcomm1) is on: it pads token counts to multiples "
                "of the TP size, which other widths' graph sizes are not")
    return None


def _sequence_parallel(vllm_config: Any) -> bool:
    """vLLM-Ascend's own answer (vllm_ascend.utils.enable_sp), False off an
    Ascend host (a checkout, the unit tests)."""
    try:
        from vllm_ascend.utils import enable_sp
    except ImportError:
        return False
    return bool(enable_sp(vllm_config))


def model_runner_cls_for(vllm_config: Any, host_cls: type) -> type:
    """The NPU worker's model runner class (patch 0004, NPUWorker.init_device):
    VSpecNPUModelRunner where width_graphs_on holds, else `host_cls`."""
    if vllm_config.speculative_config is None:
        return host_cls
    if not width_graphs_on(vllm_config, vspec_settings(vllm_config)):
        return host_cls
    logger.info("vspec: the target captures a FULL decode graph per verify width 1..%d "
                "(ascend_verify_width_graphs; not yet run on NPU)",
                1 + vllm_config.speculative_config.num_speculative_tokens)
    return _load(MODEL_RUNNER)


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
