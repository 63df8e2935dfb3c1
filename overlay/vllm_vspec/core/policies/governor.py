"""The switching rules shared by adaptive policies, per batch-size bucket:
dwell (reconsider only every `control_interval` decisions), hysteresis
(switch only for a gain above `hysteresis`), and at most `max_gamma_step`
change of gamma per decision. Arms are those of the policy's arm space
(arms.py): gammas at width 1, (gamma, width) trees otherwise.

A move to an arm scored +inf (never measured, or a probe) is exploration,
not a verdict: the arm it left stays the incumbent, so the next decision
compares against it and goes back without having to beat the hysteresis.

The hysteresis guards against noise, so it yields to evidence: a policy
that can say an arm is clearly ahead of the current one (`clearly_ahead`:
the online policy's judged probes, policies/online.py AHEAD_MIN_EVIDENCE)
moves to it when it scores best, however small its lead. Else a neighbour a
few percent better than the current arm, less than the hysteresis, would
never be reached.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from vllm_vspec.core.arms import Arm, GammaArms, nearest
from vllm_vspec.config import VSpecConfig


class Governor:
    def __init__(self, config: VSpecConfig, space=None):
        self.control_interval = config.control_interval
        self.hysteresis = config.hysteresis
        self.max_step = config.max_gamma_step
        self.space = GammaArms() if space is None else space
        self.gamma: dict[int, Arm] = {}      # bucket -> current arm (a gamma at width 1)
        self._dwell: dict[int, int] = {}     # bucket -> decisions since last reconsidered
        self._incumbent: dict[int, Arm] = {}  # bucket -> arm left for an exploring move

    def start(self, bucket: int, gamma: Arm) -> None:
        """Put a bucket on an arm and restart its dwell."""
        self.gamma[bucket] = gamma
        self._dwell[bucket] = 0
        self._incumbent.pop(bucket, None)

    def exploring(self, bucket: int) -> bool:
        """The bucket's current gamma is an exploring move (see the module
        docstring): the next control point goes back unless it wins."""
        return bucket in self._incumbent

    def step(self, bucket: int, lo: int, hi: int,
             scores: Callable[[], Mapping[Arm, float]], word: str,
             arms: Sequence[Arm] | None = None,
             clearly_ahead: Callable[[Arm], bool] | None = None) -> tuple[Arm, str]:
        """One decision for a bucket that already has an arm. `arms`: the
        step's feasible arms in cost order (default: the gammas lo..hi, width
        1). `scores` is called only at a control point and maps each of them
        to its score (higher is better). `clearly_ahead(arm)`: whether the
        policy's evidence puts `arm` clearly ahead of the current arm (it
        then need not beat the hysteresis)."""
        space = self.space
        arms = range(lo, hi + 1) if arms is None else arms
        cur = self.gamma[bucket]
        if cur not in arms:
            # The batch outgrew the token budget (or the range): move now.
            self.start(bucket, nearest(space, cur, arms))
            return self.gamma[bucket], "infeasible"
        self._dwell[bucket] += 1
        if self._dwell[bucket] < self.control_interval:
            return cur, "hold"
        self._dwell[bucket] = 0
        s = scores()
        ref = self._incumbent.pop(bucket, cur)
        ref = ref if ref in s else cur
        # Ties favour the reference arm, then the cheaper arm.
        best = max(s, key=lambda a: (s[a], a == ref, [-c for c in space.cost(a)]))
        reason = word
        if best != ref and s[best] <= s[ref] * (1.0 + self.hysteresis):
            if ref == cur and clearly_ahead is not None and clearly_ahead(best):
                reason = "evidence"
            else:
                best, reason = ref, "hysteresis"
        if best == cur:
            return cur, reason
        move = space.toward(cur, best, self.max_step, arms)
        self.gamma[bucket] = move
        if s[best] == math.inf:
            self._incumbent[bucket] = ref
        return move, reason
