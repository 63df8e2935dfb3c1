"""`replay score --warm`: every contender is scored on its second pass over
a workload, its policy keeping what the first taught it (made-up
recordings, no engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_replay import PROFILE, made_up  # noqa: E402

from vllm_vspec.replay import score as sc  # noqa: E402


def scored(warm: bool) -> dict:
    shape = [sc.shapes(6, 12)["c8"]]
    return {r.policy: r for r in sc.score(made_up(), PROFILE, "", shape, policies=("model",),
                                          warm=warm)}


def test_a_policy_that_learns_nothing_scores_the_same_warm():
    cold, warm = scored(False), scored(True)
    for name in ("target", "fixed-1", "fixed-4", "table"):
        assert warm[name].seconds == pytest.approx(cold[name].seconds, rel=1e-9), name
        assert warm[name].gamma_steps == cold[name].gamma_steps, name


def test_a_warm_model_policy_is_timed_on_its_second_pass_only():
    cold, warm = scored(False), scored(True)
    # The same tokens, timed from the second pass's start (its timeline too).
    assert warm["model"].tokens == cold["model"].tokens
    assert warm["model"].timeline[0][0] < cold["model"].seconds
    # What it learnt in the first pass changes what it decides in the second.
    assert warm["model"].gamma_steps != cold["model"].gamma_steps


def scored_after(after: str | None) -> dict:
    shapes = sc.shapes(6, 12)
    return {r.policy: r for r in sc.score(made_up(), PROFILE, "", [shapes["c8"]],
                                          policies=("model",),
                                          after=shapes[after] if after else None)}


def test_after_another_workload_a_policy_that_learns_nothing_scores_the_same():
    cold, after = scored_after(None), scored_after("c1")
    for name in ("target", "fixed-1", "fixed-4", "table"):
        assert after[name].seconds == pytest.approx(cold[name].seconds, rel=1e-9), name
        assert after[name].gamma_steps == cold[name].gamma_steps, name


def test_after_another_workload_the_model_policy_goes_on_from_what_it_learnt_there():
    cold, after = scored_after(None), scored_after("c1")
    assert after["model"].tokens == cold["model"].tokens
    assert after["model"].gamma_steps != cold["model"].gamma_steps
