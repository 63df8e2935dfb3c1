"""`online` policy (default): a UCB bandit over gamma arms, per batch-size bucket.

The reward of an arm is committed tokens per second on its stable steps
(controller.py). It is estimated in two factors, because the two vary on
different time scales and with very different noise:

    R(g) = E(g) * mean over the arm's window of (B_i / interval_i)

- E(g), expected committed tokens per request at gamma g, comes from the
  per-position acceptance EWMA (acceptance_stats.py), POOLED over all arms:
  a step at gamma g measures positions < g for every arm at once, so a
  phase change of acceptance moves every arm's estimate immediately, and the
  +-30% per-step noise of realised tokens at small batch sizes stays out of
  the comparison of arms. Its expectation is exactly the realised reward's.
- B_i / interval_i, requests completed per second, is measured per
  (bucket, arm) in a sliding window of `online_window` stable steps. It
  depends on latency only, which is smooth and slow.

UCB: score(g) = R(g) + c * R_max * sqrt(2 ln(N + 1) / n(g)), with n(g) the
window size, N the bucket's total, R_max the best estimate (c is
scale-free). An arm with no sample scores +inf. The arm just above the
current one (gamma + 1) also scores +inf when its newest sample is older
than `online_window` stable steps of the bucket AND it could win if the one
draft position the current gamma cannot see were always accepted: probing it
refreshes that position's acceptance, which a phase change may have moved.

A new bucket copies the windows of the nearest bucket that has samples and
starts where that bucket is (seeding, no warm-up); when none has, it sweeps
every feasible arm from max gamma downwards (`online_warmup_samples`
stable steps each), then starts from the best (or the incumbent).
"""

from __future__ import annotations

import math
from collections import deque

from vllm_vspec.acceptance_stats import PositionAcceptance, expected_tokens_all
from vllm_vspec.config import VSpecConfig
from vllm_vspec.policies.governor import Governor


class _Arms:
    """Per-arm windows of one bucket: (bucket step index, requests/s) samples."""

    def __init__(self, window: int, incumbent: int | None):
        self.window = window
        self.rate: dict[int, deque[float]] = {}
        self.last_seen: dict[int, int] = {}  # arm -> bucket step of its newest sample
        self.steps = 0                        # stable steps observed in this bucket
        self.warmup: list[int] | None = []    # arms still to sweep; None once done
        self.incumbent = incumbent            # gamma in use anywhere when the bucket opened

    def add(self, gamma: int, requests_per_s: float) -> None:
        self.steps += 1
        self.rate.setdefault(gamma, deque(maxlen=self.window)).append(requests_per_s)
        self.last_seen[gamma] = self.steps

    def count(self, gamma: int) -> int:
        return len(self.rate.get(gamma, ()))

    def expired(self, gamma: int) -> bool:
        return self.steps - self.last_seen.get(gamma, -self.window) > self.window

    def copy_from(self, other: "_Arms") -> None:
        for g, r in other.rate.items():
            self.rate[g] = deque(r, maxlen=self.window)
            self.last_seen[g] = 0


class OnlinePolicy:
    def __init__(self, config: VSpecConfig):
        self.config = config
        self.governor = Governor(config)
        self.acceptance = PositionAcceptance(config.max_gamma, config.ewma_weight,
                                             config.min_observations)
        self.buckets: dict[int, _Arms] = {}
        self._last_gamma: int | None = None   # last decision, any bucket

    # ------------------------------------------------------------ decide
    def decide(self, batch, bucket: int, lo: int, hi: int) -> tuple[int, str]:
        arms = self.buckets.get(bucket)
        if arms is None:
            gamma, reason = self._open(bucket, lo, hi)
        elif arms.warmup is not None:
            gamma, reason = self._warmup(bucket, arms, lo, hi)
        else:
            gamma, reason = self.governor.step(
                bucket, lo, hi, lambda: self.scores(bucket, lo, hi), "ucb")
        self._last_gamma = gamma
        return gamma, reason

    def _open(self, bucket: int, lo: int, hi: int) -> tuple[int, str]:
        arms = _Arms(self.config.online_window, incumbent=self._last_gamma)
        self.buckets[bucket] = arms
        source = self._nearest_measured(bucket)
        if source is not None:
            arms.copy_from(self.buckets[source])
            arms.warmup = None
            seed = min(max(self.governor.gamma[source], lo), hi)
            self.governor.start(bucket, seed)
            return seed, "seed"
        arms.warmup = list(range(hi, lo - 1, -1)) if self.config.online_warmup_samples else []
        return self._warmup(bucket, arms, lo, hi)

    def _nearest_measured(self, bucket: int) -> int | None:
        measured = [b for b, a in self.buckets.items() if a.warmup is None and a.rate]
        if not measured:
            return None
        # Buckets are powers of two: distance is the log ratio; ties prefer
        # the smaller bucket.
        return min(measured, key=lambda b: (abs(math.log2(b / bucket)), b))

    def _warmup(self, bucket: int, arms: _Arms, lo: int, hi: int) -> tuple[int, str]:
        need = self.config.online_warmup_samples
        while arms.warmup and (arms.warmup[0] > hi or arms.warmup[0] < lo
                               or arms.count(arms.warmup[0]) >= need):
            arms.warmup.pop(0)
        if arms.warmup:
            gamma = arms.warmup[0]
            self.governor.start(bucket, gamma)
            return gamma, "warmup"
        arms.warmup = None
        means = self.estimates(bucket, lo, hi)
        if self.config.online_warmup_return == "incumbent" and arms.incumbent is not None:
            gamma = min(max(arms.incumbent, lo), hi)
        elif means:
            gamma = max(means, key=lambda g: (means[g], -g))
        else:
            gamma = hi
        self.governor.start(bucket, gamma)
        return gamma, "warmup"

    def estimates(self, bucket: int, lo: int, hi: int) -> dict[int, float]:
        """R(g), committed tokens per second, for the arms of [lo, hi] that
        have samples in this bucket."""
        arms = self.buckets[bucket]
        e = expected_tokens_all(self.acceptance.rates(), hi)
        return {g: e[g] * sum(r) / len(r)
                for g, r in arms.rate.items() if lo <= g <= hi and r}

    def scores(self, bucket: int, lo: int, hi: int) -> dict[int, float]:
        """UCB score of every arm in [lo, hi] (see the module docstring)."""
        arms = self.buckets[bucket]
        means = self.estimates(bucket, lo, hi)
        r_max = max(means.values(), default=0.0)
        total = sum(arms.count(g) for g in means)
        c = self.config.online_exploration
        out = {}
        for g in range(lo, hi + 1):
            n = arms.count(g)
            out[g] = (means[g] + c * r_max * math.sqrt(2 * math.log(total + 1) / n)
                      if n else math.inf)
        probe = self.governor.gamma[bucket] + 1
        if lo <= probe <= hi and arms.count(probe) and arms.expired(probe):
            e = expected_tokens_all(self.acceptance.rates(), probe)
            # E(probe) if position probe-1 were always accepted.
            e_best = e[probe - 1] + (e[probe - 1] - e[probe - 2] if probe >= 2 else 1.0)
            if e_best / e[probe] * means[probe] > r_max * (1.0 + self.config.hysteresis):
                out[probe] = math.inf
        return out

    # ------------------------------------------------------------ observe
    def observe(self, outcome) -> None:
        fb = outcome.feedback
        self.acceptance.update(fb.drafted, fb.accepted)
        arms = self.buckets.get(outcome.bucket)
        if outcome.stable and arms is not None:
            arms.add(fb.gamma, outcome.batch.num_reqs / outcome.interval_s)
