"""Online step-cost model: step time from verified tokens and draft passes.

Per batch-size bucket (steps.bucket_of), a step's time is modelled as

    T(tokens, passes) = per_step + per_token * tokens + per_pass * passes   (ms)

where `tokens` is what the target verifies (each request's own token plus
its admitted draft slots) and `passes` the draft passes the step runs (the
draft depth of the drafts it proposes). The context term of latency.py
(alpha * ctx) is not a feature: within a bucket it drifts slowly and the
forgetting below lets `per_step` follow it.

Fit (every observed step is a sample; no start-up profiling):
- Exponentially weighted least squares: the normal equations' sums decay
  by `1 - 1/window` per sample, so the fit describes about the last
  `window` steps of the bucket. A direction the recent steps do not vary
  (e.g. the draft depth stayed put) keeps its older estimate, because
  every sum decays alike and new samples add nothing in that direction.
- Non-negative coefficients: the exact minimiser over the non-negative
  orthant, found by solving the normal equations on every subset of the
  three coefficients and keeping the feasible solution of least squared
  error (3 coefficients: 7 subsets; that is the KKT argument).
- Outliers: once a bucket has a model, a step more than `outlier_factor`
  times slower or faster than predicted is not folded in (a preemption, a
  pause of the host), unless `outlier_run` such steps come in a row: then
  the machine changed and they are folded in again.

Cold-start rule: a bucket is READY when it holds at least `min_samples`
samples and both features vary in them with a correlation below
`max_correlation` (otherwise per-token and per-pass costs cannot be told
apart). A ready bucket is fitted on its own samples. A bucket that is not
ready, while another one is, is fitted on its own samples plus the nearest
ready bucket's coefficients as a prior worth `prior_samples` samples (a
ridge towards them), so it is usable at once and turns into its own fit as
samples come. With no bucket ready, `model()` is None: the caller must run
its cold-start exploration (policy.py: a sweep of draft depths and budgets).

Stdlib only; a few dozen float operations per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from vllm_vspec.core.steps import nearest_bucket

NUM_COEFFS = 3                         # per_step, per_token, per_pass
_JITTER = 1e-9                         # relative ridge that keeps the equations solvable


@dataclass(frozen=True)
class StepCost:
    """T(tokens, passes) = per_step_ms + per_token_ms*tokens + per_pass_ms*passes."""

    per_step_ms: float
    per_token_ms: float
    per_pass_ms: float

    def __call__(self, tokens: float, passes: float) -> float:
        return self.per_step_ms + self.per_token_ms * tokens + self.per_pass_ms * passes

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.per_step_ms, self.per_token_ms, self.per_pass_ms)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        scale = max(abs(m[r][c]) for r in range(n)) or 1.0
        if abs(m[p][c]) <= 1e-12 * scale:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def nonnegative_solution(a: list[list[float]], b: list[float]) -> list[float]:
    """argmin over theta >= 0 of theta'A theta - 2 b'theta (A symmetric PSD):
    the best feasible solution of the normal equations restricted to each
    subset of coefficients (the others 0). All zeros when none is feasible."""
    n = len(b)
    best, best_obj = [0.0] * n, 0.0
    for subset in (s for k in range(1, n + 1) for s in combinations(range(n), k)):
        sol = _solve([[a[i][j] for j in subset] for i in subset], [b[i] for i in subset])
        if sol is None or any(v < 0.0 for v in sol):
            continue
        obj = -sum(b[i] * v for i, v in zip(subset, sol))   # at the solution theta'A theta = b'theta
        if obj < best_obj:
            best = [0.0] * n
            for i, v in zip(subset, sol):
                best[i] = v
            best_obj = obj
    return best


class _BucketFit:
    """Decayed sums of x x' and x y over one bucket's samples, x = (1, tokens, passes)."""

    def __init__(self):
        self.xx = [[0.0] * NUM_COEFFS for _ in range(NUM_COEFFS)]
        self.xy = [0.0] * NUM_COEFFS
        self.samples = 0                   # folded samples (not decayed)
        self.skipped = 0                   # outliers not folded
        self.outlier_run = 0               # outliers in a row, up to now

    def fold(self, tokens: float, passes: float, ms: float, keep: float) -> None:
        x = (1.0, float(tokens), float(passes))
        for i in range(NUM_COEFFS):
            self.xy[i] = self.xy[i] * keep + x[i] * ms
            for j in range(NUM_COEFFS):
                self.xx[i][j] = self.xx[i][j] * keep + x[i] * x[j]
        self.samples += 1

    def varied(self, max_correlation: float) -> bool:
        """Both features vary (weighted variance > 0) and are not collinear."""
        w = self.xx[0][0]
        if w <= 0:
            return False
        mean_t, mean_p = self.xx[0][1] / w, self.xx[0][2] / w
        var_t = self.xx[1][1] / w - mean_t ** 2
        var_p = self.xx[2][2] / w - mean_p ** 2
        if var_t <= 1e-9 * (1 + mean_t ** 2) or var_p <= 1e-9 * (1 + mean_p ** 2):
            return False
        cov = self.xx[1][2] / w - mean_t * mean_p
        return abs(cov) / (var_t * var_p) ** 0.5 < max_correlation

    def fit(self, prior: StepCost | None = None, prior_weights: list[float] | None = None
            ) -> StepCost:
        """Own samples, plus a ridge towards `prior` with per-coefficient weights."""
        a = [row[:] for row in self.xx]
        b = self.xy[:]
        for i in range(NUM_COEFFS):
            a[i][i] += _JITTER * (a[i][i] + 1.0)
        if prior is not None and prior_weights is not None:
            for i, (theta, lam) in enumerate(zip(prior.as_tuple(), prior_weights)):
                a[i][i] += lam
                b[i] += lam * theta
        return StepCost(*nonnegative_solution(a, b))

    def feature_scale(self) -> list[float]:
        """Mean x_j^2 per sample: the information one average sample adds per coefficient."""
        w = self.xx[0][0] or 1.0
        return [self.xx[j][j] / w for j in range(NUM_COEFFS)]


class StepCostModel:
    """Per-bucket online fit of T(tokens, passes); see the module docstring."""

    def __init__(self, window: int = 512, min_samples: int = 8, prior_samples: float = 16.0,
                 outlier_factor: float = 3.0, outlier_run: int = 8,
                 max_correlation: float = 0.98):
        if window < 2 or min_samples < NUM_COEFFS or outlier_factor <= 1.0 or outlier_run < 1:
            raise ValueError(f"StepCostModel(window={window}, min_samples={min_samples}, "
                             f"outlier_factor={outlier_factor}, outlier_run={outlier_run}): "
                             f"need window >= 2, min_samples >= {NUM_COEFFS}, "
                             "outlier_factor > 1, outlier_run >= 1")
        self.keep = 1.0 - 1.0 / window
        self.min_samples, self.prior_samples = min_samples, prior_samples
        self.outlier_factor, self.outlier_run = outlier_factor, outlier_run
        self.max_correlation = max_correlation
        self._fits: dict[int, _BucketFit] = {}
        self._cache: dict[int, StepCost | None] = {}

    def ready(self, bucket: int) -> bool:
        f = self._fits.get(bucket)
        return (f is not None and f.samples >= self.min_samples
                and f.varied(self.max_correlation))

    def model(self, bucket: int) -> StepCost | None:
        """The bucket's cost model, or None when no bucket is ready (cold start)."""
        if bucket not in self._cache:
            self._cache[bucket] = self._model(bucket)
        return self._cache[bucket]

    def _model(self, bucket: int) -> StepCost | None:
        own = self._fits.get(bucket, _BucketFit())
        if self.ready(bucket):
            return own.fit()
        donor = nearest_bucket([b for b in self._fits if b != bucket and self.ready(b)], bucket)
        if donor is None:
            return None
        donor_fit = self._fits[donor]
        weights = [self.prior_samples * s for s in donor_fit.feature_scale()]
        return own.fit(donor_fit.fit(), weights)

    def observe(self, bucket: int, tokens: int, passes: int, ms: float) -> bool:
        """Fold one step in; False when it was skipped as an outlier."""
        fit = self._fits.setdefault(bucket, _BucketFit())
        predicted = self.model(bucket)
        if predicted is not None and ms > 0:
            ratio = ms / max(predicted(tokens, passes), 1e-9)
            if not 1.0 / self.outlier_factor <= ratio <= self.outlier_factor:
                fit.outlier_run += 1
                if fit.outlier_run < self.outlier_run:
                    fit.skipped += 1
                    return False
        fit.outlier_run = 0
        fit.fold(tokens, passes, ms, self.keep)
        self._cache.clear()          # a bucket's fit may be another bucket's prior
        return True

    def snapshot(self) -> dict:
        """Per bucket: samples, outliers skipped, ready, coefficients (ms)."""
        out = {}
        for b, f in sorted(self._fits.items()):
            m = self.model(b)
            out[str(b)] = {"samples": f.samples, "skipped": f.skipped, "ready": self.ready(b),
                           "coefficients_ms": None if m is None else
                           [round(v, 5) for v in m.as_tuple()]}
        return out
