"""Warm start (core/warm_state.py): the `model` policy's learned state kept
in a file per (host, model pair, method, K) and read back by the next
engine of that key. One behaviour a test; no engine (the scheduler test
builds vLLM's real Scheduler on the bundled tiny target, as
test_scheduler_stats does)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core import warm_state
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.steps import BatchState
from vllm_vspec.core.warm_state import WarmKey

from test_model_policy import K, feedback, step_ms   # the model policy's test host
KEY = WarmKey(host={"device": "cpu", "cpus": 2}, target="/models/tiny-target",
              drafter="/models/tiny-draft", method="draft_model", k=K)
BATCH1 = BatchState(1, 8192, 300.0)
LOG = warm_state.logger.name


def log_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOG]


def controller(directory: Path | str, key: WarmKey | None = KEY, **over):
    clock = [0.0]
    cfg = VSpecConfig.from_dict({"policy": "model", "min_gamma": 0, "model_thompson": False,
                                 "model_state_dir": str(directory), **over}, K)
    return GammaController(cfg, K, clock=lambda: clock[0], warm_key=key), clock


def drive(ctl: GammaController, clock, rate: float, batch: int, steps: int,
          rng: random.Random) -> list[str]:
    """`steps` decided steps at acceptance `rate`; their reasons."""
    reasons, last = [], ctl.gamma
    for _ in range(steps):
        d = ctl.decide(BatchState(batch, 8192, 300.0))
        clock[0] += step_ms(batch, d.gamma) / 1000.0
        ctl.observe(feedback(rng, (rate,) * K, batch, last))
        last = d.gamma
        reasons.append(d.reason)
    return reasons


def learned(directory: Path) -> GammaController:
    """A controller that learned from batch-1 runs of full and of no
    acceptance (so its outcome-conditioned posteriors differ) and from
    batch 8, then shut down (saving its state)."""
    ctl, clock = controller(directory)
    rng = random.Random(4)
    for _ in range(12):
        drive(ctl, clock, 0.98, 1, 10, rng)
        drive(ctl, clock, 0.05, 1, 10, rng)
    drive(ctl, clock, 0.6, 8, 40, rng)
    ctl.close()
    return ctl


def batch1_decision(policy, last_full: bool):
    """The policy's batch-1 decision when the request's last known step
    did (or did not) accept every draft: the decision's inputs, set alike."""
    policy.outcomes = [None, last_full]
    return policy.decide(BATCH1, 1, 0, K, None)


def only_file(directory: Path) -> Path:
    (path,) = [p for p in directory.iterdir()]
    return path


# ------------------------------------------------------------- round trip
def test_a_restarted_controller_of_the_same_key_goes_on_from_the_saved_state(tmp_path):
    saved = learned(tmp_path)
    fresh, clock = controller(tmp_path)
    assert fresh.policy.state() == saved.policy.state()
    assert drive(fresh, clock, 0.6, 8, 3, random.Random(5)) == ["model"] * 3   # no cold sweep


def test_a_cold_controller_sweeps_first(tmp_path):
    ctl, clock = controller(tmp_path)
    assert drive(ctl, clock, 0.6, 8, 1, random.Random(5)) == ["sweep"]


def test_warm_start_reproduces_the_last_decision(tmp_path):
    saved = learned(tmp_path)
    fresh, _ = controller(tmp_path)
    want = {full: batch1_decision(saved.policy, full) for full in (True, False)}
    assert {full: batch1_decision(fresh.policy, full) for full in (True, False)} == want
    batch8 = BatchState(8, 8192, 300.0)
    assert fresh.policy.decide(batch8, 8, 0, K, None) == saved.policy.decide(batch8, 8, 0, K, None)
    # The outcome-conditioned posteriors decide at batch 1 here: they are
    # what the restore must bring back.
    assert want[True][0] != want[False][0], want
    state = saved.policy.state()
    del state["by_outcome"]
    partial, _ = controller(tmp_path, key=None)
    partial.policy.restore(state)
    assert {full: batch1_decision(partial.policy, full) for full in (True, False)} != want


def test_the_file_is_readable_json_with_its_key_and_what_it_learned_from(tmp_path):
    saved = learned(tmp_path)
    path = only_file(tmp_path)
    assert path.name == KEY.file_name()
    assert path.name.startswith("model-draft_model-k4-tiny-target-tiny-draft-")
    doc = json.loads(path.read_text())
    assert doc["schema"] == warm_state.SCHEMA and doc["format"] == warm_state.FORMAT
    assert doc["key"] == KEY.as_dict()
    assert doc["steps_learned"] == saved.summary()["observed_steps"] == 280
    assert doc["saved_at"].endswith("Z") and doc["vllm_vspec"]
    assert len(doc["state"]["acceptance"]["mean"]) == K
    assert set(doc["state"]["cost"]["coefficients_ms"]) >= {"step", "verified", "passes"}
    assert path.read_text().count("\n") > 20                  # indented, not one line


def test_steps_learned_accumulates_over_restarts(tmp_path):
    learned(tmp_path)
    again, clock = controller(tmp_path)
    drive(again, clock, 0.6, 8, 30, random.Random(6))
    again.close()
    assert json.loads(only_file(tmp_path).read_text())["steps_learned"] == 280 + 30


def test_the_state_is_saved_while_running_and_atomically(tmp_path):
    ctl, clock = controller(tmp_path)
    drive(ctl, clock, 0.6, 8, warm_state.SAVE_EVERY_STEPS - 1, random.Random(7))
    assert not any(tmp_path.iterdir())
    drive(ctl, clock, 0.6, 8, 1, random.Random(7))
    assert [p.name for p in tmp_path.iterdir()] == [KEY.file_name()]   # no temporary left
    assert json.loads(only_file(tmp_path).read_text())["steps_learned"] == \
        warm_state.SAVE_EVERY_STEPS


def test_the_state_is_saved_after_save_every_s_seconds_of_steps(tmp_path):
    now = [0.0]
    store = warm_state.WarmStore(tmp_path, KEY, clock=lambda: now[0])
    ctl, clock = controller(tmp_path, key=None)
    drive(ctl, clock, 0.6, 8, 3, random.Random(8))
    store.observed(ctl.policy)
    assert not any(tmp_path.iterdir())
    now[0] = warm_state.SAVE_EVERY_S
    store.observed(ctl.policy)
    assert json.loads(only_file(tmp_path).read_text())["steps_learned"] == 2


# ------------------------------------------------- what is not used, and why
def test_a_file_saved_for_another_key_is_ignored_with_one_line(tmp_path, caplog):
    learned(tmp_path)
    other = WarmKey(host=KEY.host, target=KEY.target, drafter=KEY.drafter, method=KEY.method, k=3)
    only_file(tmp_path).rename(tmp_path / other.file_name())
    with caplog.at_level(logging.INFO, logger=LOG):
        cold, clock = controller(tmp_path, key=other)
    assert drive(cold, clock, 0.6, 8, 1, random.Random(5)) == ["sweep"]
    (line,) = log_lines(caplog)
    assert line.levelno == logging.WARNING
    assert "starting cold" in line.message and "another key (differs in k)" in line.message


@pytest.mark.parametrize("text, why", [
    ("{\"schema\": \"vllm-vspec/warm-state\", \"form", "not JSON"),
    ("[1, 2]", "not a vllm-vspec warm state file"),
    ("{\"schema\": \"vllm-vspec/warm-state\", \"format\": 99}", "format 99"),
])
def test_a_corrupt_file_is_ignored_with_a_message_naming_it(tmp_path, caplog, text, why):
    (tmp_path / KEY.file_name()).write_text(text)
    with caplog.at_level(logging.INFO, logger=LOG):
        cold, clock = controller(tmp_path)
    assert drive(cold, clock, 0.6, 8, 1, random.Random(5)) == ["sweep"]
    (line,) = log_lines(caplog)
    assert str(tmp_path / KEY.file_name()) in line.message and why in line.message


def test_a_state_that_fails_half_way_leaves_the_policy_cold(tmp_path, caplog):
    learned(tmp_path)
    path = only_file(tmp_path)
    doc = json.loads(path.read_text())
    doc["state"]["acceptance"]["success"] = [9.0] * K
    doc["state"]["by_outcome"]["full"]["success"] = ["many"]        # fails after the others
    path.write_text(json.dumps(doc))
    untouched, _ = controller(tmp_path / "elsewhere")
    with caplog.at_level(logging.INFO, logger=LOG):
        cold, _ = controller(tmp_path)
    assert cold.policy.state() == untouched.policy.state()
    (line,) = log_lines(caplog)
    assert "starting cold" in line.message


def test_an_unwritable_directory_costs_one_line_and_no_crash(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.INFO, logger=LOG):
        ctl, clock = controller(blocker / "state")
        drive(ctl, clock, 0.6, 8, warm_state.SAVE_EVERY_STEPS * 2, random.Random(9))
        ctl.close()
    (line,) = log_lines(caplog)
    assert "warm state not saved" in line.message and str(blocker / "state") in line.message


def test_off_reads_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(warm_state.DIR_ENV, str(tmp_path))
    learned(tmp_path)
    before = only_file(tmp_path).read_text()
    cold, clock = controller("off")
    assert drive(cold, clock, 0.6, 8, 1, random.Random(5)) == ["sweep"]
    cold.close()
    assert only_file(tmp_path).read_text() == before


@pytest.mark.parametrize("policy", ["online", "fixed", "budget"])
def test_other_policies_keep_no_state(tmp_path, policy):
    clock = [0.0]
    cfg = VSpecConfig.from_dict({"policy": policy, "model_state_dir": str(tmp_path)}, K)
    ctl = GammaController(cfg, K, clock=lambda: clock[0], warm_key=KEY)
    for _ in range(3):
        ctl.decide(BatchState(8, 8192, 300.0))
        ctl.observe(feedback(random.Random(1), (0.6,) * K, 8, 2))
    ctl.close()
    assert not any(tmp_path.iterdir())


def test_auto_is_the_environment_s_directory_then_the_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(warm_state.DIR_ENV, str(tmp_path / "env"))
    assert warm_state.state_dir("auto") == tmp_path / "env"
    monkeypatch.delenv(warm_state.DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert warm_state.state_dir("auto") == tmp_path / "xdg" / "vllm-vspec" / "state"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert warm_state.state_dir("auto") == tmp_path / "home" / ".cache" / "vllm-vspec" / "state"
    assert warm_state.state_dir("off") is None
    assert warm_state.state_dir(str(tmp_path / "mine")) == tmp_path / "mine"


def test_the_default_is_auto():
    assert VSpecConfig().model_state_dir == warm_state.AUTO


# ------------------------------------------------- the vLLM scheduler's part
def _scheduler(state_dir: Path, k: int = 3):
    """vLLM's real Scheduler classes (no engine) on the bundled tiny target."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from conftest import TARGET
    from vllm_vspec.hosts.vllm.scheduler import VSpecScheduler

    model = ModelConfig(model=str(TARGET), dtype="float32", seed=0, max_model_len=512)
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512,
                                         max_model_len=512, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=16, gpu_memory_utilization=0.9,
                                 enable_prefix_caching=False),
        speculative_config=SpeculativeConfig(model="ngram", num_speculative_tokens=k),
        additional_config={"vspec": {"policy": "model", "model_state_dir": str(state_dir)}})
    config.cache_config.num_gpu_blocks = 64
    register_all_kvcache_specs(config)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1,
                                     dtype=torch.float32))])
    return VSpecScheduler(vllm_config=config, kv_cache_config=kv, block_size=16,
                          log_stats=False, structured_output_manager=StructuredOutputManager(config))


def test_the_scheduler_keys_its_state_by_host_models_method_and_k(tmp_path):
    from conftest import TARGET

    first = _scheduler(tmp_path)
    drive(first.vspec, [0.0], 0.6, 4, 20, random.Random(2))   # what its steps would teach
    learnt = first.vspec.policy.state()
    first.shutdown()
    key = json.loads(only_file(tmp_path).read_text())["key"]
    assert (key["policy"], key["method"], key["k"], key["target"], key["drafter"]) == \
        ("model", "ngram", 3, str(TARGET), "ngram")
    assert {"device", "cpu", "cpus", "dtype", "tensor_parallel", "vllm", "torch"} <= set(key["host"])
    assert key["host"]["device"] == "cpu" and key["host"]["dtype"] == "float32"
    second = _scheduler(tmp_path)
    assert second.vspec.policy.state() == learnt
    other_k = _scheduler(tmp_path, k=2)                         # another key: cold
    assert drive(other_k.vspec, [0.0], 0.6, 4, 1, random.Random(2)) == ["sweep"]
