"""One online step-cost model for every batch size (the `model` policy).

A decode step's time is linear in what it does:

    T = c_step + c_req * B + c_verify * V + c_pass * P + c_pass_req * P * B
        + c_spec * [P > 0] + c_pass_ctx * P * ctx / 1000 + c_catchup * C
        + c_ctx * ctx / 1000    (ms)

B requests, V draft tokens verified (the target runs B + V tokens), P draft
passes (the gamma decided: the drafts it proposes), [P > 0] the fixed cost
of a step that drafts at all (paid at every gamma but 0: without it a
long draft would be charged for it per pass), P * ctx a draft pass's
attention over the batch's context (without it a pass is priced by its
requests alone, and a batch whose contexts are longer or shorter than
those fitted is mispriced), C the requests a drafting step after a
gamma-0 step catches up (a lazy drafter's pass over the tokens it
missed), ctx the batch's context tokens. One model pooled over all batch sizes: what is
learnt at batch 8 informs batch 32, and a batch size seen for the first
time is priced at once.

Fit: exponentially weighted least squares, every decided step a sample
(stable or not: the features say what the step did), the sums decaying
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
            "pass_context_k", "catchup", "context_k")
# The fit is redone once this many samples arrived since the last (every
# sample while the model has fewer than REFIT_EVERY * 4): a step changes
# the sums by about 1/window, so a fit a few steps old predicts the same.
REFIT_EVERY = 8
NONNEGATIVE = np.array([False, False, True, True, True, True, True, True, False])
# Samples before outliers are screened and the fit's own residuals set its
# uncertainty (before: a quarter of a typical step, squared).
MIN_SAMPLES = 8


def features(batch, verified, passes, catchup, context) -> np.ndarray:
    """The FEATURES of a step; array arguments (broadcast together) give one
    row per element, e.g. every gamma of a decision at once."""
    passes = np.asarray(passes, dtype=float)
    ctx_k = np.divide(context, 1000.0)
    drafting = (passes > 0).astype(float)
    return np.stack(np.broadcast_arrays(1.0, batch, verified, passes, passes * batch, drafting,
                                        passes * ctx_k, catchup, ctx_k),
                    axis=-1).astype(float)


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
        self.sq_ms = 0.0                   # decayed sum of squared residuals (ms^2)
        self.samples = 0
        self.skipped = 0
        self._run = 0
        self._fit: np.ndarray | None = None         # the coefficients in use
        self._inv: np.ndarray | None = None         # the information's inverse, kept with the fit

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
            self.sq_ms = self.sq_ms * self.keep + (ms - pred) ** 2
        self.xx = self.xx * self.keep + np.outer(x, x)
        self.xy = self.xy * self.keep + x * ms
        self.weight = self.weight * self.keep + 1.0
        self.samples += 1
        if self.samples < 4 * REFIT_EVERY or self.samples % REFIT_EVERY == 0:
            self._fit = None
        return True

    def _information(self) -> np.ndarray:
        scale = np.diag(self.xx) / max(self.weight, 1e-9)
        return self.xx + np.diag(self.prior_steps * np.maximum(scale, 1e-6))

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
        return self._fit

    def spread(self, x: np.ndarray) -> np.ndarray:
        """Standard error of the fit's prediction at each row of `x`,
        sqrt(s^2 x A^-1 x) (A: the information, s^2: the residual variance
        a step): small where the steps have pinned the cost down, large
        where it rests on the prior alone."""
        if self.samples < MIN_SAMPLES:
            return np.full(np.shape(x)[:-1], np.inf)
        self.fit()
        if self._inv is None:
            self._inv = np.linalg.inv(self._information())
        var = self.sq_ms / max(self.weight, 1.0)
        return np.sqrt(np.maximum(var * np.einsum("...i,ij,...j->...", x, self._inv, x), 0.0))

    def predict(self, x: np.ndarray) -> float:
        return float(self.fit() @ x)

    def snapshot(self) -> dict:
        mean = self.fit() if self.samples else np.zeros(len(FEATURES))
        return {"samples": self.samples, "skipped": self.skipped,
                "relative_error": round(math.sqrt(self.sq_rel / max(self.weight, 1.0)), 4),
                "coefficients_ms": dict(zip(FEATURES, (round(float(v), 6) for v in mean)))}

    def state(self) -> dict:
        """The sums, and the fit in use (refitted only every REFIT_EVERY
        samples), so that a restored model predicts what this one does."""
        fit = None if self._fit is None else self._fit.tolist()
        return {"xx": self.xx.tolist(), "xy": self.xy.tolist(), "weight": self.weight,
                "sq_rel": self.sq_rel, "sq_ms": self.sq_ms, "samples": self.samples, "fit": fit}

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
        self.sq_ms = float(state.get("sq_ms", 0.0))
        self.samples = int(state["samples"])
        self._fit = fit
