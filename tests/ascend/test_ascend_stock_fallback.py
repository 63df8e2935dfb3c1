"""Where vspec cannot drive an engine that stock vLLM-Ascend starts, the
engine starts as stock with one warning naming why (vllm_ascend/vspec/
routing.py, vllm_vspec/hosts/wiring.py: stock_reason, run_stock); a launch
that asks for vspec by name (`"enabled": true`) fails naming the conflict.
And a host whose overlay turns vspec off by default (0.30.0rc2's
overlay.toml `[defaults]`) says so once at start-up, with how to opt in.

The decisions are the routing functions the patched host files call
(NPUPlatform.check_and_update_config: scheduler_cls_for; the host's
get_spec_decode_method: proposer_cls_for; the runner's rejection sampler:
rejection_sampler_factory), on stand-in engine configs (no NPU here).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from test_overlay import _engine_config

REPO = Path(__file__).resolve().parents[2]
PROFILING_CHUNK = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"


@pytest.fixture
def routing(monkeypatch):
    """vllm_ascend.vspec.routing with its once-only warnings reset."""
    from vllm_ascend.vspec import routing
    from vllm_vspec.hosts import wiring

    monkeypatch.setattr(wiring, "_warned", set())
    monkeypatch.setattr(routing, "_said", set())
    return routing


def _warnings(caplog) -> list[str]:
    """vspec's warnings (vLLM's own, e.g. on import, left out)."""
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and r.name.startswith(("vllm.vllm_vspec", "vllm.vllm_ascend"))]


def _stock(routing, config) -> bool:
    """Every routing decision keeps the host's own class."""

    class HostSampler:
        pass

    return (routing.vspec_settings(config) is None and routing.scheduler_cls_for(config) is None
            and routing.proposer_cls_for(config.speculative_config.method, config) is None
            and routing.rejection_sampler_factory(config, HostSampler) is HostSampler)


def test_another_ascend_scheduler_keeps_the_engine_stock_with_one_warning(routing, caplog):
    with caplog.at_level("WARNING"):
        config = _engine_config("eagle", scheduler_cls=PROFILING_CHUNK)
        assert _stock(routing, config)
        assert _stock(routing, _engine_config("draft_model", scheduler_cls=PROFILING_CHUNK))
    (line,) = _warnings(caplog)
    assert f"scheduler_cls={PROFILING_CHUNK!r}" in line and "runs as stock" in line


def test_vllms_own_schedulers_are_replaced_by_vspecs(routing):
    from vllm_vspec.hosts.wiring import SCHEDULER_CLS

    for current in (None, *routing.STOCK_SCHEDULERS, SCHEDULER_CLS):
        assert routing.scheduler_cls_for(_engine_config(scheduler_cls=current)) == SCHEDULER_CLS


def test_asking_for_vspec_with_another_ascend_scheduler_fails_naming_both(routing):
    from vllm_vspec.config import VSpecConfigError

    config = _engine_config(vspec={"enabled": True}, scheduler_cls=PROFILING_CHUNK)
    with pytest.raises(VSpecConfigError, match=rf"enabled=True .*{PROFILING_CHUNK}"):
        routing.scheduler_cls_for(config)


@pytest.mark.parametrize("facts, named", [
    (dict(data_parallel_size=2, moe=True), "data_parallel_size=2 on a MoE model"),
    (dict(static_table=[[1, 8, 2], [9, 64, 1]]), "num_speculative_tokens_per_batch_size"),
])
def test_what_the_wiring_cannot_drive_keeps_every_ascend_class_stock(routing, caplog, facts,
                                                                      named):
    from conftest import engine_config

    with caplog.at_level("WARNING"):
        config = engine_config("eagle", 4, {}, device="npu",
                               worker_cls="vllm_ascend.worker.worker.NPUWorker", **facts)
        assert _stock(routing, config)
    (line,) = _warnings(caplog)
    assert named in line


# ------------------------------------------------------- a host's default off
def _defaults(version: str) -> dict:
    text = (REPO / "patches" / "vllm-ascend" / version / "overlay.toml").read_text()
    return tomllib.loads(text).get("defaults", {})


@pytest.fixture
def on_030(routing, monkeypatch, tmp_path):
    """routing as 0.30.0rc2's wheel has it: that pin's overlay.toml defaults,
    in an environment where `vllm-vspec manage` stored nothing."""
    monkeypatch.setattr(routing, "_DEFAULTS", _defaults("0.30.0rc2"))
    monkeypatch.setenv("VLLM_VSPEC_STATE", str(tmp_path / "state.json"))
    return routing


def test_vspec_is_off_by_default_on_the_030_pin_and_says_how_to_turn_it_on(on_030, caplog):
    with caplog.at_level("WARNING"):
        assert _stock(on_030, _engine_config("eagle"))
        assert _stock(on_030, _engine_config("draft_model", vspec={"policy": "online"}))
    (line,) = _warnings(caplog)
    assert "off by default" in line and "slower than stock" in line
    assert '{"vspec": {"enabled": true}}' in line and "vllm-vspec manage enable" in line


def test_on_the_030_pin_a_launch_or_the_environment_turns_vspec_on(on_030, caplog):
    from vllm_vspec.core import install_state

    with caplog.at_level("WARNING"):
        assert on_030.vspec_settings(_engine_config(vspec={"enabled": True})) is not None
        assert on_030.vspec_settings(_engine_config(vspec={"enabled": False})) is None
        install_state.write_state(True)
        assert on_030.vspec_settings(_engine_config()) is not None
    assert _warnings(caplog) == []


def test_the_023_pin_keeps_vspec_on_by_default(routing, monkeypatch):
    monkeypatch.setattr(routing, "_DEFAULTS", _defaults("0.23.0.post1"))
    assert _defaults("0.23.0.post1") == {}
    assert routing.vspec_settings(_engine_config("eagle")) is not None


def test_doctor_lists_every_configuration_that_runs_as_stock(monkeypatch, tmp_path):
    from vllm_vspec.commands import doctor
    from vllm_vspec.hosts import wiring

    result = {"summary": doctor.summary([], {}), "abi": [], "ok": True}
    assert result["summary"]["runs_as_stock_when"] == list(wiring.STOCK_WHEN)
    table = doctor._table(result, []).splitlines()
    start = table.index(next(line for line in table if line.startswith("runs as stock when")))
    assert [line.split("-", 1)[1].strip() for line in table[start + 1:start + 6]] == \
        list(wiring.STOCK_WHEN)
    for words in ("num_speculative_tokens_per_batch_size", "MoE", "another Ascend scheduler",
                  "0.30.0rc2"):
        assert any(words in rule for rule in wiring.STOCK_WHEN), words
