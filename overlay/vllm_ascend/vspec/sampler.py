"""Lossy acceptance rules on the NPU verification path (not yet run on NPU).

Routed in only for `relaxed_topk` / `margin` (strict greedy is the host
sampler unchanged). The host's greedy verifier accepts a draft token iff it is
the argmax of its target row; promoting each draft token the rule accepts to
the row's unique argmax (vllm_vspec.kernels.acceptance.promote_accepted) makes that
verifier apply the rule, while rejected rows keep the target's own argmax as
the recovered token. Sampled requests (temperature > 0) are left to the host's
rejection sampling. The rule's application is the core's
(acceptance.apply_to_greedy_rows), shared with vLLM's VSpecRejectionSampler.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_ascend.sample.rejection_sampler import AscendRejectionSampler
from vllm_vspec.kernels.acceptance import AcceptanceRule, apply_to_greedy_rows
from vllm_vspec.config import VSpecConfig


class VSpecAscendRejectionSampler(AscendRejectionSampler):
    """AscendRejectionSampler whose greedy rows follow the vspec rule."""

    # Extends AscendRejectionSampler.__init__: also takes the vspec settings
    # (routing.rejection_sampler_factory binds them by keyword).
    def __init__(self, sampler: Any, *, settings: VSpecConfig):
        super().__init__(sampler)
        self.rule = AcceptanceRule.from_config(settings)

    # Extends AscendRejectionSampler.apply_logits_processors: after the host's
    # processors, promote the draft tokens the rule accepts on greedy rows.
    def apply_logits_processors(self, logits: torch.Tensor, sampling_metadata: Any,
                                metadata: Any) -> torch.Tensor:
        logits = super().apply_logits_processors(logits, sampling_metadata, metadata)
        if self.rule.lossless or sampling_metadata.all_random:
            return logits
        generated = _generated_counts(sampling_metadata, len(metadata.num_draft_tokens),
                                      logits.device)
        return apply_to_greedy_rows(
            self.rule, logits, metadata.draft_token_ids, metadata.cu_num_draft_tokens,
            generated, None if sampling_metadata.all_greedy else sampling_metadata.temperature)


def _generated_counts(sampling_metadata: Any, num_reqs: int, device: torch.device) -> torch.Tensor:
    """Tokens each request has generated so far. vLLM hands output ids to the
    sampler only when penalties or an output-aware logits processor need them;
    without them every request counts as fresh (0), so the rule's strict
    prefix (`*_after_tokens`) keeps acceptance strict: never more lossy than
    configured."""
    outputs = sampling_metadata.output_token_ids or []
    counts = [len(outputs[i]) if i < len(outputs) else 0 for i in range(num_reqs)]
    return torch.tensor(counts, dtype=torch.int64, device=device)
