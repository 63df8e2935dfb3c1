"""The gamma of a padded step: one whose drafts the next step verifies
padded to 1 + K, so that the target keeps its full decode graph
(vLLM-Ascend's `ascend_pad_verify_width`; hosts/vllm/verify_width.py).

Rule: a padded step drafts K unless the `model` policy's own predictions,
priced for a padded step, say a smaller gamma commits more tokens per
millisecond. A padded step verifies K slots a request whatever its gamma,
so a gamma below K saves only draft passes and commits fewer tokens; it
can win only where draft passes cost more than the tokens they bring.

- Priced for a padded step: every gamma's step verifies B * K slots, so the
  policy's prediction (ModelPolicy.values, which prices a step at gamma g
  verifying B * g) is charged the fitted cost of the B * (K - g) slots it
  leaves out (through `values`' `shave`, negative).
- Priced by the rate alone (stock's K is the reference, whose steps
  a smaller gamma must beat; the policy's drain objective is not applied).
- Evidence only: the policy's acceptance means (no Thompson draw) and the
  cost fit's means; nothing is decided before the fit has MIN_SAMPLES
  measured steps and the acceptance posterior has judged a draft, and a
  gamma whose predicted step time the fit cannot price (relative standard
  error above the policy's PROBE_SPREAD) is never chosen; a smaller
  gamma's saving counts less MARGIN standard errors of it, so a gain within
  the fit's error holds K.
- No probes and no sweeps: deciding changes nothing of the policy (its
  sweep count, its random state, its probe bookkeeping), and the step
  stays undecided (`Decision.decided` False): its time is the padded
  verify's, not the gamma's, so it is no reward of the gamma and no
  sample of a cell (the policy's per-gamma price factors).
- Padded steps teach the policy (`observe_padded`, through the
  controller's undecided-step path: GammaController.undecided and
  observe_undecided, the interval rule of its prefill steps): the drafts
  a padded step verified (its real ones; the padding is the host's
  invalid drafts, never counted) update the acceptance posterior, and
  its time is a sample of the step-cost fit with the slots it verified
  (padding included: the target ran them) and the draft passes it ran.
  Without them a load that stays inside the padded range would hold K
  for good: its acceptance and what its steps cost would never be
  learnt. A draft pass's cost is told apart from the rest only by steps
  at different gammas (decided steps outside the padded range, a saved
  state, or padded steps below K); while nothing varied it, the fit
  cannot price a smaller gamma and K holds.
- Gamma 0 is never chosen: a step that drafts nothing is the controller's
  (the drafter's gamma-0 modes and their catch-up).
- Any other policy (fixed, online, profile, cycle, budget): K, as before.

No vLLM import here: the scheduler (VSpecScheduler._decide) and the Ascend
defaults' simulator (sim/ascend_defaults.py) both apply it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.policies.model import PROBE_SPREAD, ModelPolicy
from vllm_vspec.core.step_cost import FEATURES, MIN_SAMPLES, features
from vllm_vspec.core.steps import BatchState, Decision, StepFeedback, bucket_of

VERIFIED = FEATURES.index("verified")
HOLD, LOWER = "padded", "padded-model"
# Standard errors of its fitted saving that a smaller gamma's step time is
# charged: a gain within the fit's error is not shown (the policy's probe
# rule uses two as well).
MARGIN = 2.0


def padded_gamma(policy: Any, batch: BatchState, k: int, min_gamma: int = 1) -> int:
    """The gamma a padded step of `batch` drafts under `policy` (module
    docstring): K, or a smaller gamma >= max(min_gamma, 1) that the model
    policy's priced predictions show commits more per millisecond."""
    if not isinstance(policy, ModelPolicy) or k <= 1:
        return k
    cost = policy.cost
    if cost.samples < MIN_SAMPLES or policy.acceptance.evidence()[0] <= 0.0:
        return k
    gammas = list(range(max(min_gamma, 1), k + 1))
    if len(gammas) <= 1:
        return k
    b = max(batch.num_reqs, 1)
    theta = cost.fit()
    g = np.array(gammas, dtype=float)
    padded = features(b, float(b * k), g, 0.0, b * batch.mean_context_len)
    rel = cost.spread(padded) / np.maximum(np.minimum(padded @ theta, cost.mean_ms()), 1e-6)
    priced = [gamma for gamma, r in zip(gammas, rel.tolist()) if gamma == k or r <= PROBE_SPREAD]
    if priced == [k]:
        return k
    rows = padded[[gammas.index(gamma) for gamma in priced]]
    unverified = theta[VERIFIED] * b * (k - np.array(priced, dtype=float))
    # What a smaller gamma saves is its fitted saving less MARGIN standard
    # errors of that saving (0 at K).
    doubt = MARGIN * cost.spread(padded[-1] - rows)
    value = policy.values(batch, priced, draw=False, shave=-(unverified + doubt), drain=False)
    # Ties hold K.
    return max(priced, key=lambda gamma: (value[gamma], gamma))


def padded_decision(controller: Any, batch: Callable[[], BatchState], num_reqs: int,
                    k: int) -> Decision:
    """An undecided Decision for a padded step of `num_reqs` requests under
    `controller`'s policy (a GammaController; anything without `policy` and
    `config` holds K); `batch()` builds the step's BatchState, called only
    for the model policy. A GammaController records the step as undecided
    (GammaController.undecided): the host then reports its output through
    observe_undecided with `learn` from `padded_learner`."""
    policy, config = getattr(controller, "policy", None), getattr(controller, "config", None)
    gamma = k
    if isinstance(policy, ModelPolicy) and config is not None:
        gamma = padded_gamma(policy, batch(), k, config.min_gamma)
    if isinstance(controller, GammaController):
        controller.undecided(gamma)
    return Decision(gamma, bucket_of(num_reqs), HOLD if gamma == k else LOWER, decided=False)


def observe_padded(policy: Any, batch: BatchState, fb: StepFeedback, gamma: int,
                   verified: int, interval_s: float) -> None:
    """What a processed padded step teaches `policy` (the model policy;
    any other learns nothing here). `fb`: the step's feedback, its
    `drafted` the real drafts verified (the padding left out, as the host
    reports it); `gamma`: the drafts the step proposed; `verified`: the
    draft slots the target verified, padding included; `interval_s`: the
    step's time (the controller's interval rule).
    - Acceptance: `fb`'s drafts update the pooled posterior. Batch 1's
      posteriors by the last outcome (`by_outcome`) are left alone: inside
      the padded range no batch-1 step is decided, so the policy's last
      outcomes stay unknown there and the pooled posterior serves it.
    - Cost: one sample of the step-cost fit through the policy's own
      `observe_cost` (the path of its undecided prefill steps: catch-up,
      prompt tokens, and the lazy drafter's owed prompts priced as there),
      the step counted as verifying `verified` slots."""
    if not isinstance(policy, ModelPolicy):
        return
    policy.acceptance.update(fb.drafted, fb.accepted)
    # observe_cost prices the slots a step verified (the sum of `drafted`)
    # and tallies its committed tokens; here every slot the target ran.
    slots = StepFeedback(drafted=(verified,), accepted=(sum(fb.accepted),),
                         committed=fb.committed, width=fb.width)
    policy.observe_cost(batch, slots, gamma, interval_s)


def padded_learner(controller: Any, verified: int) -> Callable:
    """GammaController.observe_undecided's `learn` for a padded step that
    verified `verified` draft slots (padding included)."""
    def learn(batch: BatchState, fb: StepFeedback, gamma: int, interval_s: float) -> None:
        observe_padded(controller.policy, batch, fb, gamma, verified, interval_s)
    return learn


__all__ = ["HOLD", "LOWER", "observe_padded", "padded_decision", "padded_gamma", "padded_learner"]
