"""The commit of a verification step through torch.ops.vspec.commit_accepted.

After rejection sampling, a drafter's `prepare_next_token_ids_padded` works
out, per request, how many sampled tokens are valid (accepted drafts + the
bonus token) and which token the next draft pass starts from. vLLM 0.32 does
it with a Triton kernel (a C++ fallback on CPU), vLLM-Ascend 0.23 with a chain of
about ten torch ops (its source says "TODO: combine this into a custom fused
kernel"). vspec's proposers on both hosts replace that computation with one
call of vspec's op (csrc/ops.h), so the CPU engine tests run the very call
site the NPU runs, with the CPU twin of the AscendC kernel.

No vLLM import: the Ascend overlay's proposers use `backup_tokens` too.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_vspec.kernels import ops


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


class CommitOpMixin:
    """Mixed into vspec's vLLM proposers (proposers.py) before the host class."""

    # extends SpecDecodeBaseProposer.__init__: loads the ops at start-up: the
    # compiled library, else the torch implementation with one warning
    # (kernels/ops.py load) naming why.
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.vspec_ops = ops.load(torch.device(self.device).type)

    # extends SpecDecodeBaseProposer.prepare_next_token_ids_padded (vLLM 0.32):
    # the same two results, from vspec's commit op instead of the host kernel.
    def prepare_next_token_ids_padded(self, sampled_token_ids: torch.Tensor, requests: dict,
                                      gpu_input_batch: Any,
                                      discard_request_mask: torch.Tensor
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = sampled_token_ids.shape[0]
        backup = backup_tokens(self.backup_next_token_ids, requests, gpu_input_batch)
        num_valid, next_token = self.vspec_ops.commit_accepted(
            sampled_token_ids, discard_request_mask[:batch], backup[:batch],
            gpu_input_batch.vocab_size)
        return next_token, num_valid
