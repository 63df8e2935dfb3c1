"""`fixed` policy: always config.fixed_gamma (capped to what fits the step)."""

from __future__ import annotations

from vllm_vspec.config import VSpecConfig


class FixedPolicy:
    def __init__(self, config: VSpecConfig):
        self.gamma = config.fixed_gamma

    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: int | None) -> tuple[int, str]:
        if self.gamma > hi:
            return hi, "infeasible"
        return self.gamma, "fixed"

    def observe(self, outcome) -> None:
        """Nothing to learn."""
