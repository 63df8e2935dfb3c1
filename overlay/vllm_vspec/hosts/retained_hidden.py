"""Target hidden states that lazy gamma-0 steps keep for an EAGLE-type head.

An EAGLE head's first pass at position p reads the target's hidden state
of p (EAGLE-3: the target's auxiliary layers, combined by the head) and
token p + 1, and writes the head's KV at p. A *lazy* gamma-0 step skips
that pass, so the hidden states of the positions it processed must be kept
until the head catches up on them (core/draft_lag.py says which positions
lag) or until no request needs them any more.

Entries are keyed by KV slot (physical block id * block_size + offset): the
place whose head KV the catch-up writes. A request that starts from
prefix-cached blocks a skipped pass wrote reads the entries its writer kept,
so a key can be claimed by several requests; an entry lives while any
request claims it. Each request's claims are the positions it will catch
up on, in position order.

The pool is one [capacity, width] tensor, allocated at the first retain
(capacity x width x dtype bytes); `room` tells the caller whether a step's
positions fit before it retains them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class RetainedHidden:
    """At most `capacity` tokens' hidden states, by KV slot, claimed per request."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 token, got {capacity}")
        self.capacity = capacity
        self._pool: torch.Tensor | None = None
        self._slot_of = np.full(0, -1, dtype=np.int64)      # KV slot -> pool row (-1: none)
        self._key_of = np.full(capacity, -1, dtype=np.int64)  # pool row -> KV slot
        self._refs = np.zeros(capacity, dtype=np.int32)       # requests claiming each row
        # Free pool rows: a stack, the first `_room` entries of `_free`.
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self._room = capacity
        # req_id -> the (first, keys) chunks it claims, ascending positions
        # across chunks; `first` is the chunk's first position (its keys are
        # at consecutive positions from there) or, for adopted claims, the
        # array of their positions. A decode step appends one chunk a
        # request; _joined concatenates them only when a request's claims
        # are read.
        self._claims: dict[str, list[tuple[int | np.ndarray, np.ndarray]]] = {}

    def __len__(self) -> int:
        """Pool rows in use."""
        return self.capacity - self._room

    @property
    def room(self) -> int:
        return self._room

    def claimed(self, req_id: str) -> np.ndarray:
        """The positions `req_id` claims."""
        held = self._joined(req_id)
        return np.empty(0, np.int64) if held is None else held[0]

    def needed(self, keys: np.ndarray) -> int:
        """Pool rows a retain of `keys` would take at most (keys held already reuse theirs)."""
        return int(np.count_nonzero(self._rows(keys) < 0))

    def retain(self, req_ids: Sequence[str], starts: Sequence[int], counts: Sequence[int],
               keys: np.ndarray, values: torch.Tensor) -> None:
        """Keep values[i] (row i of a step's tokens) at keys[i]: request j
        owns the next counts[j] rows, positions starts[j], starts[j] + 1, ...
        A request's earlier claims from its start on are replaced (a step
        after rejected drafts processes those positions again). This runs
        every lazy gamma-0 step: per request only a dict look-up and an
        append, the rest is one array operation each."""
        if self._pool is None:
            self._pool = torch.empty(self.capacity, values.shape[-1], dtype=values.dtype,
                                     device=values.device)
        claims = self._claims
        for req_id, start in zip(req_ids, starts):
            held = claims.get(req_id)
            # Claims ascend: only a step that starts below the end of a
            # request's last claim (it re-processes positions) replaces any.
            if held is not None and _end(held[-1]) > start:
                self._drop(req_id, lambda pos, s=start: pos >= s)
        rows = self._rows(keys)
        new = rows < 0
        taken = int(np.count_nonzero(new))
        if taken > self._room:
            raise ValueError(f"{taken} tokens do not fit in the {self._room} free "
                             f"of {self.capacity}; check `room` first")
        if taken:
            # Keys repeat only within one request's re-processed positions,
            # which _drop released: every new key is distinct.
            fresh = self._free[self._room - taken:self._room].copy()
            self._room -= taken
            rows[new] = fresh
            self._slot_of[keys[new]] = fresh
            self._key_of[fresh] = keys[new]
        self._pool.index_copy_(0, torch.from_numpy(rows).to(self._pool.device),
                               values.to(self._pool.dtype))
        # A step's keys are distinct (one KV slot a token), so are its rows.
        self._refs[rows] += 1
        offset = 0
        for req_id, start, n in zip(req_ids, starts, counts):
            if n:
                chunk = (start, keys[offset:offset + n])
                held = claims.get(req_id)
                if held is None:
                    claims[req_id] = [chunk]
                else:
                    held.append(chunk)
            offset += n

    def adopt(self, req_id: str, positions: np.ndarray, keys: np.ndarray) -> int:
        """`req_id` will catch up on `positions` (at `keys`, e.g. blocks it
        found in the prefix cache): claim the entries that exist; returns
        how many positions have none."""
        held = self._rows(keys) >= 0
        self._claim(req_id, positions[held], keys[held])
        return int(len(keys) - held.sum())

    def gather(self, keys: np.ndarray) -> tuple[np.ndarray, torch.Tensor | None]:
        """(which keys have an entry, their values in key order)."""
        rows = self._rows(keys)
        held = rows >= 0
        if self._pool is None or not held.any():
            return held, None
        return held, self._pool[torch.from_numpy(rows[held]).to(self._pool.device)]

    def release(self, req_ids: Sequence[str]) -> None:
        """These requests need none of their claims any more (caught up,
        finished or preempted); entries no request claims are freed."""
        for req_id in req_ids:
            self._drop(req_id, None)

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        """The pool row of each key (-1: none), a new array; grows the index
        to cover the keys."""
        if len(keys):
            self._grow(int(keys.max()) + 1)
        return self._slot_of[keys]

    def _grow(self, size: int) -> None:
        if size > len(self._slot_of):
            grown = np.full(max(size, 2 * len(self._slot_of)), -1, dtype=np.int64)
            grown[:len(self._slot_of)] = self._slot_of
            self._slot_of = grown

    def _claim(self, req_id: str, positions: np.ndarray, keys: np.ndarray) -> None:
        if not len(keys):
            return
        np.add.at(self._refs, self._slot_of[keys], 1)
        self._claims.setdefault(req_id, []).append((positions, keys))

    def _joined(self, req_id: str) -> tuple[np.ndarray, np.ndarray] | None:
        """`req_id`'s claims as one (positions, keys) pair (None: it claims none)."""
        chunks = self._claims.get(req_id)
        if chunks is None:
            return None
        if len(chunks) > 1 or not isinstance(chunks[0][0], np.ndarray):
            chunks[:] = [(np.concatenate([_positions(c) for c in chunks]),
                          np.concatenate([c[1] for c in chunks]))]
        return chunks[0]

    def _drop(self, req_id: str, which) -> None:
        """Release `req_id`'s claims at the positions `which` selects (all: None)."""
        held = self._joined(req_id)
        if held is None:
            return
        positions, keys = held
        gone = np.ones(len(keys), dtype=bool) if which is None else which(positions)
        if not gone.any():
            return
        rows = self._slot_of[keys[gone]]
        np.subtract.at(self._refs, rows, 1)
        dead = np.unique(rows[self._refs[rows] == 0])
        self._slot_of[self._key_of[dead]] = -1
        self._key_of[dead] = -1
        self._free[self._room:self._room + len(dead)] = dead
        self._room += len(dead)
        if gone.all():
            del self._claims[req_id]
        else:
            self._claims[req_id] = [(positions[~gone], keys[~gone])]


def _positions(chunk: tuple[int | np.ndarray, np.ndarray]) -> np.ndarray:
    """A claim chunk's positions."""
    first, keys = chunk
    return first if isinstance(first, np.ndarray) else np.arange(first, first + len(keys))


def _end(chunk: tuple[int | np.ndarray, np.ndarray]) -> int:
    """One past a claim chunk's last position."""
    first, keys = chunk
    return int(first[-1]) + 1 if isinstance(first, np.ndarray) else first + len(keys)
