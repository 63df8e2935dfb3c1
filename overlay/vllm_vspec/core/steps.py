"""The types of one decode step, shared by the controller, the policies, the
host adapters and the simulator, and the batch-size bucket rules.

A leaf module (no import from vllm_vspec): controller.py builds on it and
policies/ import from it, so neither imports the other's module for a type.

One owner per fact: the host reports what a step did (BatchState when it is
scheduled, StepFeedback when its output is processed); the controller owns
what it decided (Decision) and everything derived from the two (the step's
interval, reward and stability, in StepOutcome). A policy reads them and
keeps only its own estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class BatchState:
    """The batch as the host schedules it, before gamma is chosen."""

    num_reqs: int                  # decode requests scheduled this step (B)
    max_num_batched_tokens: int    # gamma g feasible iff num_reqs * (g + 1) <= this
    mean_context_len: float = 0.0
    # False when a request of the batch rules a tree out (sampled, or
    # context-dependent logits processing: docs/design/eagle-tree.md 4.2): the
    # step's arms are width 1. Read by tree arm spaces (arms.py) and by the
    # controller's prefill steps; the one place a tree is allowed.
    tree_allowed: bool = True
    # Prompt tokens the step processes (new, resumed or chunked prompts):
    # 0 on a decode step, the only kind a policy decides.
    prefill_tokens: int = 0
    # The scheduled requests' ids, and the tokens each may still generate
    # (its max_tokens, or the model's length, less what it generated), in
    # the same order; empty where the host does not say.
    requests: tuple = ()
    remaining: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepFeedback:
    """What the host measured of one processed step. The gamma it ran and
    its timing are not here: the controller decided the one and stamps the
    other on its own clock (GammaController.decide/observe)."""

    # drafted: per request, draft tokens VERIFIED in this step (proposed with
    # the previous decision); of a tree, its depth. accepted: of those, the
    # accepted ones; of a tree, the accepted path's length.
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]
    committed: int                 # tokens committed this step over the batch
    # The tree width the verified drafts were drafted with, as the drafter
    # reports it (1: linear drafts; one width a step).
    width: int = 1
    # The id of the request of each entry of `drafted` / `accepted`; empty
    # where the host does not say.
    requests: tuple = ()


def covering_gamma(graphed: Iterable[int], gamma: int, k: int) -> int:
    """What a step at `gamma` runs as where only the `graphed` gammas have a
    graph (a verify width 1 + g, or a draft graph of g steps): the smallest
    graphed gamma at or above `gamma`, K past the largest."""
    return min((g for g in graphed if g >= gamma), default=k)


def drafted_depth(entries: int, width: int) -> int:
    """The depth of a verified draft list of `entries` entries drafted at
    tree `width` (W entries a depth, the last depth possibly cut by the
    host's token budget; width 1: a linear draft, its length)."""
    return -(-entries // width)


@dataclass(frozen=True)
class Decision:
    """What a step drafts, as the controller decided it (GammaController)."""

    gamma: int                     # draft depth (the draft length at width 1)
    bucket: int                    # batch-size bucket 2**ceil(log2 B)
    reason: str                    # short word: warmup / ucb / hold / hysteresis / fixed / profile / infeasible / prefill / sticky / ...
    width: int = 1                 # tree width: gamma*width draft nodes (1: a linear draft)
    # False for a step the policy does not decide (reason prefill or
    # sticky): its output is not observed, and the arm in force stays.
    decided: bool = True


@dataclass(frozen=True)
class StepOutcome:
    """What a policy learns from one processed step (built by the controller)."""

    feedback: StepFeedback
    batch: BatchState              # as it was when the step was scheduled
    gamma: int                     # the decision this step was scheduled with (it governs the drafts PROPOSED in it)
    bucket: int
    interval_s: float              # non-overlapping completion interval
    reward: float                  # committed tokens per second of that interval
    stable: bool                   # verified and proposed drafts used the same arm (gamma, width)
    width: int = 1                 # the decision's tree width (with `gamma`, its arm)
    verified_width: int = 1        # width of the drafts VERIFIED here (StepFeedback.width)


class BusySince:
    """When a busy engine's step starts: where the host processed the
    previous step's output, if requests remained then (None once the engine
    may idle: idle time before a step is no step's cost). Output processing
    and scheduling are per-step costs; leaving them out of the interval
    would favour low gammas (they take the same time at every gamma, so
    they shrink the ratio of step times). The one rule the controller's
    step intervals and the /metrics step seconds (hosts/vllm/metrics.py)
    share."""

    def __init__(self) -> None:
        self.since: float | None = None

    def processed(self, now: float, busy: bool) -> float | None:
        """A step's output was processed at `now` (`busy`: requests remain).
        Returns where that step's busy interval began (None: after idle)."""
        since, self.since = self.since, (now if busy else None)
        return since


def bucket_of(num_reqs: int) -> int:
    """Batch-size bucket: the next power of two >= num_reqs (1 for B <= 1)."""
    return 1 if num_reqs <= 1 else 1 << math.ceil(math.log2(num_reqs))


def nearest_bucket(buckets: Iterable[int], bucket: int) -> int | None:
    """Of `buckets`, the one nearest to `bucket` in doublings of batch size
    (buckets are powers of two: distance is the log ratio); ties prefer the
    smaller. None when `buckets` is empty."""
    return min(buckets, key=lambda b: (abs(math.log2(b / bucket)), b), default=None)


def draft_budget(num_reqs: int, max_num_batched_tokens: int) -> int:
    """The token budget of a step in draft tokens a request: the largest n
    with num_reqs * (n + 1) <= max_num_batched_tokens (negative when not
    even target-only fits). The one rule; a tree's n counts its nodes."""
    return max_num_batched_tokens // max(num_reqs, 1) - 1


def feasible_max_gamma(batch: BatchState, max_gamma: int) -> int:
    """Largest gamma (at width 1; of a tree, its nodes: arms.TreeArms) the
    batch's token budget allows (draft_budget), capped at max_gamma."""
    return min(max_gamma, draft_budget(batch.num_reqs, batch.max_num_batched_tokens))
