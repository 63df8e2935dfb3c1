"""`cycle` policy (diagnostics): a different gamma every step.

The order interleaves high and low values (for [0, 4]: 4, 0, 3, 1, 2, 4, ...)
so that consecutive steps differ and both the largest jumps and gamma 0 occur
early. Used to prove greedy outputs stay exact while gamma changes, and to
exercise every verify width (graph bucket) on a new host. With tree arms
the same interleaving runs over the step's feasible arms in cost order
(nodes, then depth), so the tree shape changes every step too.
"""

from __future__ import annotations

from vllm_vspec.core.arms import Arm, GammaArms
from vllm_vspec.config import VSpecConfig


def cycle_order(lo: int, hi: int) -> list[int]:
    """lo..hi interleaved from both ends: hi, lo, hi-1, lo+1, ..."""
    order, a, b = [], lo, hi
    while a <= b:
        order.append(b)
        if a != b:
            order.append(a)
        a, b = a + 1, b - 1
    return order


class CyclePolicy:
    def __init__(self, config: VSpecConfig, space=None):
        self.space = GammaArms() if space is None else space
        self.step = 0

    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: Arm | None) -> tuple[Arm, str]:
        arms = self.space.arms(batch, lo, hi)
        order = cycle_order(0, len(arms) - 1)
        arm = arms[order[self.step % len(order)]]
        self.step += 1
        return arm, "cycle"

    def observe(self, outcome) -> None:
        """Nothing to learn."""
