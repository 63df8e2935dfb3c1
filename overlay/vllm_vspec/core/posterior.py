"""Per-position draft acceptance as Beta posteriors (the `model` policy).

Feedback of one request in one step is (drafted d, accepted a): positions
1..a were accepted, position a + 1 was rejected when a < d, later ones were
not judged. Position j's rate is conditional, p_j = P(j accepted | 1..j-1
accepted), and E(g) = 1 + sum_{j<=g} prod_{i<=j} p_i is what a request
commits in a step that verifies g drafts.

Rules:
- Counts forget by judged tokens, not by steps: each token judged at a
  position multiplies that position's counts by 1 - 1/memory_tokens before
  it is added. A batch of 32 judges 32 tokens a step, a batch of 1 one, so
  memory is short in steps at large batches and long at batch 1, and it is
  always about `memory_tokens` judgements deep.
- A position that goes unjudged (gamma was lower) keeps its counts: its
  history is never replaced wholesale after an absence.
- Each position's prior is the posterior mean of the position before it
  (position 1: `first_prior`), worth `prior_strength` judgements: a
  position with little evidence borrows its neighbour's rate, and one with
  much evidence speaks for itself.

Plain Python: a few dozen float operations per step.
"""

from __future__ import annotations

import random
from typing import Sequence


class AcceptancePosterior:
    def __init__(self, num_positions: int, memory_tokens: float = 64.0,
                 prior_strength: float = 2.0, first_prior: float = 0.5):
        if num_positions < 1 or memory_tokens <= 1 or prior_strength <= 0 or not 0 < first_prior < 1:
            raise ValueError(f"AcceptancePosterior(num_positions={num_positions}, memory_tokens="
                             f"{memory_tokens}, prior_strength={prior_strength}, first_prior="
                             f"{first_prior}): need >= 1, > 1, > 0 and in (0, 1)")
        self.k = num_positions
        self.keep = 1.0 - 1.0 / memory_tokens
        self.prior_strength, self.first_prior = prior_strength, first_prior
        self.success = [0.0] * num_positions        # decayed accepted judgements
        self.failure = [0.0] * num_positions        # decayed rejected judgements

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        judged, won = [0] * self.k, [0] * self.k
        for d, a in zip(drafted, accepted):
            for j in range(min(a + 1, d, self.k)):
                judged[j] += 1
                won[j] += j < a
        for j in range(self.k):
            if judged[j]:
                f = self.keep ** judged[j]
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

