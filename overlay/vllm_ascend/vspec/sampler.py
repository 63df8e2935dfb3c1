"""Lossy acceptance rules on the NPU verification path (not yet run on NPU).

Routed in only for `relaxed_topk` / `margin` (strict greedy is the host
sampler unchanged). The host's greedy verifier accepts a draft token iff it is
the argmax of its target row; promoting each draft token the rule accepts to
the row's unique argmax (vllm_vspec.kernels.acceptance.promote_accepted) makes that
verifier apply the rule, while rejected rows keep the target's own argmax as
the recovered token. Sampled requests (temperature > 0) are left to the host's
rejection sampling. The rule's application is the core's
(acceptance.apply_to_greedy_rows), shared with vLLM's VSpecRejectionSampler.

The rule's strict prefix (`*_after_tokens`) counts each request's generated
tokens from the runner's input batch (`num_tokens_no_spec - num_prompt_tokens`,
rejection_sampler.tokens_generated, what vspec's CPU/CUDA runner counts).
vLLM hands `output_token_ids` to the sampler only when penalties or an
output-aware logits processor need them (vLLM 0.23 InputBatch
`_make_sampling_metadata`), so a count of those would leave every request
fresh and every lossy rule strict on Ascend.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_ascend.sample.rejection_sampler import AscendRejectionSampler
from vllm_vspec.config import VSpecConfig
from vllm_vspec.hosts.vllm.rejection_sampler import tokens_generated
from vllm_vspec.kernels.acceptance import AcceptanceRule, apply_to_greedy_rows


class VSpecAscendRejectionSampler(AscendRejectionSampler):
    """AscendRejectionSampler whose greedy rows follow the vspec rule."""

    # Extends AscendRejectionSampler.__init__: also takes the vspec settings
    # and the NPU runner (routing.rejection_sampler_factory binds them by keyword).
    def __init__(self, sampler: Any, *, settings: VSpecConfig, runner: Any = None):
        super().__init__(sampler)
        self.rule = AcceptanceRule.from_config(settings)
        self._runner = runner

    # Extends AscendRejectionSampler.apply_logits_processors: after the host's
    # processors, promote the draft tokens the rule accepts on greedy rows.
    def apply_logits_processors(self, logits: torch.Tensor, sampling_metadata: Any,
                                metadata: Any) -> torch.Tensor:
        logits = super().apply_logits_processors(logits, sampling_metadata, metadata)
        if self.rule.lossless or sampling_metadata.all_random:
            return logits
        generated = _generated_counts(self._runner, sampling_metadata,
                                      len(metadata.num_draft_tokens), logits.device)
        return apply_to_greedy_rows(
            self.rule, logits, metadata.draft_token_ids, metadata.cu_num_draft_tokens,
            generated, None if sampling_metadata.all_greedy else sampling_metadata.temperature)


def _generated_counts(runner: Any, sampling_metadata: Any, num_reqs: int,
                      device: torch.device) -> torch.Tensor:
    """Tokens each of the step's num_reqs requests (the input batch's first
    rows, in the order the runner verifies them) had generated before this
    step's drafts. From the runner's input batch; without a runner (a caller
    that did not pass one), from the output ids vLLM hands the sampler, which
    are empty unless penalties need them: every request then counts as fresh
    (0) and the rule's strict prefix keeps acceptance strict, never more lossy
    than configured."""
    batch = getattr(runner, "input_batch", None)
    if batch is not None:
        return tokens_generated(batch, range(num_reqs)).to(device, non_blocking=True)
    outputs = sampling_metadata.output_token_ids or []
    counts = [len(outputs[i]) if i < len(outputs) else 0 for i in range(num_reqs)]
    return torch.tensor(counts, dtype=torch.int64, device=device)
