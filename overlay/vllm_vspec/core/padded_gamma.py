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
- Evidence only: the policy's acceptance means (no Thompson draw) and the
  cost fit's means; nothing is decided before the fit has MIN_SAMPLES
  measured steps and the acceptance posterior has judged a draft, and a
  gamma whose predicted step time the fit cannot price (relative standard
  error above the policy's PROBE_SPREAD) is never chosen; a smaller
  gamma's saving counts less MARGIN standard errors of it, so a gain within
  the fit's error holds K.
- No probes and no sweeps: nothing of the policy changes (its sweep count,
  its random state, its probe bookkeeping), and the step stays undecided
  (`Decision.decided` False): its time is the padded verify's, not the
  gamma's, so the controller does not learn from it.
- Gamma 0 is never chosen: a step that drafts nothing is the controller's
  (the drafter's gamma-0 modes and their catch-up).
- Any other policy (fixed, online, profile, cycle, budget): K, as before.

No vLLM import here: the scheduler (VSpecScheduler._decide) and the Ascend
defaults' simulator (sim/ascend_defaults.py) both apply it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from vllm_vspec.core.policies.model import PROBE_SPREAD, ModelPolicy
from vllm_vspec.core.step_cost import FEATURES, MIN_SAMPLES, features
from vllm_vspec.core.steps import BatchState, Decision, bucket_of

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
    value = policy.values(batch, priced, draw=False, shave=-(unverified + doubt))
    # Ties hold K.
    return max(priced, key=lambda gamma: (value[gamma], gamma))


def padded_decision(controller: Any, batch: Callable[[], BatchState], num_reqs: int,
                    k: int) -> Decision:
    """An undecided Decision for a padded step of `num_reqs` requests under
    `controller`'s policy (a GammaController; anything without `policy` and
    `config` holds K); `batch()` builds the step's BatchState, called only
    for the model policy."""
    policy, config = getattr(controller, "policy", None), getattr(controller, "config", None)
    gamma = k
    if isinstance(policy, ModelPolicy) and config is not None:
        gamma = padded_gamma(policy, batch(), k, config.min_gamma)
    return Decision(gamma, bucket_of(num_reqs), HOLD if gamma == k else LOWER, decided=False)


__all__ = ["HOLD", "LOWER", "padded_decision", "padded_gamma"]
