"""Lazy gamma 0 bookkeeping (draft_lag.py) and gamma-0 mode resolution, no engine.

Spec: after draft passes were skipped, the drafter catches up on exactly the
positions it missed, earliest first, in passes that fit its token budget; a
request it has seen whole needs nothing. `auto` picks lazy only where lazy
works; an explicit `lazy` elsewhere fails naming the key and the fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from vllm_vspec.config import VSpecConfig, VSpecConfigError, resolve_gamma0_mode
from vllm_vspec.core.draft_lag import DraftLag, catch_up_passes


BS = 4  # block size of these tests: positions 0-3 in a row's block 0, 4-7 in block 1, ...


def rows(*blocks_per_request):
    """A batch block table as the runner keeps it: one padded row per request."""
    table = np.zeros((len(blocks_per_request), 16), dtype=np.int32)
    for row, blocks in zip(table, blocks_per_request):
        row[:len(blocks)] = list(blocks)
    return table


def test_a_skipped_pass_is_caught_up_from_the_first_missed_position():
    lag = DraftLag(BS)
    a, b, c = range(10, 16), range(20, 26), range(30, 36)
    lag.skipped(["a", "b"], [10, 20], [11, 21], rows(a, b))   # step 1: drafter skipped
    lag.skipped(["a", "b"], [11, 21], [12, 22], rows(a, b))   # step 2: skipped again
    # Step 3 drafts: rows are this step's batch order; "c" never lagged.
    assert lag.take(["c", "b", "a"], [5, 22, 12], rows(c, b, a)) == [(1, 20, 22), (2, 10, 12)]
    assert len(lag) == 0
    assert lag.take(["b", "a"], [23, 13], rows(b, a)) == [], "caught-up requests lag again"


def test_a_request_first_seen_in_a_skipped_step_is_caught_up_from_its_start():
    lag = DraftLag(BS)
    lag.skipped(["new"], [0], [30], rows(range(8)))   # its prefill step skipped the drafter
    assert lag.take(["new"], [37], rows(range(10))) == [(0, 0, 37)]


def test_a_recomputed_request_needs_no_catch_up():
    # Preempted after lagging from 40; resumed from position 0, the draft
    # pass of the resuming step covers what it recomputes.
    lag = DraftLag(BS)
    lag.skipped(["a"], [40], [41], rows(range(11)))
    assert lag.take(["a"], [0], rows(range(11))) == []


def test_a_resumed_skip_keeps_the_earliest_missed_position():
    lag = DraftLag(BS)
    lag.skipped(["a"], [40], [41], rows(range(11)))
    lag.skipped(["a"], [0], [41], rows(range(11)))    # recomputed from 0 in a skipped step
    assert lag.take(["a"], [50], rows(range(13))) == [(0, 0, 50)]


def test_a_cache_hit_on_a_block_a_skipped_pass_wrote_catches_up_from_that_block():
    lag = DraftLag(BS)
    # "a" wrote positions 8-11 (its block 7, the third of its row) while skipped.
    lag.skipped(["a"], [8], [12], rows([5, 6, 7]))
    lag.from_cache("hit", 12, [5, 6, 7])               # shares a's three blocks
    assert lag.take(["hit"], [12], rows([5, 6, 7, 9])) == [(0, 8, 12)]


def test_a_cache_hit_on_blocks_a_draft_pass_covered_needs_nothing():
    lag = DraftLag(BS)
    lag.skipped(["a"], [8], [12], rows([5, 6, 7]))
    lag.take(["a"], [13], rows([5, 6, 7, 8]))         # a's blocks 5-7 now wholly caught up
    lag.from_cache("hit", 12, [5, 6, 7])
    assert lag.idle and lag.take(["hit"], [12], rows([5, 6, 7, 9])) == []


def test_finished_requests_are_forgotten():
    lag = DraftLag(BS)
    lag.skipped(["a", "b"], [3, 4], [4, 5], rows([1, 2], [3, 4]))
    lag.forget(["a"])
    assert lag.take(["a", "b"], [9, 9], rows([1, 2, 5], [3, 4, 6])) == [(1, 4, 9)]


def test_catch_up_passes_fit_the_budget_and_write_earlier_positions_first():
    passes = catch_up_passes([(0, 0, 5), (1, 10, 12), (2, 0, 9)], max_tokens=4)
    assert passes == [[(0, 0, 4)], [(0, 4, 5), (1, 10, 12), (2, 0, 1)],
                      [(2, 1, 5)], [(2, 5, 9)]]
    for p in passes:
        assert sum(end - first for _, first, end in p) <= 4
        assert len({row for row, _, _ in p}) == len(p), "one part per row per pass"


def test_catch_up_passes_of_nothing_is_no_pass():
    assert catch_up_passes([], 8) == []
    with pytest.raises(ValueError, match="max_tokens"):
        catch_up_passes([(0, 0, 1)], 0)


@pytest.mark.parametrize("method, async_sched, worker, want", [
    ("draft_model", False, True, "lazy"),
    ("draft_model", True, True, "sync"),    # lazy is built for sync scheduling
    ("draft_model", False, False, "sync"),  # the stock worker cannot skip the pass
    ("eagle", False, True, "lazy"),         # the skipped steps keep the target hidden states
    ("eagle3", False, True, "lazy"),
    ("eagle", True, True, "sync"),
    ("mtp", False, True, "sync"),           # no catch-up built for an MTP layer
    ("ngram", False, True, "lazy"),     # nothing to catch up: the search is skipped
    ("ngram", True, True, "sync"),
    ("ngram", False, False, "sync"),
])
def test_auto_is_lazy_only_where_lazy_works(method, async_sched, worker, want):
    cfg = VSpecConfig(min_gamma=0)
    assert resolve_gamma0_mode(cfg, method, async_sched, worker) == want


def test_gamma0_mode_does_not_matter_without_gamma_0():
    cfg = VSpecConfig(min_gamma=1, gamma0_mode="lazy")
    assert resolve_gamma0_mode(cfg, "eagle", True, False) == "sync"


def test_auto_is_sync_for_eagle_trees():
    cfg = VSpecConfig(min_gamma=0, tree_width=2)
    assert resolve_gamma0_mode(cfg, "eagle", False, True) == "sync"


@pytest.mark.parametrize("method, async_sched, tree_width", [
    ("mtp", False, 1), ("draft_model", True, 1), ("eagle", False, 2)])
def test_explicit_lazy_where_it_cannot_work_names_the_key_and_the_fix(method, async_sched,
                                                                      tree_width):
    cfg = VSpecConfig(min_gamma=0, gamma0_mode="lazy", tree_width=tree_width)
    with pytest.raises(VSpecConfigError, match=r"vspec\.gamma0_mode='lazy'.*use 'sync' or 'auto'"):
        resolve_gamma0_mode(cfg, method, async_sched, True)
