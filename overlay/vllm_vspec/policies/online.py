"""`online` policy (default): a UCB bandit over gamma arms, per batch-size bucket.

Reward of an arm = committed tokens per second measured on its stable steps
(see controller.py), kept in a sliding window of the last `online_window`
rewards per (bucket, arm), so the policy follows phase changes.

    score(g) = R(g) + c * R_max * sqrt(2 ln(N + 1) / n(g))

R(g) is the window mean, n(g) its size, N the sum of n over the bucket's
arms, R_max the best mean (so c is scale-free). An arm with n(g) = 0 scores
+inf (it is tried once it is within `max_gamma_step`).

A new bucket either copies the arms of the nearest bucket that has rewards
(seeding: no warm-up, start where that bucket is) or, when none has, sweeps
every feasible arm from max gamma downwards (`online_warmup_samples`
rewards each) and then starts from the best (or the incumbent).
"""

from __future__ import annotations

import math
from collections import deque

from vllm_vspec.config import VSpecConfig
from vllm_vspec.policies.governor import Governor


class _Arms:
    """Reward windows of one bucket."""

    def __init__(self, window: int, incumbent: int | None):
        self.window = window
        self.rewards: dict[int, deque[float]] = {}
        self.warmup: list[int] | None = []   # arms still to sweep; None once done
        self.incumbent = incumbent           # gamma in use anywhere when the bucket opened

    def add(self, gamma: int, reward: float) -> None:
        self.rewards.setdefault(gamma, deque(maxlen=self.window)).append(reward)

    def count(self, gamma: int) -> int:
        return len(self.rewards.get(gamma, ()))

    def means(self) -> dict[int, float]:
        return {g: sum(r) / len(r) for g, r in self.rewards.items() if r}

    def copy_from(self, other: "_Arms") -> None:
        for g, r in other.rewards.items():
            self.rewards[g] = deque(r, maxlen=self.window)


class OnlinePolicy:
    def __init__(self, config: VSpecConfig):
        self.config = config
        self.governor = Governor(config)
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
                bucket, lo, hi, lambda: self._scores(arms, lo, hi), "ucb")
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
        measured = [b for b, a in self.buckets.items() if a.warmup is None and a.means()]
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
        means = {g: m for g, m in arms.means().items() if lo <= g <= hi}
        if self.config.online_warmup_return == "incumbent" and arms.incumbent is not None:
            gamma = min(max(arms.incumbent, lo), hi)
        elif means:
            gamma = max(means, key=lambda g: (means[g], -g))
        else:
            gamma = hi
        self.governor.start(bucket, gamma)
        return gamma, "warmup"

    def _scores(self, arms: _Arms, lo: int, hi: int) -> dict[int, float]:
        means = arms.means()
        r_max = max(means.values(), default=0.0)
        total = sum(arms.count(g) for g in means)
        c = self.config.online_exploration
        scores = {}
        for g in range(lo, hi + 1):
            n = arms.count(g)
            scores[g] = (means[g] + c * r_max * math.sqrt(2 * math.log(total + 1) / n)
                         if n else math.inf)
        return scores

    # ------------------------------------------------------------ observe
    def observe(self, outcome) -> None:
        if outcome.stable:
            arms = self.buckets.get(outcome.bucket)
            if arms is not None:
                arms.add(outcome.feedback.gamma, outcome.reward)
