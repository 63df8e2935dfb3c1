"""vspec Prometheus metrics on vLLM's own `/metrics`, and the start-up check
that vspec settings are actually served by the vspec scheduler.

The controller (decision, step interval, reward) lives in the engine-core
process; `/metrics` is served by the API-server process, which sees each
step only through the SchedulerStats/IterationStats the engine sends it.
vLLM 0.32 gives those no field for a plugin's own numbers (they cross the
process boundary as fixed msgspec types), so the controller's own account
of every step is in the JSONL trace (`vspec.trace_path`) and the shutdown
summary line, and this stat-logger plugin (entry point group
`vllm.stat_logger_plugins`) exports only what the host stats state, as
counters, without estimates of its own:

- the step's gamma: the longest draft any request verified in it (vLLM's
  per-position draft counts), which is the gamma the controller decided one
  step earlier (less only if every request was within reach of its length
  limit); 0 for a step that verified nothing; for a tree step, the tree's
  depth (vspec's scheduler counts a verified tree by its depth in the host
  stats, VSpecScheduler.make_spec_decoding_stats, from the width the runner
  drafted it with; the width is in the controller's trace);
- committed tokens, and the step's seconds: from the previous step's
  output to this one's, counted only when requests remained after the
  previous step (an idle engine's wait is no step's cost: the controller's
  rule, core/steps.BusySince, on the host stats' timestamps). Tokens per second at a gamma over any window is then
  `rate(vspec:committed_tokens_total[w]) / rate(vspec:step_seconds_total[w])`.

The names start with `vspec:`, not `vllm:`: vLLM's Prometheus logger
unregisters every `vllm:` collector in the process when it starts, which
would drop ours.

Metrics (label `gamma` as above):
  vspec:gamma                          gauge, the last step's gamma
  vspec:steps_total{gamma}             counter, steps that committed tokens
  vspec:committed_tokens_total{gamma}  counter, tokens they committed
  vspec:step_seconds_total{gamma}      counter, their busy seconds
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from vllm_vspec.config import VSpecConfigError
from vllm_vspec.core.steps import BusySince
from vllm_vspec.hosts.wiring import SCHEDULER_CLS, resolve



def _uses_vspec_scheduler(vllm_config: VllmConfig) -> bool:
    cls = vllm_config.scheduler_config.scheduler_cls
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', '')}"
    return name.startswith("vllm_vspec.")


def check_vspec_scheduler(vllm_config: VllmConfig) -> bool:
    """True when this engine runs vspec: the settings it runs (wiring.resolve,
    the one resolved object every part reads: None when vspec is off, by
    `enabled = false` or by the default `vllm-vspec manage disable` stored)
    and vspec's scheduler. Raises when vspec settings are on but the engine
    would silently ignore them (vLLM's scheduler). An engine without
    speculation, or a stock one that names no vspec settings, is not asked
    (its settings are never resolved)."""
    raw = (vllm_config.additional_config or {}).get("vspec")
    active = _uses_vspec_scheduler(vllm_config)
    if vllm_config.speculative_config is None or (raw is None and not active):
        return False
    settings = resolve(vllm_config)
    if settings is not None and not active:
        raise VSpecConfigError(
            "vspec", raw, "settings that only take effect with the vspec "
            f"scheduler: add --scheduler-cls {SCHEDULER_CLS} "
            "(or use `vllm-vspec serve`, which adds it)")
    return settings is not None


def verified_gamma(scheduler_stats: SchedulerStats | None) -> int:
    """The longest draft a request verified in the step (0: none verified)."""
    spec = scheduler_stats.spec_decoding_stats if scheduler_stats else None
    if spec is None:
        return 0
    return sum(1 for n in spec.num_draft_tokens_per_pos if n)


class VSpecStatLogger(StatLoggerBase):
    """Exports per-gamma step counts, committed tokens and step seconds, as
    the host stats state them (module docstring)."""

    _metrics: tuple | None = None  # prometheus collectors are process-global

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0):
        self.enabled = check_vspec_scheduler(vllm_config)
        self.engine = str(engine_index)
        self._busy = BusySince()
        if self.enabled and VSpecStatLogger._metrics is None:
            labels = ["engine", "gamma"]
            VSpecStatLogger._metrics = (
                Gauge("vspec:gamma", "Longest draft verified in the last step",
                      ["engine"], multiprocess_mode="mostrecent"),
                Counter("vspec:steps", "Steps that committed tokens, per gamma", labels),
                Counter("vspec:committed_tokens",
                        "Tokens committed in steps of each gamma", labels),
                Counter("vspec:step_seconds",
                        "Seconds of steps of each gamma while the engine was busy", labels),
            )
        if self.enabled:
            # Every series from start-up, zero-valued: a scrape before the
            # first request sees them (and rate() has a start point).
            gauge, steps, committed, seconds = VSpecStatLogger._metrics
            gauge.labels(self.engine).set(0)
            k = vllm_config.speculative_config.num_speculative_tokens
            for gamma in range(k + 1):
                for counter in (steps, committed, seconds):
                    counter.labels(self.engine, str(gamma))

    # implements StatLoggerBase.record: called once per engine step's outputs.
    def record(self, scheduler_stats: SchedulerStats | None,
               iteration_stats: IterationStats | None, mm_cache_stats=None,
               engine_idx: int = 0) -> None:
        if not self.enabled or iteration_stats is None:
            return
        now, tokens = iteration_stats.iteration_timestamp, iteration_stats.num_generation_tokens
        busy = scheduler_stats is not None and (
            scheduler_stats.num_running_reqs + scheduler_stats.num_waiting_reqs > 0)
        start = self._busy.processed(now, busy)
        if tokens == 0:
            return
        gamma = verified_gamma(scheduler_stats)
        gauge, steps, committed, seconds = VSpecStatLogger._metrics
        gauge.labels(self.engine).set(gamma)
        steps.labels(self.engine, str(gamma)).inc()
        committed.labels(self.engine, str(gamma)).inc(tokens)
        if start is not None and now > start:
            seconds.labels(self.engine, str(gamma)).inc(now - start)

    # implements StatLoggerBase.log_engine_initialized (nothing to announce).
    def log_engine_initialized(self) -> None:
        pass
