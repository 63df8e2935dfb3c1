"""Warm start in the real engine: a second engine of the same key (host,
models, method, K) starts from the state file the first one saved at
shutdown, so it skips the `model` policy's cold sweep (it may still probe a
gamma its restored fit cannot price), and its greedy
outputs stay token-identical to target-only (draft model, vspec's worker)."""

from __future__ import annotations

import json

import pytest

from conftest import DRAFT, assert_same_tokens, close_llm, greedy, make_llm

pytestmark = pytest.mark.engine

SPEC = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4}


def serve_once(state_dir, trace, prompts) -> tuple[list[list[int]], list[str]]:
    """One engine's greedy outputs of `prompts` and its decisions' reasons."""
    from vllm_vspec.core.trace import read_trace
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    llm = make_llm(speculative_config=SPEC, worker_cls=CPU_WORKER_CLS,
                   vspec={"policy": "model", "min_gamma": 0, "model_state_dir": str(state_dir),
                          "trace_path": str(trace)})
    try:
        out = greedy(llm, prompts)
    finally:
        close_llm(llm)
    return out, [step["reason"] for step in read_trace(trace)[1]]


def test_a_restarted_engine_starts_from_the_saved_state_and_stays_exact(tmp_path, prompts,
                                                                         reference):
    state = tmp_path / "state"
    first, reasons = serve_once(state, tmp_path / "first.jsonl", prompts)
    assert_same_tokens(first, reference, "model policy, cold")
    assert "sweep" in reasons
    (path,) = state.iterdir()
    assert json.loads(path.read_text())["steps_learned"] == len(reasons)

    second, warm_reasons = serve_once(state, tmp_path / "second.jsonl", prompts)
    assert_same_tokens(second, reference, "model policy, warm start")
    # No cold sweep: every decision is the restored model's own (its
    # choice, or a probe of a gamma the restored fit cannot price yet).
    assert warm_reasons and set(warm_reasons) <= {"model", "probe", "recheck"}
    assert warm_reasons.count("model") > len(warm_reasons) - warm_reasons.count("model")
    assert [p.name for p in state.iterdir()] == [path.name]
    assert json.loads(path.read_text())["steps_learned"] == len(reasons) + len(warm_reasons)
