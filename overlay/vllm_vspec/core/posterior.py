"""Per-position draft acceptance as Beta posteriors (the `model` policy).

Feedback of one request in one step is (drafted d, accepted a): positions
1..a were accepted, position a + 1 was rejected when a < d, later ones were
not judged. Position j's rate is conditional, p_j = P(j accepted | 1..j-1
accepted), and E(g) = 1 + sum_{j<=g} prod_{i<=j} p_i is what a request
commits in a step that verifies g drafts.

Rules:
- Counts forget by steps that judge them: a step that judges a position
  multiplies that position's counts by 1 - 1/memory_steps once, then adds
  its judgements. Memory is about `memory_steps` steps at every batch
  size, the time over which a batch's requests (at batch 1, the request)
  turn over, and a batch of B brings B times the evidence per step, so
  the estimate is sharpest where the decision is closest (large batches,
  where one gamma beats another by a few percent).
- A position that goes unjudged (gamma was lower) keeps its rate, and its
  confidence fades at the same pace down to EVIDENCE_FLOOR judgements: its
  history is never replaced wholesale after an absence, and a rate
  measured long ago is uncertain enough that Thompson sampling re-checks
  it (after a stretch at gamma 0, a drafter that has become good is found
  within a bounded number of steps).
- Each position's prior is the posterior mean of the position before it
  (position 1: `first_prior`), worth `prior_strength` judgements: a
  position with little evidence borrows its neighbour's rate, and one with
  much evidence speaks for itself.

Plain Python and numpy: a few dozen float operations per step, the
judgements of a large batch counted with array operations.
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

# Judgements an unjudged position's confidence fades down to (its rate is
# kept): with the prior's, a rate known to about +-0.15, so a stretch at a
# lower gamma leaves the position worth re-checking without forgetting it.
EVIDENCE_FLOOR = 8.0
# Requests in a step from which its judgements are counted with arrays
# (fewer: a Python loop is quicker).
VECTOR_FROM = 64


class AcceptancePosterior:
    def __init__(self, num_positions: int, memory_steps: float = 64.0,
                 prior_strength: float = 2.0, first_prior: float = 0.5):
        if num_positions < 1 or memory_steps <= 1 or prior_strength <= 0 or not 0 < first_prior < 1:
            raise ValueError(f"AcceptancePosterior(num_positions={num_positions}, memory_steps="
                             f"{memory_steps}, prior_strength={prior_strength}, first_prior="
                             f"{first_prior}): need >= 1, > 1, > 0 and in (0, 1)")
        self.k = num_positions
        self.keep = 1.0 - 1.0 / memory_steps
        self.prior_strength, self.first_prior = prior_strength, first_prior
        self.success = [0.0] * num_positions        # decayed accepted judgements
        self.failure = [0.0] * num_positions        # decayed rejected judgements

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        # A request judges positions j < min(a + 1, d, K) and wins those j < a.
        if len(drafted) > VECTOR_FROM:
            a = np.asarray(accepted)
            reach = np.minimum(np.minimum(a + 1, np.asarray(drafted)), self.k)
            wins = np.minimum(a, reach)
            judged = [int((reach > j).sum()) for j in range(self.k)]
            won = [int((wins > j).sum()) for j in range(self.k)]
        else:
            judged, won = [0] * self.k, [0] * self.k
            for d, a in zip(drafted, accepted):
                for j in range(min(a + 1, d, self.k)):
                    judged[j] += 1
                    won[j] += j < a
        for j in range(self.k):
            if judged[j]:
                f = self.keep
            else:
                # Unjudged: its rate is kept, its confidence fades to the floor.
                n = self.success[j] + self.failure[j]
                f = max(self.keep, min(1.0, EVIDENCE_FLOOR / n)) if n > 0 else 1.0
            self.success[j] = self.success[j] * f + won[j]
            self.failure[j] = self.failure[j] * f + judged[j] - won[j]

    def evidence(self) -> list[float]:
        """Decayed judgements per position."""
        return [s + f for s, f in zip(self.success, self.failure)]

    def _chain(self, draw) -> list[float]:
        """Rates per position, each position's prior centred on the rate
        `draw` gave the one before."""
        rates, prior = [], self.first_prior
        for s, f in zip(self.success, self.failure):
            a = s + self.prior_strength * prior
            b = f + self.prior_strength * (1.0 - prior)
            prior = draw(a, b)
            rates.append(prior)
        return rates

    def mean(self) -> list[float]:
        """Posterior mean rate per position."""
        return self._chain(lambda a, b: a / (a + b))

    def sample(self, rng: random.Random) -> list[float]:
        """One draw of the rates (Thompson sampling)."""
        return self._chain(lambda a, b: min(max(rng.betavariate(a, b), 1e-6), 1.0 - 1e-6))

    def snapshot(self) -> dict:
        return {"success": [round(x, 3) for x in self.success],
                "failure": [round(x, 3) for x in self.failure],
                "mean": [round(x, 4) for x in self.mean()]}

    def restore(self, state: dict) -> None:
        """Counts from `snapshot()` (positions beyond this K are dropped)."""
        for name in ("success", "failure"):
            values = [float(x) for x in state.get(name, [])][:self.k]
            setattr(self, name, values + [0.0] * (self.k - len(values)))

