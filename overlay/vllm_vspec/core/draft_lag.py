"""Which tokens a lazy gamma-0 step left out of the drafter's KV cache.

A draft model keeps its own KV cache, written by its first pass each step
over the tokens the target just processed. A *lazy* gamma-0 step (config
`gamma0_mode`) skips that pass entirely, so the positions the target
processed in it have no draft KV. Before the next draft pass the drafter
*catches up*: it runs over those positions (no sampling) so its first pass
attends to a complete cache again and drafts what it would have drafted
without the skip.

Invariant kept here: for every request with no entry, the drafter's KV is
complete below the request's step-start position (its num_computed_tokens);
with an entry `p`, it is complete below `p`. Positions are those of the
request's own token sequence; rows are the batch rows of the step.

Prefix caching shares KV blocks between requests, so the blocks a skipped
pass wrote target KV into are remembered as *stale* until a draft pass has
covered them; a request that starts from cached blocks catches up from the
first stale one among them (and needs nothing when none is stale).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# (batch row, first position, end position) of one request's catch-up.
Segment = tuple[int, int, int]


class DraftLag:
    """Per request, the first position the drafter has not seen; per KV
    block (physical id), whether a skipped pass may have left it without
    draft KV. `blocks` is a request's block-table row and `block_rows` the
    batch's block table (a 2-D array, one row per batch row), in blocks of
    `block_size` tokens; only the blocks a request has are read."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._first_missed: dict[str, int] = {}
        self._stale_blocks: set[int] = set()

    def __len__(self) -> int:
        return len(self._first_missed)

    def skipped(self, req_ids: Sequence[str], starts: Sequence[int], ends: Sequence[int],
                block_rows: np.ndarray) -> None:
        """A draft pass was skipped for a step that processed positions
        [start, end) of each request (start: its num_computed_tokens when
        the step began)."""
        bs = self.block_size
        first = self._first_missed
        for req_id, start in zip(req_ids, starts):
            # Only the first skipped position counts; later skips leave it.
            if req_id not in first or start < first[req_id]:
                first[req_id] = start
        if not len(starts):
            return
        # Vectorised (this runs every gamma-0 step): a decode step's tokens
        # lie in one or two blocks of each row.
        lo = np.asarray(starts) // bs
        hi = (np.asarray(ends) - 1) // bs
        rows = np.arange(len(lo))
        stale = [block_rows[rows, lo]]
        for extra in range(1, int((hi - lo).max()) + 1):
            take = lo + extra <= hi
            stale.append(block_rows[rows[take], (lo + extra)[take]])
        self._stale_blocks.update(np.concatenate(stale).tolist())

    def from_cache(self, req_id: str, num_cached: int, blocks: Sequence[int]) -> None:
        """A request starts from `num_cached` prefix-cached tokens (new, or
        resumed after preemption): catch up from the first cached block a
        skipped pass may have left without draft KV."""
        if not self._stale_blocks:
            return
        for j in range(-(-num_cached // self.block_size)):
            if int(blocks[j]) in self._stale_blocks:
                self._mark(req_id, j * self.block_size)
                return

    def take(self, req_ids: Sequence[str], starts: Sequence[int],
             block_rows: np.ndarray) -> list[Segment]:
        """Catch-up segments for a step about to run the draft pass, one per
        lagging request of the batch (row order). After that pass every
        position below each request's start has draft KV, so the requests
        are forgotten and their blocks wholly below start are stale no more."""
        segments = []
        for row, (req_id, start) in enumerate(zip(req_ids, starts)):
            first = self._first_missed.pop(req_id, None)
            # first >= start after a preemption: the step recomputes the
            # request from `start`, and its draft pass covers that.
            if first is not None and first < start:
                segments.append((row, first, start))
        if self._stale_blocks and len(starts):
            # Vectorised: this runs every draft step while any block is stale.
            whole = np.asarray(starts) // self.block_size     # blocks wholly below start
            width = int(whole.max())
            covered = block_rows[:len(starts), :width][np.arange(width) < whole[:, None]]
            self._stale_blocks.difference_update(covered.tolist())
        return segments

    def first_missed(self, req_id: str) -> int | None:
        """The first position of `req_id` the drafter has not seen (None: none)."""
        return self._first_missed.get(req_id)

    @property
    def idle(self) -> bool:
        """Nothing to catch up and no stale block: a draft step needs no work here."""
        return not self._first_missed and not self._stale_blocks

    def forget(self, req_ids: Iterable[str]) -> None:
        """Finished requests need no catch-up."""
        for req_id in req_ids:
            self._first_missed.pop(req_id, None)

    def _mark(self, req_id: str, position: int) -> None:
        first = self._first_missed.get(req_id)
        self._first_missed[req_id] = position if first is None else min(first, position)


def catch_up_passes(segments: Sequence[Segment], max_tokens: int) -> list[list[Segment]]:
    """Split catch-up segments into forward passes of at most `max_tokens`
    tokens. A long segment continues in the next pass, so within a request
    the earlier positions are always written first (a causal pass attends
    only to positions below its own)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    passes: list[list[Segment]] = []
    current: list[Segment] = []
    room = max_tokens
    for row, first, end in segments:
        while first < end:
            take = min(end - first, room)
            current.append((row, first, first + take))
            first, room = first + take, room - take
            if room == 0:
                passes.append(current)
                current, room = [], max_tokens
    if current:
        passes.append(current)
    return passes
