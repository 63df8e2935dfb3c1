"""Drafter passes whose batch vspec lays out itself.

vspec's proposers run draft passes the host's `propose` does not: the
lazy-gamma-0 catch-up (prefill-shaped rows over skipped positions) and the
tree passes (W queries per request at scattered slots). Both start from the
step's `CommonAttentionMetadata` (its block table rows are the batch rows)
and replace what describes the batch; every per-token or per-request field
the host precomputed for its own batch is cleared, so no backend reads a
stale one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata


def drafter_batch(cad: CommonAttentionMetadata, *, query_lens: torch.Tensor,
                  seq_lens: torch.Tensor, block_table: torch.Tensor, slots: torch.Tensor,
                  prefilling: bool) -> CommonAttentionMetadata:
    """`cad` for a batch of len(query_lens) rows: row r has query_lens[r]
    query tokens (consecutive in the pass's inputs) that are the last of its
    seq_lens[r] keys, with `block_table` [rows, blocks] and `slots` [tokens]
    (where each query token's KV is written). query_lens and seq_lens are
    int32 host tensors; `prefilling` marks every row as in prefill or none."""
    device = block_table.device
    rows = query_lens.shape[0]
    query_start = torch.zeros(rows + 1, dtype=torch.int32)
    query_start[1:] = torch.cumsum(query_lens, 0)
    return dataclasses.replace(
        cad, query_start_loc=query_start.to(device), query_start_loc_cpu=query_start,
        seq_lens=seq_lens.to(device), num_reqs=rows, num_actual_tokens=int(query_start[-1]),
        max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
        block_table_tensor=block_table, slot_mapping=slots, causal=True, positions=None,
        is_prefilling=(None if cad.is_prefilling is None else
                       torch.full((rows,), prefilling, dtype=torch.bool, device=device)),
        seq_lens_cpu_upper_bound=seq_lens, req_idx=None,
        logits_indices_padded=None, num_logits_indices=None, max_logits_per_req=None,
        dcp_local_seq_lens=None, dcp_local_seq_lens_cpu_upper_bound=None,
        _num_computed_tokens_cache=None, _token_to_req_indices_cache=None)


def run_pass(proposer: Any, cad: CommonAttentionMetadata, num_tokens: int,
             slots: torch.Tensor, draft_index: int = 0) -> Any:
    """One forward of `proposer`'s draft model (a SpecDecodeBaseProposer)
    over the first `num_tokens` rows of its input buffers (`input_ids`,
    `positions`, `hidden_states`), with attention metadata built from `cad`
    by the drafter's own builders, as the host's first pass does; returns
    what the model returns."""
    _, per_layer = proposer.build_per_group_and_layer_attn_metadata(cad, draft_index=draft_index)
    mode, padded, across_dp = proposer._determine_batch_execution_and_padding(num_tokens)
    model_kwargs, slot_count = proposer.build_model_inputs_first_pass(num_tokens, padded, None)
    with set_forward_context(per_layer, proposer.vllm_config, num_tokens=padded,
                             num_tokens_across_dp=across_dp, cudagraph_runtime_mode=mode,
                             slot_mapping=proposer._get_slot_mapping(slot_count, slots)):
        return proposer.model(**model_kwargs)


def segments_batch(cad: CommonAttentionMetadata, part: list[tuple[int, int, int]],
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor, CommonAttentionMetadata]:
    """A prefill-shaped batch over catch-up segments (batch row, first, end):
    one row per segment, its positions [first, end) attending causally to
    [0, end). Returns (positions, the KV slot of each, the batch's `cad`),
    tokens in segment order; slots come from the step's block table, where
    the target wrote those positions."""
    device = cad.block_table_tensor.device
    lengths = torch.tensor([end - first for _, first, end in part], dtype=torch.int32)
    positions = torch.cat([torch.arange(first, end) for _, first, end in part]).to(device)
    rows = torch.tensor([row for row, _, _ in part], dtype=torch.long, device=device)
    block_table = cad.block_table_tensor[rows]
    local_row = torch.repeat_interleave(torch.arange(len(part), device=device),
                                        lengths.to(device))
    slots = (block_table[local_row, positions // block_size].long() * block_size
             + positions % block_size)
    seq_lens = torch.tensor([end for _, _, end in part], dtype=torch.int32)
    return positions, slots, drafter_batch(cad, query_lens=lengths, seq_lens=seq_lens,
                                           block_table=block_table, slots=slots,
                                           prefilling=True)
