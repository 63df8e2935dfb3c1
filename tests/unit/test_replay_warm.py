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


def test_a_slow_start_stretches_only_the_first_steps_of_each_contender():
    shape = [sc.shapes(6, 12)["c8"]]
    plain = {r.policy: r for r in sc.score(made_up(), PROFILE, "", shape, policies=())}
    slow = {r.policy: r for r in sc.score(made_up(), PROFILE, "", shape, policies=(),
                                          slow_start=(2.0, 3))}
    for name in ("target", "fixed-2"):
        # A fixed gamma decides the same steps; its first three take twice as long.
        assert slow[name].gamma_steps == plain[name].gamma_steps, name
        first3 = plain[name].timeline[2][0]                   # (timeline rounded to 0.1 ms)
        assert slow[name].seconds == pytest.approx(plain[name].seconds + first3, abs=1e-4), name
        assert slow[name].seconds > plain[name].seconds * 1.01, name


def replay_score(tmp_path, *extra) -> int:
    """`vllm-vspec replay score` on the made-up recording (saved with its
    costs under tmp_path) with these options; its exit status."""
    from vllm_vspec.cli import main
    from vllm_vspec.core.latency import save_profile

    made_up().save(tmp_path / "r.json.gz")
    save_profile(PROFILE, tmp_path / "r.costs.json")
    return main(["replay", "score", "--recording", str(tmp_path / "r.json.gz"), *extra])


@pytest.mark.parametrize("value", ["1.3", "0:10", "1.3:-1", "x:10"])
def test_a_bad_slow_start_is_refused_naming_the_option(tmp_path, capsys, value):
    assert replay_score(tmp_path, "--slow-start", value, "--output-dir", str(tmp_path / "o")) == 2
    assert f"--slow-start={value!r} is not allowed" in capsys.readouterr().err


def drifted(drift, seed=0) -> dict:
    shape = [sc.shapes(6, 12)["c8"]]
    return {r.policy: r for r in sc.score(made_up(), PROFILE, "", shape, policies=(),
                                          drift=drift, seed=seed)}


def test_host_drift_stretches_a_fixed_gammas_steps_and_leaves_its_decisions_alone():
    plain, wandering = drifted((0.0, 0.0)), drifted((0.3, 0.05))
    for name in ("target", "fixed-2"):
        assert wandering[name].gamma_steps == plain[name].gamma_steps, name
        assert wandering[name].seconds != pytest.approx(plain[name].seconds, rel=1e-3), name


def test_host_drift_is_the_same_for_a_seed_and_differs_between_seeds():
    a, b, c = drifted((0.3, 0.05), 0), drifted((0.3, 0.05), 0), drifted((0.3, 0.05), 1)
    assert a["fixed-2"].seconds == b["fixed-2"].seconds
    assert a["fixed-2"].seconds != c["fixed-2"].seconds


def test_host_drift_wanders_about_1_with_the_stated_spread():
    from vllm_vspec.sim.simulator import HostDrift
    import math
    host = HostDrift(0.2, 1.0, seed=3)
    logs = [math.log(host.factor(t * 0.05)) for t in range(200000)]
    mean = sum(logs) / len(logs)
    sd = (sum((x - mean) ** 2 for x in logs) / len(logs)) ** 0.5
    assert abs(mean) < 0.03 and 0.17 < sd < 0.23
    # Correlated over its correlation time, nearly independent well past it.
    lag = lambda k: sum(logs[i] * logs[i + k] for i in range(len(logs) - k)) / (len(logs) - k) / sd ** 2  # noqa: E731
    assert lag(2) > 0.8 and abs(lag(200)) < 0.1


@pytest.mark.parametrize("value", ["0.1", "0.1:-5", "0.1:0", "x:10"])
def test_a_bad_drift_is_refused_naming_the_option(tmp_path, capsys, value):
    assert replay_score(tmp_path, "--drift", value, "--output-dir", str(tmp_path / "o")) == 2
    assert f"--drift={value!r} is not allowed" in capsys.readouterr().err


def score_cli(tmp_path, *extra) -> dict:
    import json

    out = tmp_path / ("o" + "-".join(extra))
    assert replay_score(tmp_path, "--policies", "online", "--workloads", "c8", "--requests-high", "12",
                        *extra, "--output-dir", str(out)) == 0
    return json.loads((out / "replay.json").read_text())


def test_families_scores_only_their_requests(tmp_path):
    every, easy = score_cli(tmp_path), score_cli(tmp_path, "--families", "easy")
    tokens = lambda r: {x["policy"]: x["tokens"] for x in r["results"]}  # noqa: E731
    # The easy family's drafts are accepted more: drafting gains more there.
    ratio = lambda r: r["ratios"]["c8"]["fixed-2"]["vs_target"]  # noqa: E731
    assert ratio(easy) > ratio(every)
    assert easy["meta"]["families"] == "easy"
    assert tokens(easy)["target"] == tokens(every)["target"]      # the same count of requests, all easy


def test_an_unknown_family_is_refused_naming_the_recordings_families(tmp_path, capsys):
    assert replay_score(tmp_path, "--families", "easy,medium", "--output-dir", str(tmp_path / "o")) == 2
    err = capsys.readouterr().err
    assert "--families='easy,medium' is not allowed" in err and "easy, hard" in err


def test_rounds_score_every_pass_after_the_warm_one_and_a_fixed_gamma_is_the_same_each_round():
    rec = made_up(n=6)
    shape = [sc.shapes(6, 12)["c8"]]
    one = {r.policy: r for r in sc.score(rec, PROFILE, "", shape, policies=())}
    three = {r.policy: r for r in sc.score(rec, PROFILE, "", shape, policies=(), warm=True,
                                           rounds=3)}
    # A fixed gamma learns nothing: three rounds take three times one round.
    assert three["fixed-2"].tokens == 3 * one["fixed-2"].tokens
    assert three["fixed-2"].seconds == pytest.approx(3 * one["fixed-2"].seconds)
    assert three["fixed-2"].steps == 3 * one["fixed-2"].steps
    assert three["fixed-2"].gamma_steps == {g: 3 * n for g, n in one["fixed-2"].gamma_steps.items()}
    assert len(three["fixed-2"].timeline) == 3 * len(one["fixed-2"].timeline)


def test_rounds_below_one_are_refused_naming_the_option(tmp_path, capsys):
    assert replay_score(tmp_path, "--rounds", "0") == 2
    assert "--rounds=0 is not allowed: an integer >= 1" in capsys.readouterr().err
