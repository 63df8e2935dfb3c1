"""VSpecStatLogger.record: what /metrics gets from each engine step's host
stats (the values, not only the names)."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import REGISTRY
from vllm.v1.metrics.stats import IterationStats, SchedulerStats
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from conftest import engine_config
from vllm_vspec.config import VSpecConfigError
from vllm_vspec.hosts.vllm.metrics import VSpecStatLogger
from vllm_vspec.hosts.wiring import SCHEDULER_CLS

STOCK_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"

K = 4
_engines = itertools.count(100)   # collectors are process-global: one engine label per test


@pytest.fixture
def logger() -> VSpecStatLogger:
    config = engine_config("draft_model", K, {"policy": "online"}, scheduler_cls=SCHEDULER_CLS)
    return VSpecStatLogger(config, engine_index=next(_engines))


def step(logger: VSpecStatLogger, at: float, tokens: int, drafts: tuple[int, ...] = (),
         running: int = 2) -> None:
    """One step's record(): output at `at`, `tokens` committed, one entry
    per request that verified drafts (its verified draft length), `running`
    requests left after it."""
    spec = None
    if drafts:
        spec = SpecDecodingStats.new(K)
        for d in drafts:
            spec.observe_draft(num_draft_tokens=d, num_accepted_tokens=0)
    it = IterationStats()
    it.iteration_timestamp, it.num_generation_tokens = at, tokens
    logger.record(SchedulerStats(num_running_reqs=running, spec_decoding_stats=spec), it)


def value(logger: VSpecStatLogger, name: str, gamma: int | None = None) -> float | None:
    labels = {"engine": logger.engine} | ({} if gamma is None else {"gamma": str(gamma)})
    return REGISTRY.get_sample_value(name, labels)


def test_gamma_is_the_longest_draft_verified_in_the_step(logger):
    step(logger, 1.0, tokens=2)                          # nothing verified: gamma 0
    assert value(logger, "vspec:gamma") == 0
    step(logger, 1.5, tokens=4, drafts=(3, 1))           # one request near its length limit
    assert value(logger, "vspec:gamma") == 3
    assert value(logger, "vspec:steps_total", 3) == 1
    assert value(logger, "vspec:steps_total", 1) == 0     # present from start-up, zero


def test_tokens_and_busy_seconds_add_up_per_gamma(logger):
    step(logger, 10.0, tokens=2)                         # first step: no previous output
    step(logger, 10.5, tokens=5, drafts=(2, 2))
    step(logger, 10.75, tokens=3, drafts=(2, 2), running=0)   # the engine may idle after it
    step(logger, 30.0, tokens=6, drafts=(2, 2))          # idle 10.75 -> 30: not counted
    step(logger, 30.25, tokens=4, drafts=(2, 2))
    assert value(logger, "vspec:steps_total", 0) == 1
    assert value(logger, "vspec:committed_tokens_total", 0) == 2
    assert value(logger, "vspec:step_seconds_total", 0) == 0
    assert value(logger, "vspec:steps_total", 2) == 4
    assert value(logger, "vspec:committed_tokens_total", 2) == 18
    assert value(logger, "vspec:step_seconds_total", 2) == pytest.approx(0.5 + 0.25 + 0.25)


def test_a_step_without_generated_tokens_is_not_a_step(logger):
    step(logger, 1.0, tokens=2)
    step(logger, 2.0, tokens=0, drafts=(4,))             # e.g. only prompt chunks
    step(logger, 2.5, tokens=3, drafts=(4,))
    assert value(logger, "vspec:steps_total", 4) == 1
    assert value(logger, "vspec:step_seconds_total", 4) == pytest.approx(0.5)


def test_every_series_is_present_zero_valued_before_the_first_step(logger):
    """A scrape before the first request already sees every vspec series."""
    assert value(logger, "vspec:gamma") == 0
    for gamma in range(K + 1):
        for name in ("vspec:steps_total", "vspec:committed_tokens_total",
                     "vspec:step_seconds_total"):
            assert value(logger, name, gamma) == 0, (name, gamma)


def test_an_engine_without_the_vspec_scheduler_records_nothing():
    config = engine_config("draft_model", K, scheduler_cls=STOCK_SCHEDULER)
    stock = VSpecStatLogger(config, engine_index=next(_engines))
    step(stock, 1.0, tokens=2, drafts=(4,))
    assert value(stock, "vspec:steps_total", 4) is None


def test_vspec_settings_with_vllms_scheduler_are_refused_naming_the_fix():
    config = engine_config("draft_model", K, {"policy": "online"}, scheduler_cls=STOCK_SCHEDULER)
    with pytest.raises(VSpecConfigError, match="--scheduler-cls") as err:
        VSpecStatLogger(config, engine_index=next(_engines))
    assert err.value.key == "vspec"


@pytest.mark.parametrize("vspec", [{"enabled": False}, {"policy": "online"}],
                         ids=["enabled-false", "manage-disable"])
def test_vspec_off_by_its_resolved_settings_records_nothing(vspec, monkeypatch):
    """The logger reads the settings the engine runs (wiring.resolve): off by
    `enabled = false`, or by the default `vllm-vspec manage disable` stored
    (a table without `enabled`), with or without vspec's scheduler."""
    from vllm_vspec.core import install_state

    monkeypatch.setattr(install_state, "default_enabled", lambda: "enabled" in vspec)
    for scheduler in (SCHEDULER_CLS, STOCK_SCHEDULER):
        off = VSpecStatLogger(engine_config("draft_model", K, vspec, scheduler_cls=scheduler),
                              engine_index=next(_engines))
        assert not off.enabled, scheduler
