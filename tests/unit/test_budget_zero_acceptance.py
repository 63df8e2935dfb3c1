"""The verify-budget policy recovers from a spell of zero acceptance.

A drafter can stop being useful for a while (a stretch of text it cannot
predict) and then be useful again. At depth 0 nothing is drafted, so the
policy learns only from its probes (one depth-1 step every
`probe_interval` steps). Rules checked here:
- the drafts a probe proposed are verified in full by the next step,
  however low the calibration rates them: a probe whose drafts are not
  verified teaches nothing, and the policy would stay at depth 0 for good;
- when the probes keep accepting clearly more than the calibration
  predicts, the calibration gives up its stale counts for what the probes
  measured, so the policy drafts again within a few probes instead of
  waiting for its whole window of judged slots to be replaced.

Host stand-in: B requests whose drafter reports probability Q for every
drafted token, each slot accepted with a fixed conditional rate (seeded),
and an exact linear step cost; the policy under test is the real
VerifyBudgetPolicy.
"""

from __future__ import annotations

import random

from vllm_vspec.core.budget.admission import survival
from vllm_vspec.core.budget.policy import BudgetSettings, DraftRow, VerifyBudgetPolicy, choose

K = 4
B = 8
Q = 0.15                  # the drafter's reported probability (under-confident)
GOOD = 0.8                # conditional acceptance while the drafter is useful
PER_STEP, PER_TOKEN, PER_PASS = 10.0, 1.0, 2.0


def step_ms(tokens: int, passes: int) -> float:
    return PER_STEP + PER_TOKEN * tokens + PER_PASS * passes


class Host:
    """Drives the policy: rows hold the drafts of the previous step's depth."""

    def __init__(self, seed: int = 0):
        self.policy = VerifyBudgetPolicy(K, BudgetSettings(gamma0_runs_drafter=False))
        self.rng = random.Random(seed)
        self.depth = K
        self.plans = []

    def run(self, rate: float, steps: int) -> list:
        plans = []
        for _ in range(steps):
            rows = [DraftRow(i, (Q,) * self.depth) for i in range(B)]
            plan = self.policy.plan(rows)
            accepted = []
            for k in plan.admitted:
                a = 0
                while a < k and self.rng.random() < rate:
                    a += 1
                accepted.append(a)
            self.policy.observe(plan, rows, accepted,
                                step_ms(B + plan.budget, self.policy.passes(plan.depth)))
            self.depth = plan.depth
            plans.append(plan)
        return plans


def drafting_share(plans) -> float:
    return sum(p.depth > 0 for p in plans) / len(plans)


def test_the_oracle_drafts_at_the_good_rate_and_not_at_zero():
    """The same rule with the true acceptance and the true cost: what the
    policy should come back to once the drafter is useful again."""
    fixed = lambda d: step_ms(B, d)                          # noqa: E731
    good = [survival([GOOD] * K)] * B
    depth, _, _ = choose(good, good, K, fixed, PER_TOKEN)
    assert depth >= 1
    zero = [survival([0.0] * K)] * B
    depth, admitted, _ = choose(zero, zero, K, fixed, PER_TOKEN)
    assert depth == 0 and admitted == [0] * B


def test_policy_drafts_again_soon_after_a_spell_of_zero_acceptance():
    host = Host()
    host.run(GOOD, 1000)
    spell = host.run(0.0, 1500)
    assert drafting_share(spell[-500:]) < 0.1          # it stopped drafting, as it should
    back = host.run(GOOD, 1000)
    # 1000 steps are 15 probes; the calibration window is 8192 judged slots.
    assert drafting_share(back[-500:]) > 0.9


def test_a_probes_drafts_are_verified_even_when_calibration_rates_them_low():
    host = Host()
    host.run(GOOD, 1000)
    policy = host.policy
    # The calibration has seen only rejections at Q, far more than its prior.
    for _ in range(2000):
        policy.calibration.update([(Q,)] * B, [1] * B, [0] * B)
    plans = host.run(GOOD, 3 * policy.settings.probe_interval)
    probes = [i for i, p in enumerate(plans[:-1]) if p.reason == "probe"]
    assert probes, "no probe in three probe intervals at depth 0"
    for i in probes:
        assert plans[i].depth == 1
        assert plans[i + 1].admitted == (1,) * B, (i, plans[i + 1])
