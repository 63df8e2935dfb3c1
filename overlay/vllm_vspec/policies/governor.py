"""The switching rules shared by adaptive policies, per batch-size bucket:
dwell (reconsider only every `control_interval` decisions), hysteresis
(switch only for a gain above `hysteresis`), and at most `max_gamma_step`
change per decision."""

from __future__ import annotations

from typing import Callable, Mapping

from vllm_vspec.config import VSpecConfig


class Governor:
    def __init__(self, config: VSpecConfig):
        self.control_interval = config.control_interval
        self.hysteresis = config.hysteresis
        self.max_step = config.max_gamma_step
        self.gamma: dict[int, int] = {}     # bucket -> current gamma
        self._dwell: dict[int, int] = {}    # bucket -> decisions since last reconsidered

    def start(self, bucket: int, gamma: int) -> None:
        """Put a bucket on gamma and restart its dwell."""
        self.gamma[bucket] = gamma
        self._dwell[bucket] = 0

    def step(self, bucket: int, lo: int, hi: int,
             scores: Callable[[], Mapping[int, float]], word: str) -> tuple[int, str]:
        """One decision for a bucket that already has a gamma. `scores` is
        called only at a control point and maps each candidate gamma in
        [lo, hi] to its score (higher is better)."""
        cur = self.gamma[bucket]
        if cur > hi or cur < lo:
            # The batch outgrew the token budget (or the range): move now.
            self.start(bucket, min(max(cur, lo), hi))
            return self.gamma[bucket], "infeasible"
        self._dwell[bucket] += 1
        if self._dwell[bucket] < self.control_interval:
            return cur, "hold"
        self._dwell[bucket] = 0
        s = scores()
        # Ties favour the current gamma, then the smaller one (cheaper).
        best = max(s, key=lambda g: (s[g], g == cur, -g))
        if best == cur:
            return cur, word
        if s[best] <= s.get(cur, float("-inf")) * (1.0 + self.hysteresis):
            return cur, "hysteresis"
        move = max(-self.max_step, min(self.max_step, best - cur))
        self.gamma[bucket] = cur + move
        return cur + move, word
