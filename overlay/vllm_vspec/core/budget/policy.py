"""VerifyBudgetPolicy: per-request verify budgets from draft confidence.

Timing (as in controller.py): the drafts PROPOSED in step n are VERIFIED in
step n+1. So at the scheduling of step n+1 the host holds, per request, the
draft of step n with the drafter's probability of each drafted token (a
DraftRow), and one call decides two things:
- the admitted prefix of every request's draft (admission.py), i.e. the
  tokens the target verifies in this step, and
- the draft depth of this step (the draft passes it runs; what the next
  step will be able to admit from).

Rule of one step with B rows, step-cost model T (core/step_cost.py
PooledStepCost, the `model` policy's: one linear fit over every observed
step, pooled across batch sizes):
1. Calibrate each row (calibration.py) and take survival scores.
2. Depth: for every depth D in 0..max_depth (within the token budget),
   the value of a steady step at D is max_n (B + top-n survival) /
   T(B, n, passes(D)), over PREDICTED rows of D slots: per request, the
   survival of its smoothed calibrated acceptance per position (an EWMA
   over its steps, weight `request_smoothing`; a position it never
   reached repeats its last one; a request with none yet takes the batch
   mean, else 1.0, optimistic so that a new request gets drafted and
   measured). Not the current row itself: a slot's luck does not carry
   over to the next draft, and the best D over noisy rows would be biased
   upwards. D is the argmax (ties: the smaller D).
3. Budget: n = argmax over n of (B + top-n survival of the ACTUAL rows) /
   T(B, n, passes(D)); the top-n slots are admitted.
T(B, n, P) is the pooled fit's price of a step with B requests, n
verified drafts and P draft passes at the batch's context (that of the
last observed step, per request); it is linear in n, so step 3 is
admission.best_budget. `passes(D)` is D, or 1 at D = 0 when the host
still runs the drafter on a depth-0 step (gamma0_mode sync): the features
say what the step runs. Every observed step is a sample, whatever its
batch size, so a batch size seen for the first time is priced at once
from the others' steps. A step that drafts after one that ran no draft
pass (a lazy drafter catches up over the step it skipped) is fitted with
its catch-up feature, and a choice to resume drafting after such a step
is charged the catch-up spread over the mean length of past drafting
runs, as the `model` policy charges it (charged whole, depth 0 would
hold wherever drafting wins only in the steady state; not charged, a
step at depth 0 would look free of the catch-up it causes).

Cold start (the cost model has seen fewer than MIN_SAMPLES steps, or the
sweep is not done): one sweep of draft depth max_depth..0,
`cold_start_steps` steps each, admitting in turn all and the best half of
the drafted slots, so that verified tokens and draft passes vary
independently before the fit is used. The sweep runs once per policy,
not per batch size. Probe: after
`probe_interval` steps in a row at depth 0 (nothing drafted, so nothing is
learned) one step drafts depth 1, and the next step verifies every draft
that probe proposed, whatever the calibration predicts (a probe whose
drafts go unverified teaches nothing, and depth 0 would last for good).
Recalibration: the calibration's window counts judged slots, and at depth
0 only the probes judge any (B slots every `probe_interval` steps), so
counts from before the drafter changed would outweigh the probes for
thousands of steps. From the probes' judged slots since drafting stopped
the policy sums (outcome - prediction) and its variance sum p(1 - p),
restarting both whenever the sum is not positive; once the sum exceeds
`recalibrate_z` standard deviations the calibration forgets its counts
and keeps those probe slots (ConfidenceCalibrator.relearn), and the
requests' smoothed acceptance, made from the old map, starts afresh.

Strict acceptance stays lossless: only prefixes are ever verified.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from vllm_vspec.core.budget.admission import (admit, admitted_counts, best_budget, ranked,
                                              survival)
from vllm_vspec.core.budget.calibration import ConfidenceCalibrator, judged_slots
from vllm_vspec.core.step_cost import (FEATURES, MIN_SAMPLES, DraftingRuns, PooledStepCost,
                                      features)
from vllm_vspec.core.steps import bucket_of, draft_budget

VERIFIED = FEATURES.index("verified")


@dataclass(frozen=True)
class BudgetSettings:
    """Settings of the verify-budget policy (not yet vspec keys: the engine
    integration will add them to config.py as `verify_budget_*`)."""

    cost_window: int = 1024
    """Steps the pooled cost model's fit describes (forgetting 1 - 1/window)."""
    outlier_factor: float = 3.0
    """A step this many times slower or faster than predicted is not fitted."""
    calibration_bins: int = 10
    """Equal-width bins of the draft probability."""
    calibration_prior: float = 8.0
    """Weight, in judged slots, of the draft probability itself in a bin's estimate."""
    calibration_window: int = 8192
    """Judged slots the calibration describes (forgetting 1 - 1/window)."""
    cold_start_steps: int = 2
    """Steps per draft depth of the cold-start sweep."""
    probe_interval: int = 64
    """Steps in a row at depth 0 before one step drafts depth 1 to re-measure."""
    recalibrate_z: float = 3.0
    """Standard deviations by which the probes' accepted slots must exceed the
    calibration's prediction before it relearns from the probes alone."""
    request_smoothing: float = 0.3
    """Weight of a step's calibrated acceptance in a request's smoothed one (depth choice)."""
    gamma0_runs_drafter: bool = True
    """The host runs one draft pass on a depth-0 step (gamma0_mode sync)."""

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> "BudgetSettings":
        known = {f.name: f for f in fields(cls)}
        for key, value in raw.items():
            if key not in known:
                raise ValueError(f"verify budget setting {key}={value!r} is not allowed: "
                                 f"unknown key; known keys: {', '.join(known)}")
        out = cls(**raw)
        if not out.recalibrate_z > 0.0:
            raise ValueError(f"verify budget setting recalibrate_z={out.recalibrate_z!r} "
                             "is not allowed: need a number > 0")
        if not 0.0 < out.request_smoothing <= 1.0:
            raise ValueError(f"verify budget setting request_smoothing={out.request_smoothing!r} "
                             "is not allowed: need a weight in (0, 1]")
        if out.cost_window < 2:
            raise ValueError(f"verify budget setting cost_window={out.cost_window!r} is not "
                             "allowed: need an integer >= 2")
        for key in ("calibration_bins",
                    "calibration_window", "cold_start_steps", "probe_interval"):
            if getattr(out, key) < 1:
                raise ValueError(f"verify budget setting {key}={getattr(out, key)!r} is not "
                                 "allowed: need an integer >= 1")
        return out


@dataclass(frozen=True)
class DraftRow:
    """One request's draft as the host carries it to the scheduler."""

    request_id: Hashable
    probs: tuple[float, ...]       # the drafter's probability of each drafted token, in order


@dataclass(frozen=True)
class BudgetPlan:
    admitted: tuple[int, ...]      # per row: leading draft slots verified this step
    depth: int                     # draft passes this step runs (drafts verified next step)
    bucket: int
    reason: str                    # cold-start / probe / budget
    expected_tokens: float         # B + admitted survival (calibrated), this step
    predicted_ms: float | None     # the cost model's T for this step (None in cold start)

    @property
    def budget(self) -> int:
        return sum(self.admitted)


def smoothed(previous: Sequence[float] | None, acceptance: Sequence[float], weight: float,
             depth: int) -> list[float]:
    """A request's smoothed conditional acceptance per position, `depth`
    long: positions of `acceptance` move `weight` of the way from
    `previous` (or start there), the others keep `previous`, and positions
    neither has repeat the last known one (1.0 with none)."""
    out = []
    for j in range(depth):
        old = previous[j] if previous is not None and j < len(previous) else None
        new = acceptance[j] if j < len(acceptance) else None
        if new is not None:
            out.append(new if old is None else old + weight * (new - old))
        else:
            out.append(old if old is not None else (out[-1] if out else 1.0))
    return out


def choose(scores: Sequence[Sequence[float]], predicted: Sequence[Sequence[float]],
           max_depth: int, fixed_ms: Callable[[int], float], per_slot_ms: float
           ) -> tuple[int, list[int], float]:
    """(depth, admitted per row, value) by steps 2-3 of the module rule.
    `scores`: the survival rows of the drafts at hand; `predicted`: per
    row, a survival row at least `max_depth` long for the drafts of the
    next step; the step time with n admitted slots at draft depth D is
    fixed_ms(D) + per_slot_ms * n."""
    b = len(scores)
    best_d, best_value = 0, -1.0
    for d in range(max_depth + 1):
        ext = sorted((s for row in predicted for s in row[:d]), reverse=True)
        _, value = best_budget(ext, b, fixed_ms(d), per_slot_ms)
        if value > best_value:
            best_d, best_value = d, value
    ranking = ranked(scores)
    n, value = best_budget([-t[0] for t in ranking], b, fixed_ms(best_d), per_slot_ms)
    return best_d, admitted_counts(ranking, b, n), value


class VerifyBudgetPolicy:
    """See the module docstring. `max_depth`: the host's K (num_speculative_tokens)."""

    def __init__(self, max_depth: int, settings: BudgetSettings | None = None):
        if max_depth < 1:
            raise ValueError(f"VerifyBudgetPolicy(max_depth={max_depth}): need K >= 1")
        self.max_depth = max_depth
        self.settings = s = settings or BudgetSettings()
        self.cost = PooledStepCost(s.cost_window, outlier_factor=s.outlier_factor)
        self.calibration = ConfidenceCalibrator(max_depth, s.calibration_bins,
                                                s.calibration_prior, s.calibration_window)
        self._smoothed: dict[Hashable, list[float]] = {}   # request -> smoothed acceptance
        self._cold_steps = 0
        self._zero_run = 0
        self._probe_drafted = False     # the last plan was a probe: these rows hold its drafts
        self._verifying_probe = False   # the plan being observed verifies a probe's drafts
        self._probe_slots: list[tuple[int, float, float]] = []   # probes' judged slots
        self._probe_excess = 0.0        # sum of (outcome - prediction) over them
        self._probe_variance = 0.0      # sum of p(1 - p) over them
        self._context = 0.0             # mean context per request of the last observed step
        self._last_passes: int | None = None    # draft passes of the last observed step
        self._runs = DraftingRuns()     # observed drafting runs (a resume's catch-up)

    def passes(self, depth: int) -> int:
        return 1 if depth == 0 and self.settings.gamma0_runs_drafter else depth

    def plan(self, rows: Sequence[DraftRow], max_num_batched_tokens: int | None = None
             ) -> BudgetPlan:
        b = len(rows)
        bucket = bucket_of(b)
        self._verifying_probe, self._probe_drafted = self._probe_drafted, False
        hi = self.max_depth if max_num_batched_tokens is None else max(0, min(
            self.max_depth, draft_budget(b, max_num_batched_tokens)))
        acceptance = [self.calibration.row(r.probs) for r in rows]
        scores = [survival(a) for a in acceptance]
        predicted = [survival(m) for m in self._smooth(rows, acceptance)]
        if self._cold_steps < self._sweep_steps() or self.cost.samples < MIN_SAMPLES:
            return self._cold(rows, scores, bucket, hi)
        fixed, per_slot = self.prices(b, hi)
        depth, admitted, _ = choose(scores, predicted, hi, fixed.__getitem__, per_slot)
        reason = "budget"
        if self._verifying_probe:
            admitted, reason = [len(r.probs) for r in rows], "probe-verify"
        n = sum(admitted)
        if depth == 0:
            self._zero_run += 1
            if self._zero_run >= self.settings.probe_interval and hi >= 1:
                depth, reason, self._zero_run = 1, "probe", 0
                self._probe_drafted = True
        else:
            self._zero_run = 0
            self._forget_probes()
        return BudgetPlan(tuple(admitted), depth, bucket, reason,
                          b + sum(sum(row[:k]) for row, k in zip(scores, admitted)),
                          fixed[depth] + per_slot * n)

    def prices(self, batch: int, max_depth: int) -> tuple[list[float], float]:
        """The pooled fit's price (ms) of a step of `batch` requests at each
        draft depth 0..max_depth verifying no drafts (one that resumes
        drafting after a step that ran no pass: with its catch-up spread
        over the mean drafting run), and of each verified draft (>= 0: the
        fit keeps its marginal costs non-negative)."""
        theta = self.cost.fit()
        passes = np.array([self.passes(d) for d in range(max_depth + 1)], dtype=float)
        resuming = self._last_passes == 0
        catchup = batch * (passes > 0) * resuming / self._runs.dwell
        x = features(batch, 0.0, passes, catchup, batch * self._context)
        return (x @ theta).tolist(), max(float(theta[VERIFIED]), 0.0)

    def _sweep_steps(self) -> int:
        return (self.max_depth + 1) * self.settings.cold_start_steps

    def _smooth(self, rows: Sequence[DraftRow], acceptance: Sequence[Sequence[float]]
                ) -> list[list[float]]:
        """Per row, its request's smoothed acceptance (step 2 of the module
        rule), kept per request while it stays in the batch."""
        k, w = self.max_depth, self.settings.request_smoothing
        known = {}
        for row, a in zip(rows, acceptance):
            before = self._smoothed.get(row.request_id)
            if a or before is not None:
                known[row.request_id] = smoothed(before, a, w, k)
        if known:
            mean = [sum(m[j] for m in known.values()) / len(known) for j in range(k)]
        else:
            mean = [1.0] * k
        self._smoothed = known
        return [known.get(row.request_id, mean) for row in rows]

    def _cold(self, rows, scores, bucket: int, hi: int) -> BudgetPlan:
        i = self._cold_steps
        self._cold_steps += 1
        sweep = hi + 1
        depth = hi - (i // self.settings.cold_start_steps) % sweep
        drafted = sum(len(r.probs) for r in rows)
        n = drafted if i % 2 == 0 else drafted // 2
        admitted = admit(scores, n)
        return BudgetPlan(tuple(admitted), depth, bucket, "cold-start",
                          len(rows) + sum(sum(row[:k]) for row, k in zip(scores, admitted)),
                          None)

    def observe(self, plan: BudgetPlan, rows: Sequence[DraftRow], accepted: Sequence[int],
                step_ms: float, context: float = 0.0) -> None:
        """The step's outcome: per row, accepted drafts among the admitted
        ones, the step's time (the controller's non-overlapping interval,
        in ms) and the batch's mean context tokens per request."""
        if len(accepted) != len(rows) or len(rows) != len(plan.admitted):
            raise ValueError(f"VerifyBudgetPolicy.observe: {len(rows)} rows, "
                             f"{len(plan.admitted)} admitted, {len(accepted)} accepted: "
                             "need one of each per request of the planned step")
        probs = [r.probs for r in rows]
        relearn = self._verifying_probe and self._weigh_probe(probs, plan.admitted, accepted)
        self.calibration.update(probs, plan.admitted, accepted)
        if relearn:
            self.calibration.relearn(self._probe_slots)
            self._forget_probes()
            self._smoothed = {}
        b, passes = len(rows), self.passes(plan.depth)
        catchup = b if passes and self._last_passes == 0 else 0
        self.cost.observe(features(b, plan.budget, passes, catchup, b * context), step_ms)
        self._runs.observe(passes > 0)
        self._last_passes, self._context = passes, context

    def _weigh_probe(self, probs, verified, accepted) -> bool:
        """Add a probe's judged slots to the probe evidence, scored by the
        calibration before it learns them; True when the evidence now
        exceeds the prediction by `recalibrate_z` standard deviations."""
        judged = judged_slots(probs, verified, accepted)
        predicted = [self.calibration.predict(j, q) for j, q, _ in judged]
        self._probe_slots += judged
        self._probe_excess += sum(o - p for (_, _, o), p in zip(judged, predicted))
        self._probe_variance += sum(p * (1.0 - p) for p in predicted)
        if self._probe_excess <= 0.0:
            self._forget_probes()
            return False
        return self._probe_excess > self.settings.recalibrate_z * self._probe_variance ** 0.5

    def _forget_probes(self) -> None:
        self._probe_slots, self._probe_excess, self._probe_variance = [], 0.0, 0.0

    def snapshot(self) -> dict:
        return {"cost_model": self.cost.snapshot(),
                "calibration": self.calibration.report().as_dict()}
