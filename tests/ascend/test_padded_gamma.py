"""The gamma of a padded step (core/padded_gamma.py): the next step verifies
1 + K slots a request whatever the gamma (vLLM-Ascend 0.23's verify padding
that keeps the target's full decode graph), so the step drafts K unless the
`model` policy's own predictions, priced for a padded step, show a smaller
gamma commits more per millisecond; it never probes.

The policy is the real ModelPolicy, taught through its own `observe` by
steps whose time follows a known linear cost and whose drafts are accepted
at a known rate; the oracle is the argmax of B * E(g) / T(B, verify B * K,
g passes) under those true parameters. Nothing here runs on an NPU.
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.padded_gamma import HOLD, LOWER, padded_decision, padded_gamma
from vllm_vspec.core.policies.model import ModelPolicy
from vllm_vspec.core.steps import BatchState, StepFeedback, StepOutcome, bucket_of

K = 4
BATCHES = (2, 4, 8)


def _true_ms(batch, verified, passes, verify_ms, pass_ms):
    """The step time the policy is taught (ms)."""
    return 4.0 + 0.3 * batch + verify_ms * verified + (pass_ms + 0.05 * batch) * passes + \
        0.5 * (passes > 0)


def _taught(rate, verify_ms, pass_ms, steps=400, seed=0):
    """A model policy after `steps` observed steps at random gammas and
    batch sizes, each draft accepted with probability `rate` (a run of
    matches ends at the first rejection)."""
    rng = random.Random(seed)
    policy = ModelPolicy(_config())
    previous = K
    for _ in range(steps):
        b, gamma = rng.choice(BATCHES), rng.randint(0, K)
        fb = _verified(rng, b, previous, rate)
        ms = _true_ms(b, b * previous, gamma, verify_ms, pass_ms) * rng.uniform(0.99, 1.01)
        policy.observe(StepOutcome(fb, _batch(b), gamma, bucket_of(b), ms / 1000.0,
                                   fb.committed / ms * 1000.0, gamma == previous))
        previous = gamma
    policy.restore(policy.state())   # as a restarted server's: no cold sweep left
    return policy


def _verified(rng, b, drafts, rate):
    """The feedback of a step whose `b` requests verify `drafts` drafts
    each, each accepted with probability `rate` (a run of matches ends at
    the first rejection)."""
    accepted = []
    for _ in range(b):
        n = 0
        while n < drafts and rng.random() < rate:
            n += 1
        accepted.append(n)
    return StepFeedback(drafted=(drafts,) * b, accepted=tuple(accepted),
                        committed=sum(accepted) + b)


def _config():
    return VSpecConfig.from_dict({"policy": "model"}, K).with_max_gamma(K)


def _batch(b):
    return BatchState(num_reqs=b, max_num_batched_tokens=8192, mean_context_len=0.0)


def _oracle(b, rate, verify_ms, pass_ms):
    """The gamma in 1..K that commits the most per ms on a padded step."""
    def value(g):
        return sum(rate ** i for i in range(g + 1)) / _true_ms(b, b * K, g, verify_ms, pass_ms)
    return max(range(1, K + 1), key=value)


def _unpadded_choice(policy, b):
    """What the policy's own model prefers for a step that verifies its gamma."""
    v = policy.values(_batch(b), list(range(1, K + 1)), draw=False)
    return max(v, key=v.get)


def test_holds_k_on_a_padded_step_when_drafting_pays():
    # Verify slots are dear and passes cheap: verifying only gamma, the
    # model would draft 1; padded, every gamma verifies B * K, so K pays.
    rate, verify_ms, pass_ms = 0.5, 1.0, 0.2
    policy = _taught(rate, verify_ms, pass_ms)
    assert _unpadded_choice(policy, 4) < K
    assert _oracle(4, rate, verify_ms, pass_ms) == K
    decision = padded_decision(SimpleNamespace(policy=policy, config=policy.config),
                               lambda: _batch(4), 4, K)
    assert (decision.gamma, decision.reason, decision.decided) == (K, HOLD, False)


def test_drops_below_k_where_draft_passes_cost_more_than_they_bring():
    rate, verify_ms, pass_ms = 0.3, 0.02, 3.0
    policy = _taught(rate, verify_ms, pass_ms)
    expected = _oracle(4, rate, verify_ms, pass_ms)
    assert expected < K
    decision = padded_decision(SimpleNamespace(policy=policy, config=policy.config),
                               lambda: _batch(4), 4, K)
    assert (decision.gamma, decision.reason, decision.decided) == (expected, LOWER, False)


def _state(policy):
    return (policy.swept, policy.rng.getstate(), policy._priced, policy.cost.samples,
            policy.acceptance.evidence())


@pytest.mark.parametrize("case", ["cold", "unpriced batch"])
def test_never_probes_on_a_padded_step(case):
    # Where the policy's own decide sweeps (cold: from K down) or probes (a
    # batch size far above those fitted: it would run gamma 1 to price it),
    # a padded step holds K and leaves the policy as it was.
    if case == "cold":
        policy, b, own = ModelPolicy(_config()), 4, (K, "sweep")
    else:
        policy, b, own = _taught(0.3, 0.02, 3.0), 1024, (1, "probe")
    assert copy.deepcopy(policy).decide(_batch(b), bucket_of(b), 1, K, K) == own
    before = _state(policy)
    assert padded_gamma(policy, _batch(b), K) == K
    assert _state(policy) == before


def test_other_policies_hold_k_and_never_build_the_batch():
    def batch():
        raise AssertionError("the batch is built only for the model policy")
    for controller in (object(), SimpleNamespace(policy=object(), config=None)):
        decision = padded_decision(controller, batch, 8, K)
        assert (decision.gamma, decision.reason, decision.decided) == (K, HOLD, False)


def test_the_scheduler_asks_the_rule_with_the_steps_batch():
    # VSpecScheduler._decide on a padded step (8 requests, capture 40 at
    # K = 4) applies the rule to the step's batch, undecided.
    from test_overlay import _padding_scheduler, _scheduled

    rate, verify_ms, pass_ms = 0.3, 0.02, 3.0
    policy = _taught(rate, verify_ms, pass_ms, seed=1)
    scheduler = _padding_scheduler(async_scheduling=False)
    config = _config()
    scheduler.vspec = SimpleNamespace(policy=policy, config=config)
    scheduler.requests = {f"r{i}": _request(0) for i in range(8)}
    scheduler.scheduler_config = SimpleNamespace(max_num_batched_tokens=8192)
    scheduler.vspec_config = config
    step = _scheduled({f"r{i}": [] for i in range(8)})
    decision = scheduler._decide(step)
    assert decision.gamma == _oracle(8, rate, verify_ms, pass_ms) < K
    assert (decision.reason, decision.decided) == (LOWER, False)


def _request(computed: int) -> SimpleNamespace:
    """The fields of a vLLM Request the scheduler's batch state reads."""
    return SimpleNamespace(num_computed_tokens=computed, max_tokens=64, num_output_tokens=0,
                           num_tokens=computed + 1)


# ------------------------------------------------------------ padded steps teach
class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _controller(policy=None):
    from vllm_vspec.core.controller import GammaController

    clock = _Clock()
    ctl = GammaController(_config(), K, clock=clock)
    if policy is not None:
        ctl.policy = policy
    return ctl, clock


def _padded_load(ctl, clock, b, rate, verify_ms, pass_ms, steps, seed=0):
    """`steps` padded steps of `b` requests through the controller's
    undecided path, as the scheduler runs them (padded_decision, then the
    step's output to observe_undecided with padded_learner): each verifies
    b * K slots, its real drafts those the step before drafted, each
    accepted with probability `rate`; its time the true cost of verifying
    b * K slots and running its gamma's passes. The gammas decided."""
    from vllm_vspec.core.padded_gamma import padded_learner

    rng = random.Random(seed)
    gammas, previous = [], K
    for _ in range(steps):
        decision = padded_decision(ctl, lambda: _batch(b), b, K)
        fb = _verified(rng, b, previous, rate)
        clock.now += _true_ms(b, b * K, decision.gamma, verify_ms, pass_ms) / 1000.0
        ctl.observe_undecided(_batch(b), fb, padded_learner(ctl, b * K))
        ctl.step_processed(busy=True)
        gammas.append(decision.gamma)
        previous = decision.gamma
    return gammas


def test_padded_steps_teach_a_drop_in_acceptance_and_the_step_moves_off_k():
    # The policy learnt the costs on unpadded steps while drafts were
    # accepted at 0.95 (K pays on a padded step); the load inside the
    # padded range accepts 0.3, where a padded step's passes cost more than
    # they bring. Only its padded steps can teach the policy so.
    verify_ms, pass_ms = 0.02, 3.0
    assert _oracle(4, 0.95, verify_ms, pass_ms) == K
    expected = _oracle(4, 0.3, verify_ms, pass_ms)
    assert expected < K
    ctl, clock = _controller(_taught(0.95, verify_ms, pass_ms))
    gammas = _padded_load(ctl, clock, 4, 0.3, verify_ms, pass_ms, steps=300)
    assert gammas[0] == K
    assert set(gammas[-50:]) == {expected}


@pytest.mark.parametrize("taught", [False, True])
def test_a_load_where_k_is_best_stays_at_k(taught):
    # Cold (padded steps alone: every step at K, so nothing tells a draft
    # pass's cost apart) or taught on unpadded steps, a padded load whose
    # drafts pay holds K on every step.
    rate, verify_ms, pass_ms = 0.8, 0.02, 0.2
    assert _oracle(4, rate, verify_ms, pass_ms) == K
    ctl, clock = _controller(_taught(rate, verify_ms, pass_ms) if taught else None)
    assert set(_padded_load(ctl, clock, 4, rate, verify_ms, pass_ms, steps=300)) == {K}


def test_padded_steps_leave_the_policys_decision_bookkeeping_alone():
    # They are samples of the cost fit and of acceptance, never a sweep, a
    # draw, a probe's memo or a cell's (per-gamma price) evidence.
    ctl, clock = _controller()
    policy = ctl.policy
    rng, cost_samples = policy.rng.getstate(), policy.cost.samples
    _padded_load(ctl, clock, 4, 0.3, 0.02, 3.0, steps=60)
    assert (policy.swept, policy.rng.getstate(), policy._priced, policy.cells) == \
        (0, rng, None, {})
    assert policy.cost.samples + policy.cost.skipped == cost_samples + 60
    assert policy.acceptance.evidence()[0] > 0


def test_a_padded_step_is_one_cost_sample_of_its_padded_slots_and_its_real_drafts():
    from vllm_vspec.core.padded_gamma import observe_padded
    from vllm_vspec.core.posterior import AcceptancePosterior
    from vllm_vspec.core.step_cost import features

    policy = ModelPolicy(_config())
    policy.observed_gamma = 2                  # no catch-up: the step before drafted
    seen = []
    policy.cost.observe = lambda x, ms: seen.append((x.tolist(), ms)) or True
    batch = BatchState(num_reqs=3, max_num_batched_tokens=8192, mean_context_len=100.0)
    fb = StepFeedback(drafted=(1, 1, 1), accepted=(1, 0, 1), committed=5)
    observe_padded(policy, batch, fb, 2, 3 * K, 0.04)
    assert seen == [(features(3, 3 * K, 2, 0, 300.0).tolist(), 40.0)]
    expected = AcceptancePosterior(K, policy.config.model_memory_steps)
    expected.update((1, 1, 1), (1, 0, 1))
    assert (policy.acceptance.success, policy.acceptance.failure) == \
        (expected.success, expected.failure)


def test_the_scheduler_teaches_the_policy_a_padded_steps_real_drafts_and_padded_slots(
        monkeypatch):
    # VSpecScheduler on padded steps of 8 requests (capture 40 at K = 4):
    # the first drafts 1 a request (the rule lowered it), so the second
    # verifies 1 real draft and 3 pads a request. Its output reaches the
    # policy with the real drafts' acceptance and all 32 slots' cost.
    from vllm.v1.core.sched.scheduler import Scheduler

    from test_overlay import _padding_scheduler, _scheduled
    import vllm_vspec.core.padded_gamma as padded

    monkeypatch.setattr(Scheduler, "_update_after_schedule", lambda self, so: None)
    monkeypatch.setattr(Scheduler, "update_from_output", lambda self, so, out: {})
    monkeypatch.setattr(padded, "padded_gamma", lambda policy, batch, k, lo: 1)
    ctl, clock = _controller()
    seen = []
    monkeypatch.setattr(ctl.policy, "observe_cost",
                        lambda batch, fb, gamma, s: seen.append((sum(fb.drafted), gamma)))
    scheduler = _padding_scheduler(async_scheduling=False)
    scheduler.vspec, scheduler.vspec_config = ctl, ctl.config
    scheduler._decided, scheduler._prefill_steps, scheduler._padded_steps = set(), set(), set()
    ids = [f"r{i}" for i in range(8)]
    scheduler.requests = {r: _request(10) for r in ids}
    scheduler.scheduler_config = SimpleNamespace(max_num_batched_tokens=8192)
    scheduler.has_unfinished_requests = lambda: True
    for spec, sampled in (([], [7]), ([5, -1, -1, -1], [5, 9])):
        step = _scheduled({r: list(spec) for r in ids})
        step.total_num_scheduled_tokens = sum(step.num_scheduled_tokens.values())
        scheduler._update_after_schedule(step)
        assert (step.num_spec_tokens_to_schedule, id(step) in scheduler._padded_steps) == (1, True)
        clock.now += 0.01
        scheduler.update_from_output(step, SimpleNamespace(
            sampled_token_ids=[list(sampled)] * 8, req_id_to_index={r: i for i, r in
                                                                     enumerate(ids)}))
    assert seen == [(0, 1), (32, 1)]
    # The second step's 8 real drafts, each accepted; a pad counted as a
    # draft would be a rejection at position 2.
    posterior = ctl.policy.acceptance
    assert (list(posterior.success), list(posterior.failure)) == ([8, 0, 0, 0], [0, 0, 0, 0])
