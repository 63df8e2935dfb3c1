"""The drain objective (core/drain.py) and the `model` policy's use of it:
one behaviour a test, no engine."""

from __future__ import annotations

import numpy as np

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.drain import PRIOR_MISSED, PRIOR_REFILLED, Refill, RequestRates, commit_moments, drain_steps
from vllm_vspec.core.policies.model import LASTING, ModelPolicy
from vllm_vspec.core.steps import BatchState, StepFeedback, StepOutcome

K = 4
PRIOR = PRIOR_REFILLED / (PRIOR_REFILLED + PRIOR_MISSED)


# ------------------------------------------------------------------ refill
def test_a_slot_freed_while_others_run_and_filled_before_they_end_counts_as_refilled():
    refill = Refill()
    refill.step(["a", "b", "c"])
    refill.step(["b", "c"])            # a ended, b and c run on
    refill.step(["b", "c", "d"])       # d takes its slot
    assert refill.rho > PRIOR + 0.2


def test_a_slot_freed_while_others_run_and_left_empty_until_they_end_counts_as_missed():
    refill = Refill()
    refill.step(["a", "b", "c"])
    refill.step(["b", "c"])
    refill.step(["c"])
    refill.step(["x", "y"])            # the batch drained; a new one starts
    assert refill.rho < PRIOR * 0.7


def test_requests_that_end_together_say_nothing_of_refills():
    refill = Refill()
    for wave in (["a", "b"], ["c", "d"], ["e", "f"]):
        refill.step(wave)
        refill.step(wave)
    assert refill.rho == PRIOR


# ------------------------------------------------------------------ request rates
def test_requests_are_alike_until_the_requests_that_left_show_a_spread():
    rates = RequestRates()
    rates.observe(["a", "b"], [1] * 2, [1, 0])
    m, sd = rates.multipliers(["a", "b"], 0.5)
    assert m.tolist() == [1.0, 1.0] and sd.tolist() == [0.0, 0.0]


def test_with_a_spread_between_requests_a_request_that_rejects_more_is_slower():
    rates = RequestRates()
    for i in range(20):          # requests that left: half always accepted, half never
        name = f"old{i}"
        rates.observe([name] * 20, [1] * 20, [i % 2] * 20)
        rates.left([name], 0.5)
    assert rates.tau2() > 0.1
    rates.observe(["good"] * 10 + ["bad"] * 10, [1] * 20, [1] * 10 + [0] * 10)
    m, sd = rates.multipliers(["good", "bad", "new"], 0.5)
    assert m[0] > 1.3 and m[1] < 0.7 and abs(m[2] - 1.0) < 1e-9
    assert sd[2] > sd[0]


# ------------------------------------------------------------------ drain steps
def test_at_gamma_0_requests_drain_in_their_own_tokens_steps():
    first, second = commit_moments([0.6] * K, [0])
    most, total = drain_steps(np.array([10.0, 30.0, 20.0]), np.ones(3), np.zeros(3), first, second)
    assert most.tolist() == [30.0] and total.tolist() == [60.0]


def test_drafting_makes_the_slowest_of_equal_requests_later_than_their_mean():
    first, second = commit_moments([0.5] * K, [1, 2])
    most, total = drain_steps(np.full(16, 64.0), np.ones(16), np.zeros(16), first, second)
    mean = total / 16
    assert (most > mean * 1.05).all()
    assert (np.abs(mean - 64.0 / first) < 1e-9).all()


# ------------------------------------------------------------------ policy
def _policy_on_a_tie(closed: bool) -> ModelPolicy:
    """A model policy whose cost model and acceptance make gamma 1 and
    gamma 0 commit about as many tokens a ms at batch 16: a step costs
    20 ms + 0.5 ms a request and token, a draft pass 10 ms; acceptance 0.5."""
    cfg = VSpecConfig.from_dict({"policy": "model", "min_gamma": 0, "model_thompson": False}, K)
    policy = GammaController(cfg, K).policy
    assert isinstance(policy, ModelPolicy)
    policy.swept = 1 << 30
    rng = np.random.default_rng(0)
    ids = [f"r{i}" for i in range(16)]
    for step in range(400):
        g = step % 3
        b = int(rng.integers(2, 17))
        batch = BatchState(b, 8192, 100.0, requests=tuple(ids[:b]), remaining=(64,) * b)
        acc = tuple(int(x) for x in rng.random(b) < 0.5) if g else ()
        fb = StepFeedback((g,) * b if g else (), tuple(a * g for a in acc) if g else (),
                          b + sum(acc), requests=tuple(ids[:b]) if g else ())
        ms = 20.0 + 0.5 * b * (1 + g) + 10.0 * g
        policy.observe(StepOutcome(fb, batch, g, 16, ms / 1000.0, 0.0, True))
    # What the slots showed: refilled while others ran, or left empty.
    policy.refill = Refill()
    for wave in range(40):
        names = [f"w{wave}-{i}" for i in range(3)]
        policy.refill.step(names)
        policy.refill.step(names[1:])
        policy.refill.step(names[1:] + [f"w{wave}-new"] if not closed else names[2:])
    return policy


def test_where_freed_slots_stay_empty_a_batch_that_only_ties_by_drafting_runs_at_gamma_0():
    policy = _policy_on_a_tie(closed=True)
    assert policy.refill.rho < 0.1
    ids = tuple(f"n{i}" for i in range(16))
    batch = BatchState(16, 8192, 100.0, requests=ids, remaining=(64,) * 16)
    v = policy.values(batch, list(policy.space.arms(batch, 0, K)), False)
    assert max(v, key=v.get) == policy.space.arm(0, 1)


def test_where_freed_slots_are_refilled_the_same_batch_is_priced_by_its_rate():
    closed, refilled = _policy_on_a_tie(closed=True), _policy_on_a_tie(closed=False)
    assert refilled.refill.rho > 0.9
    ids = tuple(f"n{i}" for i in range(16))
    batch = BatchState(16, 8192, 100.0, requests=ids, remaining=(64,) * 16)
    arms = list(closed.space.arms(batch, 0, K))
    v_closed, v_open = closed.values(batch, arms, False), refilled.values(batch, arms, False)
    gamma1 = closed.space.arm(1, 1)
    # Drafting loses more against gamma 0 where the batch drains.
    assert v_open[gamma1] / v_open[arms[0]] > v_closed[gamma1] / v_closed[arms[0]] * 1.03


def test_a_batch_that_leaves_its_bucket_in_a_few_steps_re_checks_nothing_unless_slots_are_refilled():
    ids = tuple(f"n{i}" for i in range(16))
    few = BatchState(16, 8192, 100.0, requests=ids, remaining=(3,) * 16)
    many = BatchState(16, 8192, 100.0, requests=ids, remaining=(64,) * 16)
    closed, refilled = _policy_on_a_tie(closed=True), _policy_on_a_tie(closed=False)
    arms = list(closed.space.arms(few, 0, K))
    assert closed._unsure(many, arms, False) is not None     # 64 steps left: worth a recheck
    assert closed._unsure(few, arms, False) is None
    assert refilled._unsure(few, arms, False) is not None


def test_the_horizon_of_a_draining_batch_is_the_tokens_left_when_it_leaves_its_bucket():
    policy = _policy_on_a_tie(closed=True)
    ids = tuple(f"n{i}" for i in range(12))
    # Bucket 16 holds batches of 9-16: the batch leaves it when its 4th
    # request ends, the one with the 9th most tokens left (here 30).
    left = (50, 45, 40, 35, 34, 33, 32, 31, 30, 5, 4, 3)
    rho = policy.refill.rho
    horizon = policy._horizon(BatchState(12, 8192, 100.0, requests=ids, remaining=left))
    assert abs(horizon - (rho * LASTING + (1 - rho) * 30)) < 1e-9
