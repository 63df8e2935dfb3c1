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
        accepted = []
        for _ in range(b):
            n = 0
            while n < previous and rng.random() < rate:
                n += 1
            accepted.append(n)
        fb = StepFeedback(drafted=(previous,) * b, accepted=tuple(accepted),
                          committed=sum(accepted) + b)
        ms = _true_ms(b, b * previous, gamma, verify_ms, pass_ms) * rng.uniform(0.99, 1.01)
        policy.observe(StepOutcome(fb, _batch(b), gamma, bucket_of(b), ms / 1000.0,
                                   fb.committed / ms * 1000.0, gamma == previous))
        previous = gamma
    policy.restore(policy.state())   # as a restarted server's: no cold sweep left
    return policy


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
    scheduler.requests = {f"r{i}": SimpleNamespace(num_computed_tokens=0) for i in range(8)}
    scheduler.scheduler_config = SimpleNamespace(max_num_batched_tokens=8192)
    scheduler.vspec_config = config
    step = _scheduled({f"r{i}": [] for i in range(8)})
    decision = scheduler._decide(step)
    assert decision.gamma == _oracle(8, rate, verify_ms, pass_ms) < K
    assert (decision.reason, decision.decided) == (LOWER, False)
