"""Per-request verify budgets (core/budget, issue 28): admission is the
top-budget survival ranking and always a prefix per request, the pooled
step-cost model prices a batch size it never ran, the calibration converges and
reports its error, and on heterogeneous acceptance the budget beats every
batch-uniform gamma (analytically and in the simulator)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_vspec.core.budget.admission import admit, best_budget, ranked, survival
from vllm_vspec.core.budget.calibration import ConfidenceCalibrator
from vllm_vspec.core.budget.policy import (BudgetSettings, DraftRow, VerifyBudgetPolicy, choose,
                                           smoothed)
from vllm_vspec.core.step_cost import MIN_SAMPLES
from vllm_vspec.core.steps import bucket_of
from vllm_vspec.sim import budget_sim

REPO = Path(__file__).resolve().parents[2]
ASCEND = str(REPO / "profiles" / "ascend-910b-qwen25-14b-draft.json")

# Few distinct values, so that ties (within and across requests) are common.
acceptance = st.sampled_from([0.0, 0.3, 0.5, 0.5, 0.8, 1.0, 1.0])
rows_of_acceptance = st.lists(st.lists(acceptance, max_size=5), max_size=8)


# ------------------------------------------------------------------ admission
@settings(max_examples=300, deadline=None)
@given(rows_of_acceptance, st.integers(min_value=0, max_value=45))
def test_admitted_slots_are_the_top_budget_scores_and_a_prefix(rows, budget):
    scores = [survival(r) for r in rows]
    admitted = admit(scores, budget)
    total = sum(len(s) for s in scores)
    assert sum(admitted) == min(budget, total)
    assert all(0 <= k <= len(s) for k, s in zip(admitted, scores))
    # The admitted slots, read as prefixes, are exactly the first `budget`
    # slots of the documented order (-score, request, position).
    by_key = sorted(((s, r, j) for r, row in enumerate(scores) for j, s in enumerate(row)),
                    key=lambda t: (-t[0], t[1], t[2]))
    top = {(r, j) for _, r, j in by_key[:budget]}
    assert top == {(r, j) for r, k in enumerate(admitted) for j in range(k)}
    # No slot left out scores higher than an admitted one.
    left = [s for s, r, j in by_key[budget:]]
    kept = [s for s, r, j in by_key[:budget]]
    assert not left or not kept or max(left) <= min(kept)


@given(rows_of_acceptance)
def test_budget_zero_admits_nothing(rows):
    assert admit([survival(r) for r in rows], 0) == [0] * len(rows)


def test_ties_go_to_the_request_listed_first_then_the_earlier_position():
    scores = [survival([1.0, 1.0]), survival([1.0, 1.0])]
    assert admit(scores, 1) == [1, 0]
    assert admit(scores, 3) == [2, 1]
    assert [(r, j) for _, r, j in ranked(scores)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=12), st.integers(1, 64),
       st.floats(1.0, 50.0), st.floats(0.0, 2.0))
def test_best_budget_is_the_argmax(scores, base, fixed, per_slot):
    ordered = sorted(scores, reverse=True)
    cost = lambda n: fixed + per_slot * n                       # noqa: E731
    n, value = best_budget(ordered, base, fixed, per_slot)
    values = [(base + sum(ordered[:k])) / cost(k) for k in range(len(ordered) + 1)]
    assert value == pytest.approx(max(values)) and values[n] == pytest.approx(max(values))


def test_best_budget_ties_keep_the_smaller_budget():
    assert best_budget([0.0, 0.0], 4, 10.0, 0.0) == (0, 0.4)    # worthless slots: none
    assert best_budget([1.0, 0.0], 4, 10.0, 0.0) == (1, 0.5)
    assert best_budget([1.0, 1.0], 4, 10.0, 0.0, max_budget=1) == (1, 0.5)
    assert best_budget([0.5], 4, 8.0, 1.0) == (0, 0.5)          # 4.5 / 9 ms = 4 / 8 ms: a tie


# ------------------------------------------------------------------ cost model
def step_ms(batch: int, verified: int, passes: int, per_token: float = 0.25,
            per_pass: float = 12.0) -> float:
    """A host whose step costs 40 ms, `per_token` per token the target runs
    and `per_pass` per draft pass."""
    return 40.0 + per_token * (batch + verified) + per_pass * passes


def test_a_batch_size_seen_for_the_first_time_is_priced_from_the_others_steps():
    # Steps at batch sizes 2 and 16 only; batch 4 (a bucket of its own) never ran.
    policy, rng = VerifyBudgetPolicy(4), random.Random(0)
    for _ in range(40):
        for b in (2, 16):
            rows = [DraftRow(i, tuple(rng.random() for _ in range(4))) for i in range(b)]
            plan = policy.plan(rows)
            policy.observe(plan, rows, [rng.randint(0, k) for k in plan.admitted],
                           step_ms(b, plan.budget, policy.passes(plan.depth)))
    assert bucket_of(4) not in {bucket_of(2), bucket_of(16)}
    fixed, per_slot = policy.prices(4, 4)
    assert fixed == pytest.approx([step_ms(4, 0, policy.passes(d)) for d in range(5)], rel=0.02)
    assert per_slot == pytest.approx(0.25, rel=0.15)
    # So its first plan is a budget, not a cold start of its own.
    assert policy.plan([DraftRow(i, (0.9,) * 4) for i in range(4)]).reason == "budget"


# ------------------------------------------------------------------ calibration
def test_calibration_converges_on_an_overconfident_signal_and_reports_its_error():
    rng = random.Random(0)
    cal = ConfidenceCalibrator(num_positions=4, bins=10, window=1 << 20)
    for _ in range(3000):
        rows, verified, accepted = [], [], []
        for _ in range(8):
            pis = [rng.random() for _ in range(4)]
            probs = [p ** 0.4 for p in pis]                      # over-confident drafter
            a = 0
            while a < 4 and rng.random() < pis[a]:
                a += 1
            rows.append(probs)
            verified.append(4)
            accepted.append(a)
        cal.update(rows, verified, accepted)
    # Per bin of q the true acceptance is uniform over [lo**2.5, hi**2.5]:
    # the calibrated value converges to its mean (positions 0-2; position 3
    # is judged only after three acceptances, ~1/8 of the rows).
    for b in range(10):
        lo, hi = b / 10, (b + 1) / 10
        want = (lo ** 2.5 + hi ** 2.5) / 2
        for j in range(3):
            assert cal.predict(j, (lo + hi) / 2) == pytest.approx(want, abs=0.04), (b, j)
    report = cal.report()
    assert report.ece < 0.03 < 0.15 < report.raw_ece
    assert report.brier < report.raw_brier
    assert report.judged > 1000


def test_calibration_starts_from_the_draft_probability_and_learns_only_judged_slots():
    cal = ConfidenceCalibrator(num_positions=3)
    assert cal.predict(0, 0.37) == pytest.approx(0.37)
    cal.update([[0.9, 0.9, 0.9]], verified=[3], accepted=[0])    # slot 0 rejected, 1-2 unjudged
    assert cal.predict(0, 0.9) < 0.9
    assert cal.predict(2, 0.9) < 0.9                             # via the pooled bin
    assert cal.report().judged == pytest.approx(1.0)


# ------------------------------------------------------------------ the policy
def test_policy_cold_start_sweep_then_budget_and_validation():
    policy = VerifyBudgetPolicy(4)
    rng = random.Random(0)
    rows = [DraftRow(i, ()) for i in range(16)]
    reasons = []
    for _ in range(40):
        plan = policy.plan(rows)
        assert all(k <= len(r.probs) for k, r in zip(plan.admitted, rows))
        reasons.append(plan.reason)
        accepted = [rng.randint(0, k) for k in plan.admitted]
        policy.observe(plan, rows, accepted, step_ms(16, plan.budget, policy.passes(plan.depth)))
        rows = [DraftRow(i, tuple(rng.random() for _ in range(plan.depth))) for i in range(16)]
    # One sweep of depths 4..0, cold_start_steps (2) each, then budgets.
    assert reasons[:10] == ["cold-start"] * 10 and set(reasons[10:]) <= {"budget", "probe",
                                                                          "probe-verify"}
    assert policy.cost.samples == 40
    with pytest.raises(ValueError, match="need one of each"):
        policy.observe(plan, rows[:3], [0], 1.0)
    with pytest.raises(ValueError, match="cost_windw"):
        BudgetSettings.from_dict({"cost_windw": 3})


def test_budget_beats_every_uniform_gamma_when_acceptance_is_heterogeneous():
    # 8 requests: half the drafter predicts well, half it cannot. Cost: the
    # Ascend-figure target's per-token cost at batch 8 with cheap drafts.
    good, bad = [0.95, 0.9, 0.9, 0.85], [0.2, 0.1, 0.1, 0.1]
    rows = [survival(good if i % 2 == 0 else bad) for i in range(8)]
    fixed = lambda d: 40.0 + 0.25 * 8 + 3.0 * d                 # noqa: E731
    depth, admitted, value = choose(rows, rows, 4, fixed, 0.25)
    uniform = max((8 + sum(sum(r[:g]) for r in rows)) / (fixed(g) + 0.25 * 8 * g)
                  for g in range(5))
    assert value > uniform * 1.02
    assert depth >= 3 and all(admitted[i] == depth for i in range(0, 8, 2))
    assert all(admitted[i] <= 1 for i in range(1, 8, 2))        # at most the 0.2 slot


def test_the_depth_choice_reads_each_requests_smoothed_acceptance():
    assert smoothed(None, [0.5], 0.3, 3) == [0.5, 0.5, 0.5]             # repeats its last
    assert smoothed([0.5, 0.5, 0.5], [1.0], 0.3, 3) == pytest.approx([0.65, 0.5, 0.5])
    assert smoothed(None, [], 0.3, 2) == [1.0, 1.0]                      # optimistic, unmeasured
    with pytest.raises(ValueError, match="request_smoothing"):
        BudgetSettings.from_dict({"request_smoothing": 0.0})


# ------------------------------------------------------------------ simulator
@pytest.fixture(scope="module")
def sim_rows():
    """Batch 128 on the Ascend-figure profile, where verifying a slot costs
    enough (0.24 ms a token against a ~100 ms step) for the ranking to count."""
    workloads = [budget_sim.hetero(128, tokens=65536), budget_sim.uniform_levels(128, tokens=65536)]
    return {r["workload"]: r for r in budget_sim.summary(
        budget_sim.compare(workloads, ASCEND, 4, fixed=False))}


def test_sim_budget_is_near_the_oracle_and_ahead_of_online_when_heterogeneous(sim_rows):
    row = sim_rows["hetero-b128"]
    assert row["budget/oracle"] >= 0.95, row
    # Ahead of online. (The margin was 2.3% until the online policy's
    # evidence rule and batch-1 noise estimate, issue 29, made online 1.4%
    # better on this workload: 0.9% now.)
    assert row["budget/online"] > 1.0, row
    assert row["calibration"]["brier"] < row["calibration"]["raw_brier"]


def test_sim_budget_is_not_behind_online_when_acceptance_is_uniform(sim_rows):
    row = sim_rows["uniform-b128"]
    assert row["budget/online"] >= 0.97, row


def test_sim_command_runs_the_verify_budget_comparison(tmp_path, capsys):
    from vllm_vspec.cli import main as cli_main
    assert cli_main(["sim", "--profile", ASCEND, "--verify-budget", "--batches", "4",
                     "--scale", "0.1", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "hetero-b4" in out and "uniform-b4" in out and "budget/oracle" in out
    rows = json.loads((tmp_path / "verify_budget.json").read_text())["rows"]
    assert {r["workload"] for r in rows} == {"hetero-b4", "uniform-b4"}
    assert cli_main(["sim", "--profile", ASCEND, "--verify-budget", "--batches", "0"]) == 2
    assert "--batches='0': need comma-separated integers >= 1" in capsys.readouterr().err


def warmed(true=step_ms, batch: int = 8, steps: int = 60) -> VerifyBudgetPolicy:
    """A policy past its cold start on steps that cost `true(batch, verified, passes)`."""
    policy, rng = VerifyBudgetPolicy(4), random.Random(1)
    rows = [DraftRow(i, ()) for i in range(batch)]
    for _ in range(steps):
        plan = policy.plan(rows)
        policy.observe(plan, rows, [rng.randint(0, k) for k in plan.admitted],
                       true(batch, plan.budget, policy.passes(plan.depth)))
        rows = [DraftRow(i, tuple(rng.random() for _ in range(plan.depth))) for i in range(batch)]
    assert policy.cost.samples >= MIN_SAMPLES and policy.plan(rows).reason != "cold-start"
    return policy


WARM = warmed()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.05, 0.3, 0.5, 0.9, 0.99]), max_size=4),
                min_size=8, max_size=8))
def test_a_plan_admits_the_top_budget_of_its_own_calibrated_survival(probs):
    rows = [DraftRow(i, tuple(p)) for i, p in enumerate(probs)]
    plan = WARM.plan(rows)
    scores = [survival(WARM.calibration.row(r.probs)) for r in rows]
    assert list(plan.admitted) == admit(scores, plan.budget)
    assert all(k <= len(r.probs) for k, r in zip(plan.admitted, rows))
    assert 0 <= plan.depth <= 4 and plan.reason in ("budget", "probe", "probe-verify")


def test_when_verifying_does_not_pay_the_plan_is_a_target_only_step():
    # A slot costs more than a step's worth.
    policy = warmed(lambda b, v, p: step_ms(b, v, p, per_token=50.0, per_pass=200.0))
    plan = policy.plan([DraftRow(i, (0.9, 0.9, 0.9, 0.9)) for i in range(8)])
    assert plan.admitted == (0,) * 8 and plan.budget == 0 and plan.depth == 0
