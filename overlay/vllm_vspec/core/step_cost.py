"""One online step-cost model for every batch size (the `model` policy).

A decode step's time is linear in what it does:

    T = c_step + c_req * B + c_verify * V + c_pass * P + c_pass_req * P * B
        + c_spec * [P > 0] + c_pass_ctx * P * ctx / 1000 + c_catchup * C
        + c_ctx * ctx / 1000 + c_prefill * F / 1000 + c_draft_prefill * D / 1000   (ms)

B requests, V draft tokens verified (the target runs B + V tokens), P draft
passes (the gamma decided: the drafts it proposes), [P > 0] the fixed cost
of a step that drafts at all (paid at every gamma but 0: without it a
long draft would be charged for it per pass), P * ctx a draft pass's
attention over the batch's context (without it a pass is priced by its
requests alone, and a batch whose contexts are longer or shorter than
those fitted is mispriced), C the requests a drafting step after a
gamma-0 step catches up (a lazy drafter's pass over the tokens it
missed), ctx the batch's context tokens, F the prompt tokens a prefill
step processes and D those of them the drafter processes too (F while
drafting is on and the drafter skips gamma-0 steps; 0 otherwise: then its
prompt work is the same at every gamma and F carries it). One model pooled over all batch sizes: what is
learnt at batch 8 informs batch 32, and a batch size seen for the first
time is priced at once.

Fit: exponentially weighted least squares, every step a sample (decided
or prefill, stable or not: the features say what the step did), the sums decaying
by 1 - 1/window a step; a weak ridge (worth `prior_steps` steps, scaled to
each feature's size) keeps directions the steps have not varied near 0.
The marginal costs (everything but c_step, c_req and c_ctx) are kept >= 0,
so the model is monotone in gamma. The policy uses the fit's means: a
step's time scatters with the host (noise), which more samples average
out, while what is unknown about a choice is its acceptance (sampled
there).

Steps the model mispredicts by more than `outlier_factor` (a preemption,
a pause of the host) are not folded in unless `outlier_run` come in a row
(then the machine changed, or the batch left the region the model was
fitted on): from then on every such step is folded in until one fits.
"""

from __future__ import annotations

import math

import numpy as np

FEATURES = ("step", "requests", "verified", "passes", "pass_requests", "speculating",
            "pass_context_k", "catchup", "context_k", "prefill_k", "draft_prefill_k")
DRAFT_PREFILL = FEATURES.index("draft_prefill_k")
PREFILL = FEATURES.index("prefill_k")
# The ridge's weight per feature, in units of `prior_steps`. The drafter's
# share of a prompt is told from the target's only by prefill steps at
# gamma 0 and at gamma > 0 both; until such steps say otherwise, a prompt's
# cost is the target's (a prior worth this many steps holds draft_prefill
# near 0), so drafting is not charged half of every prompt by default.
PRIOR_WEIGHT = np.ones(len(FEATURES))
PRIOR_WEIGHT[DRAFT_PREFILL] = 20.0
# The fit is redone once this many samples arrived since the last (every
# sample while the model has fewer than REFIT_EVERY * 4): a step changes
# the sums by about 1/window, so a fit a few steps old predicts the same.
REFIT_EVERY = 8
NONNEGATIVE = np.array([False, False, True, True, True, True, True, True, False, True, True])
# The least residual scatter spread() assumes, as a share of the mean step
# time: a fit through a handful of steps leaves residuals near 0, which
# would read as certainty where only the prior speaks.
NOISE_FLOOR = 0.05
# Samples before outliers are screened and the fit's own residuals set its
# uncertainty (before: a quarter of a typical step, squared).
MIN_SAMPLES = 8


def features(batch, verified, passes, catchup, context, prefill=0.0,
             draft_prefill=0.0) -> np.ndarray:
    """The FEATURES of a step; array arguments (broadcast together) give one
    row per element, e.g. every gamma of a decision at once."""
    args = (batch, verified, passes, catchup, context, prefill, draft_prefill)
    if not any(isinstance(a, np.ndarray) for a in args):   # one step: the common case
        return np.array(_columns(*args), dtype=float)
    args = tuple(np.asarray(a, dtype=float) for a in args)
    out = np.empty(np.broadcast_shapes(*(a.shape for a in args)) + (len(FEATURES),))
    for i, column in enumerate(_columns(*args)):
        out[..., i] = column
    return out


def _columns(batch, verified, passes, catchup, context, prefill, draft_prefill) -> tuple:
    """The FEATURES' values, in order (scalars or arrays alike)."""
    ctx_k = context / 1000.0
    return (1.0, batch, verified, passes, passes * batch, passes > 0, passes * ctx_k,
            catchup, ctx_k, prefill / 1000.0, draft_prefill / 1000.0)


# A resume's catch-up is spread over the mean length of past drafting runs
# (observed steps that draft, between two that do not), each older run
# weighing RUN_KEEP times the next; before any run ended, PRIOR_RUN_STEPS,
# worth PRIOR_RUNS runs.
PRIOR_RUN_STEPS, PRIOR_RUNS = 8.0, 2.0
RUN_KEEP = 0.9


class DraftingRuns:
    """The mean length of the runs of drafting steps a policy has observed
    (`dwell`): what a decision to resume drafting spreads the catch-up it
    causes over (charged whole to one step, drafting would lose wherever it
    wins only in the steady state; not charged, short excursions from
    gamma 0 would each pay it)."""

    def __init__(self) -> None:
        self.run = 0                                        # drafting steps since the last resume
        self.runs = [PRIOR_RUN_STEPS * PRIOR_RUNS, PRIOR_RUNS]   # decayed sum of run lengths, count

    def observe(self, drafting: bool) -> None:
        if drafting:
            self.run += 1
        elif self.run:
            self.runs = [self.runs[0] * RUN_KEEP + self.run, self.runs[1] * RUN_KEEP + 1.0]
            self.run = 0

    @property
    def dwell(self) -> float:
        return max(self.runs[0] / self.runs[1], 1.0)


class PooledStepCost:
    def __init__(self, window: float = 256.0, prior_steps: float = 0.5,
                 outlier_factor: float = 3.0, outlier_run: int = 4):
        if window < 2 or prior_steps <= 0 or outlier_factor <= 1 or outlier_run < 1:
            raise ValueError(f"PooledStepCost(window={window}, prior_steps={prior_steps}, "
                             f"outlier_factor={outlier_factor}, outlier_run={outlier_run}): need "
                             f"window >= 2, prior_steps > 0, outlier_factor > 1, outlier_run >= 1")
        n = len(FEATURES)
        self.keep = 1.0 - 1.0 / window
        self.prior_steps = prior_steps
        self.outlier_factor, self.outlier_run = outlier_factor, outlier_run
        self.xx = np.zeros((n, n))
        self.xy = np.zeros(n)
        self.weight = 0.0                  # decayed sample count
        self.sq_rel = 0.0                  # decayed sum of squared relative residuals
        self.yy = 0.0                      # decayed sum of squared step times (ms^2)
        self.y = 0.0                       # decayed sum of step times (ms)
        self.samples = 0
        self.skipped = 0
        self._run = 0
        self._fit: np.ndarray | None = None         # the coefficients in use
        self._inv: np.ndarray | None = None         # the information's inverse, kept with the fit
        self.fits = 0                               # fits made so far (a fit's generation)

    # ------------------------------------------------------------ fitting
    def observe(self, x: np.ndarray, ms: float) -> bool:
        """Fold one step in; False when it was skipped as an outlier."""
        if ms <= 0 or not math.isfinite(ms):
            return False
        if self.samples >= MIN_SAMPLES:
            pred = self.predict(x)
            if 1.0 / self.outlier_factor <= ms / max(pred, 1e-9) <= self.outlier_factor:
                self._run = 0
            else:
                self._run += 1
                if self._run < self.outlier_run:
                    self.skipped += 1
                    return False
                # A run this long says the model is wrong (the machine
                # changed, or the batch left the region it was fitted on):
                # every step of the run is folded in and refitted at once.
                self._fit = None
            rel = (ms - pred) / ms
            self.sq_rel = self.sq_rel * self.keep + rel * rel
        self.xx = self.xx * self.keep + np.outer(x, x)
        self.xy = self.xy * self.keep + x * ms
        self.yy = self.yy * self.keep + ms * ms
        self.y = self.y * self.keep + ms
        self.weight = self.weight * self.keep + 1.0
        self.samples += 1
        if self.samples < 4 * REFIT_EVERY or self.samples % REFIT_EVERY == 0:
            self._fit = None
        return True

    def _information(self) -> np.ndarray:
        scale = np.diag(self.xx) / max(self.weight, 1e-9)
        return self.xx + np.diag(self.prior_steps * PRIOR_WEIGHT * np.maximum(scale, 1e-6))

    def fit(self) -> np.ndarray:
        """The coefficients (ms per unit of each feature)."""
        if self._fit is None:
            a = self._information()
            free = np.ones(len(FEATURES), dtype=bool)
            theta = np.zeros(len(FEATURES))
            # Active set: marginal costs that come out negative are pinned
            # at 0 and the rest re-solved (a handful of rounds at most).
            for _ in range(len(FEATURES)):
                theta = np.zeros(len(FEATURES))
                theta[free] = np.linalg.solve(a[np.ix_(free, free)], self.xy[free])
                neg = free & NONNEGATIVE & (theta < 0)
                if not neg.any():
                    break
                free &= ~neg
            theta[~free] = 0.0
            self._fit, self._inv = theta, None
            self.fits += 1
        return self._fit

    def spread(self, x: np.ndarray) -> np.ndarray:
        """Standard error of the fit's prediction at each row of `x`,
        sqrt(s^2 x A^-1 x) (A: the information; s^2: the fit's residual
        variance a step, at least NOISE_FLOOR of the mean step squared):
        small where the steps have pinned the cost down, large where it
        rests on the prior alone. The residuals are the current fit's, so a
        burst of mispredictions while the batch moved does not linger."""
        if self.samples < MIN_SAMPLES:
            return np.full(np.shape(x)[:-1], np.inf)
        if self._inv is None:
            self.fit()
            self._inv = np.linalg.inv(self._information())
        return np.sqrt(np.maximum(self._residual_var()
                                  * np.einsum("...i,ij,...j->...", x, self._inv, x), 0.0))

    def _residual_var(self) -> float:
        """The fit's residual variance a step, at least NOISE_FLOOR of the mean step squared."""
        theta = self.fit()
        rss = self.yy - 2.0 * theta @ self.xy + theta @ self.xx @ theta
        return max(rss / max(self.weight, 1.0), (NOISE_FLOOR * self.mean_ms()) ** 2)

    def data_spread(self, i: int) -> float:
        """Standard error of coefficient `i` from the steps alone (its own
        prior left out, the others' kept): infinite while no step varied
        feature `i` apart from the rest (e.g. the drafter's prompt tokens
        while every prompt was prefilled with the drafter on)."""
        if self.samples < MIN_SAMPLES:
            return math.inf
        a = self._information()
        rest = [j for j in range(len(a)) if j != i]
        own = self.xx[i, i] - a[i, rest] @ np.linalg.solve(a[np.ix_(rest, rest)], a[rest, i])
        scale = max(self.xx[i, i], 1e-12)
        if own <= 1e-6 * scale:
            return math.inf
        return math.sqrt(self._residual_var() / own)

    def relative_error(self) -> float:
        """The fit's relative residual a step (decayed root mean square)."""
        return math.sqrt(self.sq_rel / max(self.weight, 1.0))

    def mean_ms(self) -> float:
        """The mean of the steps folded in (decayed alike)."""
        return self.y / max(self.weight, 1e-9)

    def predict(self, x: np.ndarray) -> float:
        return float(self.fit() @ x)

    def snapshot(self) -> dict:
        mean = self.fit() if self.samples else np.zeros(len(FEATURES))
        return {"samples": self.samples, "skipped": self.skipped,
                "relative_error": round(self.relative_error(), 4),
                "coefficients_ms": dict(zip(FEATURES, (round(float(v), 6) for v in mean)))}

    def state(self) -> dict:
        """The sums, and the fit in use (refitted only every REFIT_EVERY
        samples), so that a restored model predicts what this one does."""
        fit = None if self._fit is None else self._fit.tolist()
        return {"xx": self.xx.tolist(), "xy": self.xy.tolist(), "weight": self.weight,
                "sq_rel": self.sq_rel, "yy": self.yy, "y": self.y, "samples": self.samples, "fit": fit}

    def restore(self, state: dict) -> None:
        xx, xy = np.array(state["xx"], dtype=float), np.array(state["xy"], dtype=float)
        if xx.shape != self.xx.shape or xy.shape != self.xy.shape:
            raise ValueError(f"cost state has {xy.shape[0]} features, this model {len(FEATURES)}")
        fit = state.get("fit")
        fit = None if fit is None else np.array(fit, dtype=float)
        if fit is not None and fit.shape != xy.shape:
            raise ValueError(f"cost state's fit has shape {fit.shape}, this model "
                             f"{len(FEATURES)} coefficients")
        self.xx, self.xy, self._inv = xx, xy, None
        self.weight, self.sq_rel = float(state["weight"]), float(state["sq_rel"])
        self.yy, self.y = float(state.get("yy", 0.0)), float(state.get("y", 0.0))
        self.samples = int(state["samples"])
        self._fit = fit
