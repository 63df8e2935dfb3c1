"""hosts/retained_hidden.RetainedHidden: the target hidden states lazy
gamma-0 steps keep for an EAGLE-type head's catch-up (no engine).

Spec: entries are keyed by KV slot and claimed per request; a request's
re-processed positions replace its earlier claims; an entry lives while any
request claims it (prefix-cache sharers adopt what a writer kept); releasing
frees exactly what nobody claims; `needed`/`room` say whether a step fits;
the pool holds at most `capacity` tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_vspec.hosts.retained_hidden import RetainedHidden


def _values(keys: np.ndarray, width: int = 3) -> torch.Tensor:
    """A recognisable state per key: row i is keys[i] repeated."""
    return torch.from_numpy(np.repeat(keys[:, None], width, axis=1).astype(np.float32))


def _check(store: RetainedHidden, keys: np.ndarray, present: list[bool]) -> None:
    held, values = store.gather(keys)
    assert held.tolist() == present, f"keys {keys.tolist()}: held {held.tolist()}"
    if any(present):
        assert values[:, 0].tolist() == keys[held].astype(np.float32).tolist()


def test_a_step_is_kept_per_request_and_read_back_by_key():
    store = RetainedHidden(16)
    keys = np.array([100, 101, 102, 200], dtype=np.int64)   # "a": positions 5-7, "b": 9
    store.retain(["a", "b"], [5, 9], [3, 1], keys, _values(keys))
    assert len(store) == 4 and store.room == 12
    assert store.claimed("a").tolist() == [5, 6, 7] and store.claimed("b").tolist() == [9]
    _check(store, np.array([102, 100, 300]), [True, True, False])
    store.release(["a"])
    _check(store, keys, [False, False, False, True])
    assert store.room == 15 and store.claimed("a").size == 0


def test_positions_processed_again_replace_the_earlier_claims():
    # A step verified 3 drafts at positions 4-7 (keys 40-43); one was
    # accepted, so the next step processes positions 6 and 7 again.
    store = RetainedHidden(8)
    first = np.arange(40, 44, dtype=np.int64)
    store.retain(["a"], [4], [4], first, _values(first))
    again = np.array([42, 43], dtype=np.int64)
    store.retain(["a"], [6], [2], again, _values(again) * -1)
    assert store.claimed("a").tolist() == [4, 5, 6, 7] and len(store) == 4
    held, values = store.gather(first)
    assert held.all() and values[:, 0].tolist() == [40, 41, -42, -43]
    # A shorter re-processing drops the positions beyond it.
    store.retain(["a"], [5], [1], np.array([41]), _values(np.array([41])))
    assert store.claimed("a").tolist() == [4, 5] and len(store) == 2


def test_an_adopted_entry_lives_until_its_last_claimer_releases_it():
    store = RetainedHidden(8)
    keys = np.arange(10, 14, dtype=np.int64)
    store.retain(["writer"], [0], [4], keys, _values(keys))
    # A prefix-cache hit on the writer's block: positions 0-3 and 4 (not kept).
    missing = store.adopt("reader", np.arange(5), np.array([10, 11, 12, 13, 99]))
    assert missing == 1 and store.claimed("reader").tolist() == [0, 1, 2, 3]
    store.release(["writer"])
    _check(store, keys, [True] * 4)
    store.release(["reader"])
    _check(store, keys, [False] * 4)
    assert store.room == 8


def test_room_and_needed_say_whether_a_step_fits():
    store = RetainedHidden(4)
    keys = np.arange(3, dtype=np.int64)
    assert store.needed(keys) == 3 and store.room == 4
    store.retain(["a"], [0], [3], keys, _values(keys))
    more = np.array([2, 3, 4], dtype=np.int64)  # 2 is held: it reuses its row
    assert store.needed(more) == 2 > store.room == 1
    with pytest.raises(ValueError, match="do not fit"):
        store.retain(["b"], [0], [3], more, _values(more))


def test_freed_rows_are_reused_and_keys_beyond_any_seen_grow_the_index():
    store = RetainedHidden(2)
    for step in range(20):
        key = np.array([step * 1000], dtype=np.int64)
        store.retain([f"r{step}"], [0], [1], key, _values(key))
        _check(store, key, [True])
        store.release([f"r{step}"])
        assert len(store) == 0


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        RetainedHidden(0)
