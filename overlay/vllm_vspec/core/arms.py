"""The arms a policy chooses from: draft lengths (gamma) at width 1, or
(gamma, width) trees (docs/design/eagle-tree.md, sections 1 and 4.5).

An arm space owns everything that depends on what an arm is: which arms a
step may take, which are neighbours, how to move towards another, their
cost order. Policies and the governor are written against it once:

- `GammaArms` (width 1, the default): an arm IS its gamma, a plain int,
  exactly as before arms had widths, so a linear engine's controller
  decides and tallies as it did (tests/unit/test_arm_replay.py replays traces
  recorded before this module existed).
- `TreeArms(min_width, max_width, max_nodes)`: an arm is a (gamma, width)
  tuple. A tree of depth gamma and width W drafts gamma*W nodes; the host's
  `num_speculative_tokens` K is that node budget, so an arm is feasible iff
  gamma*W <= K and num_reqs * (1 + gamma*W) <= max_num_batched_tokens
  (the verify pass's query tokens). Gamma 0 (a target-only step) has no
  tree: its arm is (0, 1) whatever the widths. A step whose batch rules a
  tree out (`BatchState.tree_allowed`) takes width-1 arms only, and so does
  a step where no tree of at least `min_width` fits.

Also here: acceptance per width (a tree's conditional acceptance per depth
depends on its width), shared by the policies that estimate E(arm).

No vLLM import: host-agnostic core.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from vllm_vspec.core.acceptance_stats import PositionAcceptance, expected_tokens_all
from vllm_vspec.core.steps import BatchState, feasible_max_gamma

Arm = Hashable          # an int (GammaArms) or a (gamma, width) tuple (TreeArms)


def arm_label(gamma: int, width: int) -> str:
    """How the controller's summary and the simulator name an arm: "3" for
    gamma 3 at width 1 (as before widths existed), "2x4" for depth 2, width 4."""
    return str(gamma) if width == 1 else f"{gamma}x{width}"


class GammaArms:
    """Width 1: an arm is its gamma (int)."""

    max_width = 1

    def arms(self, batch: BatchState, lo: int, hi: int) -> Sequence[int]:
        """The step's feasible arms in cost order (the controller already cut
        [lo, hi] to what fits the token budget)."""
        return range(lo, hi + 1)

    def arm(self, gamma: int, width: int) -> int:
        return gamma

    def gamma(self, arm: int) -> int:
        return arm

    def width(self, arm: int) -> int:
        return 1

    def cost(self, arm: int) -> tuple[int, ...]:
        """Sort key, cheapest first: ties between arms go to the cheaper."""
        return (arm,)

    def distance(self, a: int, b: int) -> int:
        return abs(a - b)

    def neighbours(self, arm: int) -> list[int]:
        return [arm - 1, arm + 1]

    def above(self, arm: int) -> int:
        """The arm one draft position deeper."""
        return arm + 1

    def group(self, arm: int) -> int:
        """The width whose line (step time against gamma) the arm lies on:
        one line at width 1."""
        return 1

    def sweep(self, arms: Sequence[int], upwards: bool) -> list[int]:
        """The order a warm-up sweep visits `arms`."""
        return list(arms) if upwards else list(reversed(arms))

    def span(self, known: Sequence[int]) -> Sequence[int]:
        """Every arm up to the deepest of `known` (what a seed carries)."""
        return range(0, max(known) + 1)

    def toward(self, cur: int, best: int, max_step: int, arms: Sequence[int]) -> int:
        """One move from `cur` towards `best`, at most `max_step` in gamma."""
        return cur + max(-max_step, min(max_step, best - cur))


class TreeArms:
    """An arm is (gamma, width); see the module docstring for feasibility."""

    def __init__(self, min_width: int, max_width: int, max_nodes: int):
        self.min_width, self.max_width, self.max_nodes = min_width, max_width, max_nodes

    def arms(self, batch: BatchState, lo: int, hi: int) -> list[tuple[int, int]]:
        nodes = feasible_max_gamma(batch, self.max_nodes)

        def fitting(widths) -> list[tuple[int, int]]:
            return [self.arm(g, w) for g in range(max(lo, 1), hi + 1) for w in widths
                    if g * w <= nodes]
        wide = fitting(range(self.min_width, self.max_width + 1)) if batch.tree_allowed else []
        out = ([(0, 1)] if lo == 0 else []) + (wide or fitting((1,)))
        return sorted(out, key=self.cost)

    def arm(self, gamma: int, width: int) -> tuple[int, int]:
        return (gamma, width if gamma else 1)

    def gamma(self, arm: tuple[int, int]) -> int:
        return arm[0]

    def width(self, arm: tuple[int, int]) -> int:
        return arm[1]

    def cost(self, arm: tuple[int, int]) -> tuple[int, ...]:
        # Nodes first (verify tokens and drafter queries), then depth
        # (drafter passes).
        return (arm[0] * arm[1], arm[0])

    def distance(self, a: tuple[int, int], b: tuple[int, int]) -> int:
        # A gamma-0 arm has no width: it is one gamma step from every (1, W).
        dw = abs(a[1] - b[1]) if a[0] and b[0] else 0
        return abs(a[0] - b[0]) + dw

    def neighbours(self, arm: tuple[int, int]) -> list[tuple[int, int]]:
        g, w = arm
        if g == 0:
            return [self.arm(1, v) for v in range(1, self.max_width + 1)]
        return [self.arm(g - 1, w), (g + 1, w)] + [(g, v) for v in (w - 1, w + 1) if v >= 1]

    def above(self, arm: tuple[int, int]) -> tuple[int, int]:
        return (arm[0] + 1, arm[1])

    def group(self, arm: tuple[int, int]) -> int:
        """The width whose line (step time against gamma) the arm lies on.
        Gamma 0 lies on every width's line (`on_line`); it is swept with
        the narrowest width."""
        return arm[1] if arm[0] else self.min_width

    def sweep(self, arms: Sequence[tuple[int, int]], upwards: bool) -> list[tuple[int, int]]:
        """Width by width, narrowest first; each width's depths upwards or
        downwards."""
        return sorted(arms, key=lambda a: (self.group(a), a[0] if upwards else -a[0]))

    def span(self, known: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        depth = max(g for g, _ in known)
        widths = sorted({w for _, w in known} | {1})
        return sorted({self.arm(g, w) for g in range(depth + 1) for w in widths}, key=self.cost)

    def toward(self, cur: tuple[int, int], best: tuple[int, int], max_step: int,
               arms: Sequence[tuple[int, int]]) -> tuple[int, int]:
        g = cur[0] + max(-max_step, min(max_step, best[0] - cur[0]))
        if g == best[0]:
            return best
        # Depth limited by max_gamma_step: the width nearest the target's
        # among the feasible arms of that depth. One exists: g lies strictly
        # between the two ends' depths, so g times the deeper end's width
        # fits whenever that end does.
        same = [a for a in arms if a[0] == g]
        return min(same, key=lambda a: (abs(a[1] - best[1]), a[1]))


def on_line(space, arm: Arm, group: int) -> bool:
    """`arm` lies on the step-time line of width `group`: its own width, or
    gamma 0 (no tree)."""
    return space.group(arm) == group or space.gamma(arm) == 0


def nearest(space, arm: Arm, arms: Sequence[Arm]) -> Arm:
    """The arm of `arms` nearest to `arm`, ties to the cheaper."""
    return min(arms, key=lambda a: (space.distance(a, arm), space.cost(a)))


def make_space(min_width: int = 1, max_width: int = 1, max_nodes: int = 0):
    """The arm space of a controller: width 1 unless max_width > 1."""
    if not 1 <= min_width <= max_width:
        raise ValueError(f"tree widths min_width={min_width}, max_width={max_width}: "
                         f"need 1 <= min_width <= max_width")
    return GammaArms() if max_width == 1 else TreeArms(min_width, max_width, max_nodes)


class WidthAcceptance:
    """Per-position conditional acceptance (acceptance_stats.PositionAcceptance)
    for each tree width: position j of a width-W tree is accepted when the
    target's argmax at depth j is among the drafts the beam kept there, which
    grows with W. Width 1 is the linear drafter's, created up front; a width
    is created when first measured and, until then, estimated like an
    unmeasured position (optimistic: it gets tried)."""

    def __init__(self, num_positions: int, ewma_weight: float, min_observations: int):
        self._args = (num_positions, ewma_weight, min_observations)
        self._by_width = {1: PositionAcceptance(*self._args)}

    def _of(self, width: int) -> PositionAcceptance:
        if width not in self._by_width:
            self._by_width[width] = PositionAcceptance(*self._args)
        return self._by_width[width]

    def update(self, drafted: Sequence[int], accepted: Sequence[int], width: int = 1) -> None:
        """Fold in one step whose verified drafts were trees of `width`
        (drafted/accepted are depths)."""
        self._of(width).update(drafted, accepted)

    def rates(self, width: int = 1) -> list[float]:
        return self._of(width).rates()

    def errors(self, width: int = 1) -> list[float]:
        return self._of(width).errors()

    def expected(self, width: int, k_max: int) -> list[float]:
        """[E(0), ..., E(k_max)] for trees of `width`."""
        return expected_tokens_all(self.rates(width), k_max)
