"""Exact replay (vllm_vspec.replay): the recording file, acceptance taken
from it, and scoring, on recordings made up here (no engine; the engine
agreement is tests/engine/test_replay_engine.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from vllm_vspec.core.latency import LatencyProfile, LinearLatency
from vllm_vspec.replay import score as sc
from vllm_vspec.replay.recording import (RecordedRequest, Recording, RecordingError, load,
                                         predicted_accepts)

PROFILE = LatencyProfile(target=LinearLatency(0.0015, 0.165, 8.1),
                         draft=LinearLatency(0.00002, 0.019, 0.76), name="test")


def made_up(n: int = 12, length: int = 40, k: int = 4, seed: int = 0) -> Recording:
    """Requests of two families whose acceptance runs follow a greedy chain:
    a run of a at d continues as a - 1 at d + 1 (the chain from d + 1 is
    the tail of the one from d), and restarts at random elsewhere."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        family = ("easy", "hard")[i % 2]
        accept, prev = [], 0
        for _ in range(length - 1):
            a = prev - 1 if prev > 0 else min(k, int(rng.expovariate(0.5 if family == "easy" else 2.0)))
            accept.append(a)
            prev = a
        reqs.append(RecordedRequest(f"{family}/{i}", family, tuple(range(50 + i)),
                                    tuple(rng.randrange(100) for _ in range(length)), tuple(accept)))
    return Recording({"method": "draft_model", "target": "t", "num_speculative_tokens": k}, reqs)


def test_a_recording_reads_back_as_written(tmp_path):
    rec = made_up()
    path = rec.save(tmp_path / "r.json.gz")
    back = load(path)
    assert back.header == rec.header and back.requests == rec.requests


def test_the_same_recording_writes_the_same_bytes(tmp_path):
    a = made_up().save(tmp_path / "a.json.gz").read_bytes()
    assert made_up().save(tmp_path / "b.json.gz").read_bytes() == a


def test_a_recording_with_an_acceptance_run_out_of_range_is_refused_naming_the_request(tmp_path):
    rec = made_up(n=2)
    bad = rec.requests[1]
    rec.requests[1] = RecordedRequest(bad.key, bad.family, bad.prompt, bad.output,
                                      (9,) + bad.accept[1:])
    rec.save(tmp_path / "r.json.gz")
    with pytest.raises(RecordingError, match=f"request {bad.key}: `accept`"):
        load(tmp_path / "r.json.gz")


def test_a_missing_recording_names_the_command_that_writes_one(tmp_path):
    with pytest.raises(RecordingError, match="replay record"):
        load(tmp_path / "nothing.json.gz")


def test_recorded_acceptance_is_the_verified_length_capped_by_the_run():
    rec = made_up(n=3)
    acc = sc.RecordedAcceptance(rec.requests, rec.k)
    idx, done = np.array([0, 1, 2]), np.array([0, 5, 9])
    verify = np.array([4, 1, 0])
    got = acc.accepted(idx, done, verify, np.ones(3, dtype=np.int64), {})
    want = [min(v, rec.requests[i].accept[d]) for i, d, v in zip(idx, done, verify)]
    assert got.tolist() == want


def test_a_fixed_gamma_at_batch_1_takes_the_steps_the_recording_predicts():
    rec = made_up(n=4)
    shape = sc.Shape("c1", ((1, 4),))
    results = sc.score(rec, PROFILE, "", [shape], policies=())
    fixed2 = next(r for r in results if r.policy == "fixed-2")
    # The first decode step verifies what the prefill drafted (gamma 2, the
    # arm in force), then every step verifies gamma 2.
    want = sum(len(predicted_accepts(r, 0, [2] * r.decode_len)) for r in rec.requests)
    assert fixed2.steps == want
    assert fixed2.tokens == sum(r.decode_len for r in rec.requests)


def test_every_contender_commits_the_same_tokens():
    rec = made_up()
    results = sc.score(rec, PROFILE, "", list(sc.shapes(6, 12).values()), policies=("online",))
    for wl in {r.workload for r in results}:
        assert len({r.tokens for r in results if r.workload == wl}) == 1, wl


def test_scoring_is_deterministic_for_a_seed():
    rec = made_up()
    shapes = [sc.shapes(6, 12)["c8"]]

    def run(seed):
        res = sc.score(rec, PROFILE, "", shapes, policies=("online",), noise=0.1, seed=seed)
        return [(r.policy, r.seconds, r.gamma_steps) for r in res]
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_the_oracles_and_the_table_are_scored_beside_every_fixed_gamma():
    rec = made_up()
    results = sc.score(rec, PROFILE, "", [sc.shapes(6, 12)["c1"]], policies=("online",))
    names = [r.policy for r in results]
    assert names == ["target", "fixed-0", "fixed-1", "fixed-2", "fixed-3", "fixed-4", "table",
                     "online", "informed", "future"]
    rows = sc.ratio_rows(results)["c1"]
    assert rows["target"]["vs_target"] == 1.0
    assert max(r["vs_best_fixed"] for n, r in rows.items() if n.startswith("fixed-")) == 1.0


def test_the_informed_oracle_beats_every_fixed_gamma_when_families_differ_at_batch_1():
    # At batch 1 an easy request wants a long draft and a hard one none:
    # knowing each request's rates must beat any single gamma.
    rec = made_up(n=16, length=60)
    rows = sc.ratio_rows(sc.score(rec, PROFILE, "", [sc.Shape("c1", ((1, 16),))], policies=()))["c1"]
    assert rows["informed"]["vs_best_any"] > 1.0


def test_the_score_command_without_costs_names_the_command_that_measures_them(tmp_path, capsys):
    from vllm_vspec.cli import main

    made_up().save(tmp_path / "r.json.gz")
    assert main(["replay", "score", "--recording", str(tmp_path / "r.json.gz")]) == 2
    assert "vllm-vspec replay costs" in capsys.readouterr().err


def test_the_score_command_writes_its_table_json_and_plot(tmp_path, capsys):
    from vllm_vspec.cli import main
    from vllm_vspec.core.latency import save_profile

    made_up().save(tmp_path / "r.json.gz")
    save_profile(PROFILE, tmp_path / "r.costs.json")
    out = tmp_path / "out"
    assert main(["replay", "score", "--recording", str(tmp_path / "r.json.gz"),
                 "--workloads", "c1,c8", "--requests-low", "6", "--requests-high", "12",
                 "--output-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert "c1  (best fixed gamma" in text and "informed" in text
    body = json.loads((out / "replay.json").read_text())
    assert set(body["ratios"]) == {"c1", "c8"}
    assert (out / "replay.png").stat().st_size > 0


def test_a_cost_cell_is_its_fastest_instances_median():
    from vllm_vspec.replay.costs import cell_medians
    samples = [{"kind": "target", "ctx": 100, "n": 1, "ms": ms, "instance": i}
               for i, values in enumerate([(30, 31, 90), (20, 21, 22), (25, 26, 27)]) for ms in values]
    (cell,) = cell_medians(samples)
    assert cell["ms"] == 21


def test_the_cost_fit_recovers_a_host_whose_drafting_steps_pay_a_fixed_cost():
    from vllm_vspec.core.latency import LatencyProfile, LinearLatency, profile_predict
    from vllm_vspec.replay import costs
    true = LatencyProfile(target=LinearLatency(0.002, 0.8, 20.0), draft=LinearLatency(0.0, 0.05, 0.7),
                          speculate=LinearLatency(0.0, 0.1, 3.0))
    samples = []
    for b in (1, 8, 32):
        ctx = 200 * b
        samples.append({"kind": "target", "ctx": ctx, "n": b, "ms": true.step_ms(0, b, ctx)})
        samples += [{"kind": "step", "gamma": g, "batch": b, "ctx": ctx, "ms": true.step_ms(g, b, ctx)}
                    for g in range(1, 5)]
    fitted = costs.fit(samples, "t", "", "")
    for s in samples:
        assert profile_predict(fitted, s) == pytest.approx(s["ms"], rel=0.01)
    assert fitted.speculate.delta == pytest.approx(3.0, rel=0.05)


def test_the_cost_fit_prices_prompt_tokens_on_top_of_the_decode_steps():
    from vllm_vspec.core.latency import LatencyProfile, LinearLatency, PrefillCost
    from vllm_vspec.replay import costs
    true = LatencyProfile(target=LinearLatency(0.002, 0.0, 20.0), draft=LinearLatency(0.001, 0.0, 0.7),
                          speculate=LinearLatency(0.0, 0.1, 3.0), prefill=PrefillCost(0.4, 0.02))
    samples = []
    for b in (1, 8, 32):
        ctx, prompt = 200 * b, 180 * b
        samples += [{"kind": "step", "gamma": g, "batch": b, "ctx": ctx,
                     "ms": true.step_ms(g, b, ctx)} for g in range(5)]
        samples += [{"kind": "prefill", "engine": "step" if g else "target", "gamma": g,
                     "batch": b, "ctx": prompt, "tokens": prompt,
                     "ms": true.split_step_ms(b, g, b, prompt) + true.prompt_ms(prompt, g > 0)}
                    for g in (0, 2)]
    fitted = costs.fit(samples, "t", "", "")
    assert (fitted.prefill.target, fitted.prefill.draft) == pytest.approx((0.4, 0.02), rel=0.02)
    for row in costs.residuals(fitted, samples):
        assert row["error"] == pytest.approx(0.0, abs=0.01), row


def test_a_randomised_policy_is_scored_as_the_mean_over_its_seeds():
    rec = made_up()
    shape = [sc.shapes(6, 12)["c8"]]
    one = {r.policy: r for r in sc.score(rec, PROFILE, "", shape, policies=("model",))}
    seeds = sc.score(rec, PROFILE, "", shape, policies=("model",), policy_seeds=3)
    model = next(r for r in seeds if r.policy == "model")
    spread = model.seed_tok_s
    assert len(spread) == 3 and spread[0] == pytest.approx(one["model"].tok_s, rel=1e-3)
    assert model.tokens / model.seconds == pytest.approx(
        model.tokens / (sum(model.tokens / t for t in spread) / 3), rel=1e-6)


@pytest.mark.parametrize("mode, lazy", [("lazy", True), ("sync", False)])
def test_a_vspec_contender_knows_what_a_gamma_0_step_runs_as_the_engine_resolves_it(mode, lazy):
    # The engine resolves gamma0_mode `auto` for the method before the
    # policy is built; the replay's contenders are built with the replay's
    # mode, so a lazy drafter's skipped prompts are priced as served.
    rec = made_up()
    wl, acc = sc.workload_of(sc.shapes(6, 12)["c8"], rec)
    factories = dict(sc.contenders(rec, PROFILE, "", wl, acc, ("model",), {}, mode))
    controller = factories["model"](sc.SimClock(), sc._Seen())
    assert controller.policy.lazy is lazy


def test_a_demo_batch_starts_every_request_together_and_admits_no_other():
    rec = made_up(n=16)
    results = sc.score(rec, PROFILE, "", [sc.shapes()["b16"]], policies=())
    target = next(r for r in results if r.policy == sc.TARGET)
    # One request a slot, all at once: target-only commits a token per
    # request a step until the longest request ends.
    assert target.tokens == sum(r.decode_len for r in rec.requests)
    assert target.steps == max(r.decode_len for r in rec.requests)


def test_a_varied_workload_ends_its_requests_at_different_lengths_and_admits_one_at_a_time():
    rec = made_up(n=12, length=41)
    wl, acc = sc.workload_of(sc.shapes(6, 24)["c32v"], rec)
    # Every request keeps 25-100% of its 40 decode tokens, its acceptance
    # runs cut with it; no two requests in a row end alike.
    assert all(10 <= n <= 40 for n in acc.out_len.tolist())
    assert len(set(acc.out_len.tolist())) > len(acc.out_len) // 2
    assert [len(r.accept) for r in acc.requests] == acc.out_len.tolist()
    # Target-only commits exactly the cut requests' tokens.
    results = sc.score(rec, PROFILE, "", [sc.shapes(6, 24)["c32v"]], policies=())
    target = next(r for r in results if r.policy == sc.TARGET)
    assert target.tokens == int(acc.out_len.sum())
