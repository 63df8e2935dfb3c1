"""Admission of draft slots: survival scores, the budget, the admitted prefixes.

A slot is (request r, draft position j). With a_{r,i} the conditional
acceptance of slot (r, i) (calibration.py), its SURVIVAL is

    s_{r,j} = prod_{i<=j} a_{r,i}

the probability that verifying the slot commits its token (every slot
before it must be accepted too). So a step that verifies, per request, a
prefix of its draft commits in expectation B + (sum of the admitted s):
each request commits its own target token plus every accepted draft.

Rules and their invariants:
- Ranking: slots are ordered by (-s, request index, position): highest
  survival first; a tie goes to the request listed first, then to the
  earlier position. `admit(scores, n)` admits exactly the first n slots of
  that order, i.e. the top-n survival scores.
- Prefix: every a is in [0, 1], so s is non-increasing along a request;
  with ties broken towards the earlier position, a request's admitted
  slots are always a prefix of its draft (positions 0..k-1). Verifying a
  prefix is what makes strict acceptance lossless: the target judges the
  first k drafts exactly as if the request had drafted k.
- Budget 0 admits nothing: a target-only step.
- `best_budget` takes the budget n maximising (B + top-n survival sum) /
  cost(n), the expected committed tokens per millisecond; ties go to the
  smaller budget (it costs less on every other count).
"""

from __future__ import annotations

from typing import Sequence


def survival(acceptance: Sequence[float]) -> list[float]:
    """Running product of conditional acceptance (each clipped to [0, 1])."""
    out, run = [], 1.0
    for a in acceptance:
        run *= min(max(a, 0.0), 1.0)
        out.append(run)
    return out


def ranked(scores: Sequence[Sequence[float]]) -> list[tuple[float, int, int]]:
    """Every slot as (-score, request index, position), best first: plain
    tuple order is the ranking rule of the module docstring."""
    slots = [(-s, r, j) for r, row in enumerate(scores) for j, s in enumerate(row)]
    slots.sort()
    return slots


def admitted_counts(ranking: Sequence[tuple[float, int, int]], num_rows: int,
                    budget: int) -> list[int]:
    """Per request, its slots among the first `budget` of `ranking`."""
    admitted = [0] * num_rows
    for _, r, _ in ranking[:max(budget, 0)]:
        admitted[r] += 1
    return admitted


def admit(scores: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Per request, how many leading slots are admitted when the top
    `budget` survival scores win (budget clipped to [0, number of slots])."""
    return admitted_counts(ranked(scores), len(scores), budget)


def best_budget(sorted_scores: Sequence[float], base: float, fixed_ms: float,
                per_slot_ms: float, max_budget: int | None = None) -> tuple[int, float]:
    """(n, value): the n in 0..max_budget (default: every slot) maximising
    V(n) = (base + sum(sorted_scores[:n])) / (fixed_ms + per_slot_ms * n),
    the expected tokens per ms, and V(n). `sorted_scores` best first,
    `base` the tokens committed without drafts (the batch size),
    per_slot_ms >= 0. V(n) is the mediant of V(n-1) and s_n / per_slot_ms,
    so it rises exactly while s_n > per_slot_ms * V(n-1); scores falling,
    once a slot does not raise it no later one does: the scan stops there
    (ties keep the smaller n)."""
    limit = len(sorted_scores) if max_budget is None else min(max_budget, len(sorted_scores))
    gained, cost = base, max(fixed_ms, 1e-9)
    best_n, best = 0, gained / cost
    for n in range(1, limit + 1):
        s = sorted_scores[n - 1]
        if s <= per_slot_ms * best:
            break
        gained += s
        cost += per_slot_ms
        best_n, best = n, gained / cost
    return best_n, best
