"""vspec Prometheus metrics on vLLM's own `/metrics`, and the start-up check
that vspec settings are actually served by the vspec scheduler.

vLLM runs the scheduler in the engine-core process, but `/metrics` is served
by the API-server process, which sees each step only through the
SchedulerStats/IterationStats the engine sends it. So this stat-logger plugin
(entry point group `vllm.stat_logger_plugins`) measures what the engine did
from those host stats: the draft length verified in each step (the gamma the
controller chose one step earlier) and the committed tokens per second at
that gamma. The controller's own view of every decision is in the JSONL trace
(`vspec.trace_path`) and the shutdown summary line.

The names start with `vspec:`, not `vllm:`: vLLM's Prometheus logger
unregisters every `vllm:` collector in the process when it starts, which
would drop ours.

Metrics (label `gamma` is the verified draft length, 0 = target-only step):
  vspec:gamma                      gauge, last step's verified gamma
  vspec:steps_total{gamma}         counter, decode steps per gamma
  vspec:committed_tokens_total{gamma}  counter, tokens committed per gamma
  vspec:reward_tokens_per_second{gamma}  gauge, EWMA of committed tokens
                                        per second of steps at that gamma
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.wiring import SCHEDULER_CLS

_REWARD_EWMA = 0.2


def _uses_vspec_scheduler(vllm_config: VllmConfig) -> bool:
    cls = vllm_config.scheduler_config.scheduler_cls
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', '')}"
    return name.startswith("vllm_vspec.")


def check_vspec_scheduler(vllm_config: VllmConfig) -> bool:
    """True when this engine runs vspec. Raises when vspec settings were given
    but the engine would silently ignore them (wrong scheduler class)."""
    vspec = (vllm_config.additional_config or {}).get("vspec")
    active = _uses_vspec_scheduler(vllm_config)
    if (vspec is not None and not active and vllm_config.speculative_config is not None
            and VSpecConfig.from_dict(vspec).enabled):  # disabled: stock vLLM, nothing ignored
        raise VSpecConfigError(
            "vspec", vspec, "settings that only take effect with the vspec "
            f"scheduler: add --scheduler-cls {SCHEDULER_CLS} "
            "(or use `vllm-vspec serve`, which adds it)")
    return active and vllm_config.speculative_config is not None


class VSpecStatLogger(StatLoggerBase):
    """Exports per-gamma step counts and rewards measured from host stats."""

    _metrics: tuple | None = None  # prometheus collectors are process-global

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0):
        self.enabled = check_vspec_scheduler(vllm_config)
        self.engine = str(engine_index)
        self.last_ts: float | None = None
        self.reward: dict[int, float] = {}
        if self.enabled and VSpecStatLogger._metrics is None:
            labels = ["engine", "gamma"]
            VSpecStatLogger._metrics = (
                Gauge("vspec:gamma", "Draft length verified in the last step",
                      ["engine"], multiprocess_mode="mostrecent"),
                Counter("vspec:steps", "Decode steps per verified gamma", labels),
                Counter("vspec:committed_tokens",
                        "Tokens committed in steps of each gamma", labels),
                Gauge("vspec:reward_tokens_per_second",
                      "EWMA of committed tokens per second in steps of each gamma",
                      labels, multiprocess_mode="mostrecent"),
            )

    # implements StatLoggerBase.record: called once per engine step's outputs.
    def record(self, scheduler_stats: SchedulerStats | None,
               iteration_stats: IterationStats | None, mm_cache_stats=None,
               engine_idx: int = 0) -> None:
        if not self.enabled or iteration_stats is None:
            return
        ts, tokens = iteration_stats.iteration_timestamp, iteration_stats.num_generation_tokens
        prev, self.last_ts = self.last_ts, ts
        if tokens == 0:
            return
        spec = scheduler_stats.spec_decoding_stats if scheduler_stats else None
        gamma = round(spec.num_draft_tokens / spec.num_drafts) if spec and spec.num_drafts else 0
        gauge, steps, committed, reward = VSpecStatLogger._metrics
        gauge.labels(self.engine).set(gamma)
        steps.labels(self.engine, str(gamma)).inc()
        committed.labels(self.engine, str(gamma)).inc(tokens)
        if prev is not None and ts > prev:
            rate = tokens / (ts - prev)
            old = self.reward.get(gamma, rate)
            self.reward[gamma] = old + _REWARD_EWMA * (rate - old)
            reward.labels(self.engine, str(gamma)).set(self.reward[gamma])

    # implements StatLoggerBase.log_engine_initialized (nothing to announce).
    def log_engine_initialized(self) -> None:
        pass
