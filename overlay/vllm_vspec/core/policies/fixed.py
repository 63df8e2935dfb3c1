"""`fixed` policy: always config.fixed_gamma (capped to what fits the step),
at the widest tree width the controller allows (min width = max width pins
one (gamma, width) arm); when that arm does not fit the step, the feasible
arm nearest to it."""

from __future__ import annotations

from vllm_vspec.core.arms import Arm, GammaArms, nearest
from vllm_vspec.config import VSpecConfig


class FixedPolicy:
    def __init__(self, config: VSpecConfig, space=None):
        self.space = GammaArms() if space is None else space
        self.gamma = self.space.arm(config.fixed_gamma, self.space.max_width)

    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: Arm | None) -> tuple[Arm, str]:
        arms = self.space.arms(batch, lo, hi)
        # Below min_gamma it stays fixed_gamma: min_gamma bounds adaptive policies.
        if self.gamma not in arms and self.space.gamma(self.gamma) >= lo:
            return nearest(self.space, self.gamma, arms), "infeasible"
        return self.gamma, "fixed"

    def opening(self) -> Arm:
        """The arm in force before the first decision (a prefill step's
        drafts): this policy's one arm."""
        return self.gamma

    def observe(self, outcome) -> None:
        """Nothing to learn."""
