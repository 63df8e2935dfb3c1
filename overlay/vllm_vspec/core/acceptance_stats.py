"""Per-position draft acceptance, tracked online, and the expected tokens E(k).

Feedback of one request in one step is (drafted d, accepted a): draft positions
i < a were accepted, position a was rejected when a < d, and positions after a
were never looked at. So the rate tracked at position i is CONDITIONAL:
p_i = P(position i accepted | positions < i accepted), and

    E(k) = 1 + sum_{j=1..k} prod_{i<=j} p_i        (positions counted from 1)

is the expected number of tokens a request commits in a step that verifies k
drafts (the +1 is the target's own recovered or bonus token).

Plain Python on short lists: this runs once per engine step.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

# A position nobody has measured yet borrows the estimate of the position
# before it, and position 0 starts at 1.0: optimistic on purpose, so that a
# policy that trusts E(k) drafts long enough to measure the positions.
_UNMEASURED_FIRST_POSITION = 1.0

# The standard error of a rate nothing supports (errors()): that of a coin.
MAX_ERROR = 0.5


class PositionAcceptance:
    """EWMA of the conditional acceptance rate at each draft position.

    One measurement per position per step that judged it: that step's
    batch-wide success fraction there. The estimate is the weighted mean of
    the measurements, the newest weighing 1 and each older one (1 -
    ewma_weight) times the next newer one, so the first measurements average
    plainly (no pull towards a start value) and later it is the usual EWMA.
    A step whose drafts were all too short to reach a position (gamma was
    lower) ages that position's measurements once more: after a long
    absence the first new measurements replace the stale estimate instead of
    nudging it. (A position not reached because an earlier one was rejected
    is not absent: the draft was long enough.) ewma_weight 0 gives the plain
    mean. A position's estimate is used once `min_observations` drafted
    tokens reached it; before that the previous position's estimate stands in.
    """

    def __init__(self, num_positions: int, ewma_weight: float, min_observations: int):
        self.num_positions = num_positions
        self.keep = 1.0 - ewma_weight           # decay of old weight per measurement
        self.min_observations = min_observations
        self._sum = [0.0] * num_positions        # decayed sum of fractions
        self._weight = [0.0] * num_positions     # decayed count of fractions
        self._absent = [0] * num_positions       # steps too short to reach it, since its last
        self._trials = [0] * num_positions       # drafted tokens that reached the position
        self._evidence = [0.0] * num_positions   # ... decayed as the measurements are

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Fold in one step: per request, drafts verified and drafts accepted."""
        n = self.num_positions
        for i in range(min(max(drafted, default=0), n), n):
            self._absent[i] += 1
        # reached[i]: requests whose position i was judged; ok[i]: ... and accepted.
        reached_hist = [0] * (n + 1)
        ok_hist = [0] * (n + 1)
        # Few distinct (d, a) pairs per step: count them in C, loop over those.
        for (d, a), count in Counter(zip(drafted, accepted)).items():
            if d <= 0:
                continue
            d = min(d, n)
            a = min(a, d)
            reached_hist[min(a + 1, d)] += count   # positions 0..min(a, d-1) were judged
            ok_hist[a] += count                    # positions 0..a-1 were accepted
        reached = ok = 0
        for i in range(n - 1, -1, -1):        # suffix sums turn histograms into counts
            reached += reached_hist[i + 1]
            ok += ok_hist[i + 1]
            if reached:
                self._fold(i, ok / reached, reached)

    def _fold(self, i: int, fraction: float, trials: int) -> None:
        decay = self.keep ** (1 + self._absent[i])
        self._absent[i] = 0
        self._sum[i] = self._sum[i] * decay + fraction
        self._weight[i] = self._weight[i] * decay + 1.0
        self._trials[i] += trials
        self._evidence[i] = self._evidence[i] * decay + trials

    def rates(self) -> list[float]:
        """The conditional acceptance estimate at every position."""
        out: list[float] = []
        prev = _UNMEASURED_FIRST_POSITION
        for i in range(self.num_positions):
            measured = self._weight[i] > 0 and self._trials[i] >= self.min_observations
            prev = self._sum[i] / self._weight[i] if measured else prev
            out.append(prev)
        return out

    def errors(self) -> list[float]:
        """The standard error of every position's estimate (`rates`), from
        the drafted tokens behind it, decayed as its measurements are (and
        once more per step it has been absent since: a stale estimate stands
        on little). A Bernoulli error with one pseudo-token of a coin flip
        added, so that an estimate of 0 or 1 from few tokens is not taken
        as certain; an unmeasured position (borrowing its predecessor's
        rate) is unknown: 0.5. At batch 1 a position stands on about
        1 / ewma_weight tokens (error ~0.15), at batch 32 on tens of times
        more."""
        out = []
        for i, p in enumerate(self.rates()):
            if self._weight[i] <= 0 or self._trials[i] < self.min_observations:
                out.append(MAX_ERROR)
                continue
            n = self._evidence[i] * self.keep ** self._absent[i]
            var = (p * (1.0 - p) + 0.25 / (n + 1.0)) / (n + 1.0)
            out.append(min(MAX_ERROR, var ** 0.5))
        return out

    def snapshot(self) -> dict:
        return {"rates": [round(r, 4) for r in self.rates()], "trials": list(self._trials)}


def expected_tokens_all(rates: Sequence[float], k_max: int) -> list[float]:
    """[E(0), E(1), ..., E(k_max)] in one pass, where E(k) = 1 + sum_{j<=k}
    prod_{i<=j} p_i is the expected tokens a step commits at gamma k for
    conditional acceptance rates p (the bonus token plus each accepted draft)."""
    out, total, run = [1.0], 1.0, 1.0
    for p in rates[:k_max]:
        run *= p
        total += run
        out.append(total)
    return out
