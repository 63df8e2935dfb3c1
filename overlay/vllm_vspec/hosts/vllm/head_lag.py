"""Lazy gamma 0 for an EAGLE-type drafter (method eagle or eagle3).

A lazy gamma-0 step runs no head pass. The head's first pass at position p
reads the target's hidden state of p and token p + 1 and writes the head's
KV at p, so the step keeps the target hidden states of the positions it
processed (hosts/retained_hidden.py; EAGLE-3: the auxiliary layers' states,
combined by the head at catch-up). Before the head drafts again, or before
a step whose positions would not fit in the retained budget
(`gamma0_retained_tokens`; such a step then runs sync), prefill-shaped head
passes over each lagging request's positions write the head's KV there
from the kept states (nothing is sampled); then the host's first pass runs
as sync would, over a head KV cache equal to sync's. Which positions lag
is core/draft_lag.py's DraftLag, as for the draft model.

Prefix-cache hits: a request that starts on blocks a skipped pass wrote
catches up on them from the states their writer kept (the entries stay
while any request claims them). Once every request that kept them has
finished, they are gone: those positions keep whatever head KV is in the
block (`uncovered` counts them), so that request's drafts may differ from
sync's until its context moves past them; its output is exact all the
same (strict verification).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import CommonAttentionMetadata

from vllm_vspec.core.draft_lag import DraftLag, Segment, catch_up_passes
from vllm_vspec.hosts.retained_hidden import RetainedHidden
from vllm_vspec.hosts.vllm.drafter_batch import run_pass, segments_batch

logger = init_logger(f"vllm.{__name__}")


class HeadLag:
    """Retention and catch-up for one runner's EAGLE-type drafter."""

    def __init__(self, drafter: Any, capacity: int, aux: bool) -> None:
        self.drafter = drafter
        self.aux = aux          # keep the raw auxiliary states (EAGLE-3); the head combines them
        self.store = RetainedHidden(capacity)
        self.lag: DraftLag | None = None   # block sizes are known once the KV cache exists
        self.forced_sync = 0    # skipped steps run sync because their positions did not fit
        self.uncovered = 0      # prefix-cached positions to catch up on that nobody kept

    def track(self, runner: Any, scheduler_output: Any, skip: bool, hidden_states: torch.Tensor,
              aux_hidden_states: list[torch.Tensor] | None,
              cad: CommonAttentionMetadata) -> bool:
        """Called before the step's head pass (none when `skip`): keeps what
        a skipped pass leaves out, or catches the head up. Returns whether
        the step still skips its pass."""
        batch = runner.input_batch
        table = batch.block_table[self.drafter.kv_cache_gid]
        if self.lag is None:
            self.lag = DraftLag(table.block_size)
        lag, store, rows, bs = self.lag, self.store, table.block_table.np, table.block_size
        finished = list(scheduler_output.finished_req_ids)
        lag.forget(finished)
        store.release(finished)
        if not skip and lag.idle:
            return False  # the common case: nothing lags and no block is stale
        for req_id in [*(r.req_id for r in scheduler_output.scheduled_new_reqs),
                       *scheduler_output.scheduled_cached_reqs.resumed_req_ids]:
            cached = runner.requests[req_id].num_computed_tokens
            if cached <= 0:
                continue
            row = rows[batch.req_id_to_index[req_id]]
            lag.from_cache(req_id, cached, row)
            first = lag.first_missed(req_id)
            if first is not None and first < cached:
                positions = np.arange(first, cached)
                self.uncovered += store.adopt(req_id, positions, _keys(row, positions, bs))
        n = batch.num_reqs
        req_ids = batch.req_ids[:n]
        starts = batch.num_computed_tokens_cpu[:n].tolist()
        if skip:
            # The step's token layout as the host's
            # GPUModelRunner._prepare_inputs left it in the runner's CPU
            # buffers: token i belongs to batch row req_indices[i], at rank
            # query_pos[i] within its request.
            total = int(runner.query_start_loc.np[n])
            row_of = runner.req_indices.np[:total]
            positions = batch.num_computed_tokens_cpu[row_of] + runner.query_pos.np[:total]
            counts = runner.num_scheduled_tokens.np[:n].tolist()
            keys = rows[row_of, positions // bs].astype(np.int64) * bs + positions % bs
            need = store.needed(keys)
            if need <= store.room:
                lag.skipped(req_ids, starts, [s + c for s, c in zip(starts, counts)], rows[:n])
                store.retain(req_ids, starts, counts, keys,
                             self._target_states(hidden_states, aux_hidden_states, len(keys)))
                return True
            self.forced_sync += 1
            # Powers of two: a pool too small for the load shows at once and
            # keeps showing, without a line a step.
            if self.forced_sync & (self.forced_sync - 1) == 0:
                logger.info("vspec: a gamma-0 step ran sync (head catch-up first): %d "
                            "new tokens did not fit in the %d free of gamma0_retained_tokens=%d "
                            "(%d such steps so far; a larger gamma0_retained_tokens avoids "
                            "them)", need, store.room, store.capacity, self.forced_sync)
        segments = lag.take(req_ids, starts, rows[:n])
        if segments:
            self._catch_up(cad, segments, batch.token_ids_cpu, rows, bs)
        store.release(req_ids)
        return False

    def _target_states(self, hidden_states: torch.Tensor,
                       aux_hidden_states: list[torch.Tensor] | None, n: int) -> torch.Tensor:
        """What the host's first pass would read for the step's n tokens
        (gpu_model_runner.propose_draft_token_ids, no spec-decode metadata)."""
        if self.aux:
            return torch.cat([h[:n] for h in aux_hidden_states], dim=-1)
        return hidden_states[:n]

    def _catch_up(self, cad: CommonAttentionMetadata, segments: list[Segment],
                  token_ids: np.ndarray, rows: np.ndarray, bs: int) -> None:
        """Head passes over each segment's positions that have kept states
        (earlier positions first, within the drafter's token budget)."""
        kept: list[Segment] = []
        for row, first, end in segments:
            positions = np.arange(first, end)
            held, _ = self.store.gather(_keys(rows[row], positions, bs))
            # Runs of consecutive kept positions; a gap keeps the head KV it has.
            edges = np.flatnonzero(np.diff(np.concatenate([[0], held.astype(np.int8), [0]])))
            kept += [(row, first + a, first + b) for a, b in zip(edges[::2], edges[1::2])]
        d = self.drafter
        for part in catch_up_passes(kept, d.max_num_tokens):
            keys = np.concatenate([_keys(rows[row], np.arange(a, b), bs) for row, a, b in part])
            _, states = self.store.gather(keys)
            if self.aux:
                states = d.model.combine_hidden_states(states)
            # Input at position p is token p + 1, as the host's first pass shifts them.
            tokens = np.concatenate([token_ids[row, a + 1:b + 1] for row, a, b in part])
            ids = torch.from_numpy(tokens.astype(np.int32)).to(d.device)
            if getattr(d, "use_heterogeneous_vocab", False):
                ids = d.vocab_mapping.map_target_to_draft_ids(ids)
            positions, slots, part_cad = segments_batch(cad, part, d.block_size)
            n = len(tokens)
            d.input_ids[:n] = ids
            d._set_positions(n, positions)
            d.hidden_states[:n] = states
            run_pass(d, part_cad, n, slots)


def _keys(row: np.ndarray, positions: np.ndarray, bs: int) -> np.ndarray:
    """KV slots of `positions` in one request's block-table row."""
    return row[positions // bs].astype(np.int64) * bs + positions % bs
