"""Policy `budget` on exact replay: draft probabilities in the recording
file, per-request verify lengths in the event loop, and scoring, on
recordings made up here (no engine).

The oracle of the last test: a recording whose draft probabilities are
perfectly calibrated by construction (slot j of a chain is accepted, given
the slots before it were, with exactly the probability the drafter
reported for it) scored against a latency profile that is the truth (no
step noise): any fixed gamma is one of the plans the budget rule can
make, so the budget policy, learning its calibration and step costs
online from the replay's own steps, must come within a stated margin of
the best fixed gamma.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from vllm_vspec.core.latency import LatencyProfile, LinearLatency, load_profile
from vllm_vspec.replay import score as sc
from vllm_vspec.replay.recording import (PROBS_ENCODING, RecordedRequest, Recording,
                                         RecordingError, load, quantised)
from vllm_vspec.sim.simulator import SimClock, simulate

REPO = Path(__file__).resolve().parents[2]
K = 4
PROFILE = LatencyProfile(target=LinearLatency(0.0015, 0.165, 8.1),
                         draft=LinearLatency(0.00002, 0.019, 0.76), name="test")
# Within this share of the best fixed gamma (the oracle test): what the
# online calibration and cost fit may lose over a short replay.
MARGIN = 0.03


def calibrated(n: int = 12, length: int = 48, seed: int = 0) -> Recording:
    """Requests with acceptance levels spread over (0.05, 0.95); each chain
    slot's probability is drawn around its request's level (logit + N(0,
    1)), put on the file's 1/255 grid, and the slot is accepted, after an
    accepted slot before it, with exactly that probability."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        level = rng.uniform(0.05, 0.95)
        logit = math.log(level / (1 - level))
        accept, probs = [], []
        for _ in range(length - 1):
            q = tuple(quantised(1 / (1 + math.exp(-(logit + rng.gauss(0, 1))))) for _ in range(K))
            a = 0
            while a < K and rng.random() < q[a]:
                a += 1
            accept.append(a)
            probs.append(q)
        family = ("easy", "hard")[i % 2]
        reqs.append(RecordedRequest(f"{family}/{i}", family, tuple(range(40 + i)),
                                    tuple(rng.randrange(100) for _ in range(length)),
                                    tuple(accept), (), tuple(probs)))
    return Recording({"method": "draft_model", "target": "t", "num_speculative_tokens": K}, reqs)


def without_probs(rec: Recording) -> Recording:
    return Recording(dict(rec.header), [RecordedRequest(r.key, r.family, r.prompt, r.output,
                                                        r.accept, r.disagree)
                                        for r in rec.requests])


# ------------------------------------------------------------------ the file
def test_draft_probabilities_read_back_as_written(tmp_path):
    rec = calibrated(n=3)
    back = load(rec.save(tmp_path / "r.json.gz"))
    assert back.requests == rec.requests
    assert back.requests[0].draft_probs[5] == rec.requests[0].draft_probs[5]
    assert back.missing_draft_probs is None


def test_draft_probabilities_take_one_byte_per_slot(tmp_path):
    rec = calibrated(n=3)
    path = rec.save(tmp_path / "r.json.gz")
    with gzip.open(path, "rt") as f:
        body = json.load(f)
    assert body["header"]["draft_probs"] == PROBS_ENCODING
    stored = body["requests"][0]["draft_probs"]
    assert len(stored) == math.ceil(rec.requests[0].decode_len * K / 3) * 4   # base64 of bytes


def test_a_probability_is_kept_to_the_nearest_255th():
    assert quantised(0.5) == 128 / 255
    assert quantised(1.0) == 1.0 and quantised(0.0) == 0.0
    assert abs(quantised(0.3333) - 0.3333) <= 0.5 / 255


def test_a_recording_without_draft_probabilities_loads_and_says_budget_cannot_be_scored(tmp_path):
    # The format recordings had before draft probabilities: no header key,
    # no request field.
    rec = calibrated(n=2)
    body = {"schema": 1, "header": rec.header,
            "requests": [{"key": r.key, "family": r.family, "prompt": list(r.prompt),
                          "output": list(r.output), "accept": list(r.accept), "disagree": []}
                         for r in rec.requests]}
    path = tmp_path / "old.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(body, f)
    old = load(path)
    assert [r.accept for r in old.requests] == [r.accept for r in rec.requests]
    assert all(r.draft_probs is None for r in old.requests)
    assert "no draft probabilities" in sc.unscorable(old, ["online", "budget"])["budget"]
    assert sc.unscorable(rec, ["online", "budget"]) == {}


def test_draft_probabilities_of_the_wrong_length_are_refused_naming_the_request(tmp_path):
    rec = calibrated(n=2)
    bad = rec.requests[1]
    rec.requests[1] = RecordedRequest(bad.key, bad.family, bad.prompt, bad.output, bad.accept,
                                      (), bad.draft_probs[:-1])
    rec.save(tmp_path / "r.json.gz")
    with pytest.raises(RecordingError, match=f"request {bad.key}: `draft_probs`"):
        load(tmp_path / "r.json.gz")


# ------------------------------------------------------------------ scoring
def test_budget_is_left_out_of_a_score_on_a_recording_without_probabilities():
    rec = without_probs(calibrated(n=6))
    results = sc.score(rec, PROFILE, "", [sc.shapes(4, 8)["c1"]], policies=("online", "budget"))
    assert "budget" not in {r.policy for r in results} and "online" in {r.policy for r in results}


def test_the_score_command_says_why_budget_was_not_scored(tmp_path, capsys):
    from vllm_vspec.cli import main
    from vllm_vspec.core.latency import save_profile

    without_probs(calibrated(n=6)).save(tmp_path / "r.json.gz")
    save_profile(PROFILE, tmp_path / "r.costs.json")
    assert main(["replay", "score", "--recording", str(tmp_path / "r.json.gz"), "--workloads", "c1",
                 "--requests-low", "4", "--policies", "online,budget",
                 "--output-dir", str(tmp_path / "out")]) == 0
    assert "budget: not scored: the recording has no draft probabilities" in capsys.readouterr().out
    meta = json.loads((tmp_path / "out" / "replay.json").read_text())["meta"]
    assert "budget" in meta["not_scorable"]


def budget_run(rec: Recording, shape: sc.Shape, profile: LatencyProfile = PROFILE):
    """One budget run through the real controller, with every step's
    (requests, positions, verified, accepted) as the admission saw them."""
    wl, acc = sc.workload_of(shape, rec)
    factory = sc.controller(rec, {}, **sc.policy_settings("budget", "", "lazy"))
    clock, seen = SimClock(), sc._Seen()
    policy = factory(clock, seen)
    admission = sc.admission_of(policy, acc, 8192)
    steps = []
    verified = admission.verified

    def record(verify, accepted, decided):
        steps.append((seen.idx.copy(), seen.done.copy(), verify.copy(), accepted.copy()))
        verified(verify, accepted, decided)
    admission.verified = record
    result = simulate(wl, profile, policy, clock, name="budget", max_gamma=K, noise=0.0,
                      gamma0_mode="lazy", acceptance=acc, on_batch=seen, prefill=True,
                      admission=admission)
    return result, acc, steps


def test_each_request_accepts_the_shorter_of_its_verified_prefix_and_its_recorded_run():
    rec = calibrated()
    _, acc, steps = budget_run(rec, sc.Shape("c8", ((8, 24),)))
    mixed = 0
    for idx, done, verify, accepted in steps:
        assert accepted.tolist() == np.minimum(verify, acc.runs[idx, done]).tolist()
        mixed += len(set(verify.tolist())) > 1
    assert mixed > len(steps) // 4, f"only {mixed} of {len(steps)} steps verified different lengths"


def test_budget_commits_every_token_of_the_recording():
    rec = calibrated()
    results = sc.score(rec, PROFILE, "", list(sc.shapes(6, 24).values()), policies=("budget",))
    for wl in {r.workload for r in results}:
        tokens = {r.policy: r.tokens for r in results if r.workload == wl}
        assert "budget" in tokens and len(set(tokens.values())) == 1, (wl, tokens)


def test_budget_scoring_is_deterministic_for_a_seed():
    rec = calibrated()
    shapes = [sc.shapes(6, 24)["c8"]]

    def run(seed):
        res = sc.score(rec, PROFILE, "", shapes, policies=("budget",), noise=0.1, seed=seed)
        return [(r.policy, r.seconds, r.gamma_steps) for r in res if r.policy == "budget"]
    assert run(3) == run(3)
    assert run(3) != run(4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_budget_with_calibrated_probabilities_and_true_costs_keeps_up_with_the_best_fixed_gamma(seed):
    costs = REPO / "profiles" / "replay" / "draft_model-k4.costs.json"
    rec = calibrated(n=24, length=64, seed=seed)
    shapes = sc.shapes(24, 96)
    rows = sc.ratio_rows(sc.score(rec, load_profile(costs), str(costs),
                                  [shapes["c1"], shapes["c8"]], policies=("budget",)))
    for wl, by in rows.items():
        assert by["budget"]["vs_best_fixed"] >= 1 - MARGIN, (
            f"{wl}: budget {by['budget']['tok_s']:.1f} tok/s is "
            f"{by['budget']['vs_best_fixed']:.3f} of the best fixed gamma")
