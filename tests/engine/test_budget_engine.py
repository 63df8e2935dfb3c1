"""Per-request verify budgets (`policy: budget`, issue 28) on a real engine.

Spec: with the deep bundled target and the bundled draft (float32, greedy),
a budget engine's outputs are token-identical to target-only decoding
- with the admission scripted so that every step gives requests different
  verified lengths, 0 for some and K for others in the same step, and the
  draft depth changes every step (depth 0 included): the test then counts,
  per step and per request, the drafts vLLM verified, and they are exactly
  the prefix the admission chose;
- with the policy's own choices (cold-start sweep, then the online cost
  model), rerunning the same prompts (prefix-cache hits), verified ==
  admitted again;
- across preemptions (a KV cache too small for the batch).
The drafts reach the scheduler with the draft model's probability of every
drafted token (ScoredDraftTokenIds), each in (0, 1].

One engine for the scripted and the policy runs (the module's `budget`
fixture), one small-KV engine for preemption; the reference is the deep
target alone.
"""

from __future__ import annotations

import pytest

from conftest import (DEEP_TARGET, DRAFT, assert_same_tokens, close_llm, greedy, make_llm,
                      run_preempted, scheduler_of)
from vllm_vspec.core.budget.policy import BudgetPlan
from vllm_vspec.core.step_cost import MIN_SAMPLES
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

pytestmark = pytest.mark.engine

K = 4
SPEC = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": K}
BUDGET = {"policy": "budget", "min_gamma": 0}
MAX_TOKENS = 40
# Depth of the drafts each scripted step proposes (verified the step after).
DEPTHS = (4, 4, 2, 0, 3, 4, 1, 4, 0, 4, 3)


@pytest.fixture(scope="module")
def deep_reference(prompts):
    llm = make_llm(DEEP_TARGET)
    try:
        return greedy(llm, prompts, MAX_TOKENS)
    finally:
        close_llm(llm)


class ScriptedPlans:
    """Replaces the budget policy's plan: request i of step s is admitted
    a different share of its draft each step (0, all, 1, 2, 3 in turn,
    shifted by i), and the depth follows DEPTHS."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self, rows, max_num_batched_tokens=None) -> BudgetPlan:
        s, self.step = self.step, self.step + 1
        shares = (0, K, 1, 2, 3)
        admitted = tuple(min(shares[(s + i) % len(shares)], len(r.probs))
                         for i, r in enumerate(rows))
        return BudgetPlan(admitted, DEPTHS[s % len(DEPTHS)], 1, "scripted", 0.0, None)


@pytest.fixture(scope="module")
def budget(deep_reference, prompts):
    """(scripted run, policy run): each (outputs, per-step admissions,
    probabilities seen); one engine, the policy run second (the same
    prompts: prefix-cache hits)."""
    llm = make_llm(DEEP_TARGET, speculative_config=SPEC, worker_cls=CPU_WORKER_CLS,
                   vspec=BUDGET)
    try:
        sched = scheduler_of(llm)
        admission = sched._budget
        assert admission is not None, "policy budget built no BudgetAdmission"
        seen: list[list[float]] = []
        drafted = admission.drafted

        def record(draft_token_ids):
            seen.extend(getattr(draft_token_ids, "draft_probs", None) or [[]])
            drafted(draft_token_ids)

        admission.drafted = record
        core = sched.vspec.policy.core
        runs = []
        for script in (ScriptedPlans(), None):
            admission.history, seen[:] = [], []
            if script is not None:
                core.plan = script
            try:
                outputs = greedy(llm, prompts, MAX_TOKENS)
            finally:
                core.__dict__.pop("plan", None)
            runs.append((outputs, list(admission.history), list(seen)))
        snapshot = sched.vspec.policy.snapshot()
    finally:
        close_llm(llm)
    return runs, snapshot


def test_scripted_admission_is_token_exact(budget, deep_reference):
    outputs, _, _ = budget[0][0]
    assert_same_tokens(outputs, deep_reference, "budget, scripted per-request lengths")


def test_scripted_admission_is_what_vllm_verified(budget):
    _, steps, _ = budget[0][0]
    decode = [s for s in steps if s.admitted]
    assert len(decode) >= 10, f"only {len(decode)} steps with decode requests"
    mixed = 0
    for n, s in enumerate(decode):
        for req, k in s.admitted.items():
            assert s.verified.get(req, 0) == k, (
                f"step {n}: request {req} admitted {k} of {s.drafted[req]} drafts, "
                f"vLLM verified {s.verified.get(req, 0)}")
        lengths = set(s.verified.values())
        mixed += 0 in lengths and K in lengths
    assert mixed >= 3, f"only {mixed} steps verified 0 drafts for one request and {K} for another"
    # Per request, its verified length changes from one step to the next.
    for req in decode[0].admitted:
        seq = [s.verified[req] for s in decode if req in s.verified]
        assert len(set(seq)) >= 3, f"request {req} verified {seq}"
    # A decided step drafts the plan's depth; after a depth-0 step the next
    # one has no drafts to verify.
    assert all(s.gamma == s.depth for s in decode if s.decided), [
        (s.gamma, s.depth) for s in decode if s.decided]
    after_zero = [b for a, b in zip(steps, steps[1:]) if a.gamma == 0 and b.admitted]
    assert after_zero and all(not any(b.drafted.values()) for b in after_zero), (
        [b.drafted for b in after_zero])


def test_drafts_carry_the_draft_models_probabilities(budget):
    _, _, seen = budget[0][0]
    flat = [q for row in seen for q in row]
    assert flat, "no draft probabilities reached the scheduler"
    assert all(0.0 < q <= 1.0 for q in flat), [q for q in flat if not 0.0 < q <= 1.0][:8]
    assert len(set(round(q, 4) for q in flat)) > 10, "probabilities do not vary"


def test_policy_run_is_token_exact_and_admits_what_it_verifies(budget, deep_reference):
    (outputs, steps, _), snapshot = budget[0][1], budget[1]
    assert_same_tokens(outputs, deep_reference, "budget policy, prefix-cache hits")
    decode = [s for s in steps if s.admitted]
    assert decode
    for n, s in enumerate(decode):
        # A running request the host then did not schedule this step (its
        # token budget or KV blocks ran out) verifies nothing; every request
        # it scheduled verifies exactly its admitted prefix.
        for req, k in s.admitted.items():
            if req in s.verified:
                assert s.verified[req] == k, (n, req, k, s.verified[req])
        assert any(req in s.verified for req in s.admitted), (n, s)
    reasons = {s.reason for s in decode if s.decided}
    assert reasons and reasons <= {"cold-start", "budget", "probe"}, reasons
    # The pooled cost model learned from the engine's decided steps.
    assert snapshot["cost_model"]["samples"] >= MIN_SAMPLES, snapshot
    assert snapshot["calibration"]["judged"] > 0, snapshot


def test_budget_is_token_exact_across_preemption(deep_reference, prompts):
    llm = make_llm(DEEP_TARGET, speculative_config=SPEC, worker_cls=CPU_WORKER_CLS,
                   vspec=BUDGET, kv_cache_memory_bytes=32 << 20, max_model_len=256,
                   disable_log_stats=False)     # the preemption counter
    outputs = run_preempted(llm, lambda: greedy(llm, prompts, MAX_TOKENS))
    assert_same_tokens(outputs, deep_reference, "budget policy across preemption")
