"""The commit of a verification step through torch.ops.vspec.commit_accepted.

After rejection sampling, a drafter's `prepare_next_token_ids_padded` works
out, per request, how many sampled tokens are valid (accepted drafts + the
bonus token) and which token the next draft pass starts from. vLLM 0.32 does
it with a Triton kernel (a C++ fallback on CPU), vLLM-Ascend 0.23 with a chain of
about ten torch ops (its source says "TODO: combine this into a custom fused
kernel"). vspec's proposers on both hosts replace that computation with one
call of vspec's op (csrc/ops.h), so the CPU engine tests run the very call
site the NPU runs, with the CPU twin of the AscendC kernel.

`commit_accepted` is that call for both hosts' proposers (the vLLM one's
prepare_next_token_ids_padded, hosts/vllm/proposers.py, and the Ascend
overlay's); no vLLM import, so the overlay can use it.
"""

from __future__ import annotations

from typing import Any

import torch


def backup_tokens(buffer: Any, requests: dict, input_batch: Any) -> torch.Tensor:
    """Each request's last known token (the one before this step's drafts),
    what a row that commits nothing continues from; both hosts take it from
    the request state as below. `buffer` is the drafter's
    `backup_next_token_ids` (a CpuGpuBuffer); returns its device side."""
    n = input_batch.num_reqs
    for i, req_id in enumerate(input_batch.req_ids[:n]):
        buffer.np[i] = requests[req_id].get_token_id(input_batch.num_tokens_no_spec[i] - 1)
    buffer.copy_to_gpu(n)
    return buffer.gpu


def commit_accepted(proposer: Any, sampled_token_ids: torch.Tensor, requests: dict,
                    input_batch: Any, discard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What `prepare_next_token_ids_padded` returns on both hosts, (next token
    ids [B], valid sampled token counts [B]), from one call of vspec's op
    (`proposer.vspec_ops`, kernels/ops.py load) on the rejection sampler's
    rows (`sampled_token_ids` [B, 1 + K], -1 after the accepted prefix);
    `discard` bool [B] marks the rows that commit nothing."""
    batch = sampled_token_ids.shape[0]
    backup = backup_tokens(proposer.backup_next_token_ids, requests, input_batch)
    num_valid, next_token = proposer.vspec_ops.commit_accepted(
        sampled_token_ids, discard, backup[:batch], input_batch.vocab_size)
    return next_token, num_valid
