"""Lazy gamma 0 for a draft model (method draft_model).

A lazy gamma-0 step runs no draft forward, so the positions the target
processed in it have no draft KV (core/draft_lag.py says which). Before the
drafter's next pass, vspec's draft-model proposer catches up on them
(`catch_up`: prefill-shaped passes that write their draft KV, nothing
sampled), and then drafts what it would have drafted without the skip.
The runner's `lag` part for this method (model_runner.py); head_lag.py is
the EAGLE-type counterpart, with the same `track`.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_vspec.core.draft_lag import DraftLag


class DraftModelLag:
    """Which positions one runner's draft model lags on, and its catch-up."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.lag: DraftLag | None = None   # block sizes are known once the KV cache exists

    def track(self, runner: Any, scheduler_output: Any, skip: bool, hidden_states: torch.Tensor,
              aux_hidden_states: list[torch.Tensor] | None, cad: Any) -> bool:
        """Called before the step's draft pass (none when `skip`): records
        what a skipped pass leaves out, or catches the drafter up on it.
        Returns `skip` (a draft model's skip never has to end: its catch-up
        needs only the tokens). The hidden states are not read."""
        batch = runner.input_batch
        # The drafter's KV cache group shares the target's block table.
        table = batch.block_table[self.drafter.kv_cache_gid]
        if self.lag is None:
            self.lag = DraftLag(table.block_size)
        lag, rows = self.lag, table.block_table.np
        lag.forget(scheduler_output.finished_req_ids)
        if not skip and lag.idle:
            return skip  # the common case: nothing lags and no block is stale
        # With prefix caching, a new or resumed request may start from blocks
        # a skipped pass wrote.
        for req_id in [*(r.req_id for r in scheduler_output.scheduled_new_reqs),
                       *scheduler_output.scheduled_cached_reqs.resumed_req_ids]:
            cached = runner.requests[req_id].num_computed_tokens
            if cached > 0:
                lag.from_cache(req_id, cached, rows[batch.req_id_to_index[req_id]])
        n = batch.num_reqs
        req_ids = batch.req_ids[:n]
        # Each request's position when this step began.
        starts = batch.num_computed_tokens_cpu[:n].tolist()
        if skip:
            scheduled = scheduler_output.num_scheduled_tokens
            lag.skipped(req_ids, starts, [s + scheduled[r] for r, s in zip(req_ids, starts)],
                        rows[:n])
            return skip
        segments = lag.take(req_ids, starts, rows[:n])
        if segments:
            self.drafter.catch_up(cad, segments, batch.token_ids_cpu)
        return skip


__all__ = ["DraftModelLag"]
