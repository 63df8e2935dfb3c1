"""Online calibration: draft probability -> acceptance probability.

The drafter's probability q of the token it drafted is a confidence, not an
acceptance probability (a small drafter is typically over-confident, and
how much depends on the position). What admission needs is the
CONDITIONAL acceptance of a slot, P(slot j accepted | slots < j accepted),
as acceptance_stats.py tracks per position; here it is a function of q.

Feedback of one request in one step (drafted probabilities q_0..q_{d-1},
d verified, a accepted): slots j < a were accepted (outcome 1), slot a was
rejected when a < d (outcome 0), later slots were never judged and teach
nothing (the same rule as acceptance_stats.PositionAcceptance).

Estimate: q is cut into `bins` equal-width bins. Per bin, decayed counts
of judged slots and accepted ones, pooled over positions and per position
(positions past `num_positions` share the last). With m = prior_weight:

    pooled(q)    = (accepted_bin + m * q)          / (judged_bin + m)
    calibrated(j, q) = (accepted_bin,j + m * pooled(q)) / (judged_bin,j + m)

Cold-start rule: with no feedback, calibrated(j, q) = q (the drafter is
taken at its word); a bin moves to its measured rate once it has judged
a few times m slots, a position's bin first borrows the pooled one. Counts
decay by `1 - 1/window` per judged slot (applied once per step), so the
map follows a drift.

Error (prequential: every judged slot is scored with the prediction made
BEFORE its outcome is folded in, over the same decayed window): the Brier
score (mean squared error of the predicted probability against the 0/1
outcome) and the expected calibration error (ECE: over `bins` bins of the
prediction, the judged-weighted mean |mean prediction - accept rate|), for
the calibrated map and for the raw q beside it, so a report shows what
calibration buys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class CalibrationReport:
    judged: float                  # decayed number of judged slots scored
    brier: float                   # calibrated map, prequential
    ece: float
    raw_brier: float               # the draft probability itself
    raw_ece: float

    def as_dict(self) -> dict:
        return {k: round(v, 5) for k, v in self.__dict__.items()}


class _Reliability:
    """Decayed Brier and reliability-diagram sums of one predictor."""

    def __init__(self, bins: int):
        self.bins = bins
        self.sq = 0.0
        self.pred = [0.0] * bins
        self.hit = [0.0] * bins
        self.n = [0.0] * bins

    def decay(self, factor: float) -> None:
        self.sq *= factor
        for i in range(self.bins):
            self.pred[i] *= factor
            self.hit[i] *= factor
            self.n[i] *= factor

    def add(self, p: float, outcome: float) -> None:
        self.sq += (p - outcome) ** 2
        b = min(int(p * self.bins), self.bins - 1)
        self.pred[b] += p
        self.hit[b] += outcome
        self.n[b] += 1.0

    def total(self) -> float:
        return sum(self.n)

    def brier(self) -> float:
        return self.sq / self.total() if self.total() else 0.0

    def ece(self) -> float:
        total = self.total()
        return sum(abs(p - h) for p, h in zip(self.pred, self.hit)) / total if total else 0.0


def judged_slots(rows: Sequence[Sequence[float]], verified: Sequence[int],
                 accepted: Sequence[int]) -> list[tuple[int, float, float]]:
    """The slots one step judged, as (position, q, outcome): per request,
    the accepted ones (outcome 1) and the first rejected one (outcome 0);
    unverified slots and those after a rejection are not judged."""
    judged: list[tuple[int, float, float]] = []
    for probs, d, a in zip(rows, verified, accepted):
        d = min(d, len(probs))
        a = min(a, d)
        judged += [(j, min(max(probs[j], 0.0), 1.0), 1.0 if j < a else 0.0)
                   for j in range(min(a + 1, d))]
    return judged


class ConfidenceCalibrator:
    """Binned, per-position calibration of draft probabilities; see the module docstring."""

    def __init__(self, num_positions: int, bins: int = 10, prior_weight: float = 8.0,
                 window: int = 4096):
        if num_positions < 1 or bins < 1 or prior_weight <= 0 or window < 2:
            raise ValueError(f"ConfidenceCalibrator(num_positions={num_positions}, bins={bins}, "
                             f"prior_weight={prior_weight}, window={window}): need "
                             "num_positions >= 1, bins >= 1, prior_weight > 0, window >= 2")
        self.num_positions, self.bins, self.m = num_positions, bins, prior_weight
        self.keep = 1.0 - 1.0 / window
        self._hit = [[0.0] * bins for _ in range(num_positions + 1)]   # row num_positions: pooled
        self._n = [[0.0] * bins for _ in range(num_positions + 1)]
        self._calibrated = _Reliability(bins)
        self._raw = _Reliability(bins)

    def _bin(self, q: float) -> int:
        return min(int(q * self.bins), self.bins - 1)

    def predict(self, position: int, q: float) -> float:
        """Calibrated conditional acceptance of a slot at `position` with draft probability q."""
        q = min(max(q, 0.0), 1.0)
        b = self._bin(q)
        pooled_row, row = self.num_positions, min(position, self.num_positions - 1)
        pooled = (self._hit[pooled_row][b] + self.m * q) / (self._n[pooled_row][b] + self.m)
        return (self._hit[row][b] + self.m * pooled) / (self._n[row][b] + self.m)

    def row(self, probs: Sequence[float]) -> list[float]:
        """Calibrated conditional acceptance of each slot of one request's draft."""
        return [self.predict(j, q) for j, q in enumerate(probs)]

    def update(self, rows: Sequence[Sequence[float]], verified: Sequence[int],
               accepted: Sequence[int]) -> None:
        """One step's feedback: per request, the draft probabilities of its
        slots, how many of them were verified and how many of those were
        accepted. Every prediction is scored before any outcome of the step
        is folded in; the counts decay once per step, by the judged slots."""
        judged = judged_slots(rows, verified, accepted)
        if not judged:
            return
        predictions = [self.predict(j, q) for j, q, _ in judged]
        factor = self.keep ** len(judged)
        for reliability in (self._calibrated, self._raw):
            reliability.decay(factor)
        for counts in (self._hit, self._n):
            for row in counts:
                for i in range(self.bins):
                    row[i] *= factor
        for (j, q, outcome), p in zip(judged, predictions):
            self._calibrated.add(p, outcome)
            self._raw.add(q, outcome)
        self._fold(judged)

    def _fold(self, judged: Sequence[tuple[int, float, float]]) -> None:
        """Count each judged slot in its position's bin and the pooled one."""
        pooled = self.num_positions
        for j, q, outcome in judged:
            b = self._bin(q)
            for row in (min(j, self.num_positions - 1), pooled):
                self._hit[row][b] += outcome
                self._n[row][b] += 1.0

    def relearn(self, judged: Sequence[tuple[int, float, float]]) -> None:
        """Forget every count and keep only `judged` ((position, q,
        outcome) slots, as judged_slots gives them): the map then stands on
        that evidence and the prior alone. The error report is kept."""
        for counts in (self._hit, self._n):
            for row in counts:
                row[:] = [0.0] * self.bins
        self._fold(judged)

    def report(self) -> CalibrationReport:
        return CalibrationReport(self._calibrated.total(), self._calibrated.brier(),
                                 self._calibrated.ece(), self._raw.brier(), self._raw.ece())
