"""The switching rules shared by adaptive policies, per batch-size bucket:
dwell (reconsider only every `control_interval` decisions), hysteresis
(switch only for a gain above `hysteresis`), and at most `max_gamma_step`
change per decision.

A move to an arm scored +inf (never measured, or a probe) is exploration,
not a verdict: the arm it left stays the incumbent, so the next decision
compares against it and goes back without having to beat the hysteresis.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from vllm_vspec.config import VSpecConfig


class Governor:
    def __init__(self, config: VSpecConfig):
        self.control_interval = config.control_interval
        self.hysteresis = config.hysteresis
        self.max_step = config.max_gamma_step
        self.gamma: dict[int, int] = {}      # bucket -> current gamma
        self._dwell: dict[int, int] = {}     # bucket -> decisions since last reconsidered
        self._incumbent: dict[int, int] = {}  # bucket -> arm left for an exploring move

    def start(self, bucket: int, gamma: int) -> None:
        """Put a bucket on gamma and restart its dwell."""
        self.gamma[bucket] = gamma
        self._dwell[bucket] = 0
        self._incumbent.pop(bucket, None)

    def exploring(self, bucket: int) -> bool:
        """The bucket's current gamma is an exploring move (see the module
        docstring): the next control point goes back unless it wins."""
        return bucket in self._incumbent

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
        ref = self._incumbent.pop(bucket, cur)
        ref = ref if ref in s else cur
        # Ties favour the reference arm, then the smaller gamma (cheaper).
        best = max(s, key=lambda g: (s[g], g == ref, -g))
        reason = word
        if best != ref and s[best] <= s[ref] * (1.0 + self.hysteresis):
            best, reason = ref, "hysteresis"
        if best == cur:
            return cur, reason
        move = max(-self.max_step, min(self.max_step, best - cur))
        self.gamma[bucket] = cur + move
        if s[best] == math.inf:
            self._incumbent[bucket] = ref
        return cur + move, reason
