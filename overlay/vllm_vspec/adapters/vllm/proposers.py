"""Draft proposers with the per-request entropy stop (entropy.py).

Each proposer records, while drafting, the top-k entropy of every draft
distribution it takes a greedy token from, and after drafting turns them into
per-request draft lengths (EntropyStop.lengths). The model runner cuts each
request's draft to that length before the scheduler sees it, so a stop only
ever shortens the gamma the scheduler asked for.

PROPOSERS maps vLLM's proposer class to ours; one mixin serves both methods.
"""

from __future__ import annotations

import torch

from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_vspec.config import VSpecConfigError
from vllm_vspec.entropy import EntropyStop


class EntropyStopMixin:
    """Adds entropy recording to a SpecDecodeBaseProposer subclass."""

    # extends SpecDecodeBaseProposer.__init__: keeps the stop settings; the
    # stop reads the draft logits, so drafting must be greedy over the full vocab.
    def __init__(self, *args, entropy_stop: EntropyStop, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        spec = self.speculative_config
        if (spec.draft_sample_method != "greedy" or self.use_local_argmax_reduction
                or getattr(self, "use_heterogeneous_vocab", False)):
            raise VSpecConfigError(
                "entropy_stop", True,
                "only with greedy draft sampling over the target's vocabulary "
                "(draft_sample_method='greedy', no local argmax reduction, "
                "no heterogeneous vocab)")
        self.entropy_stop = entropy_stop
        self._entropies: list[torch.Tensor] = []
        self._draft_lengths: torch.Tensor | None = None

    # extends SpecDecodeBaseProposer._greedy_sample: same greedy token, and
    # records the top-k entropy of the distribution it came from.
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.model.compute_logits(hidden_states)
        self._entropies.append(self.entropy_stop.entropy(logits))
        return logits.argmax(dim=-1)

    # extends SpecDecodeBaseProposer.propose: turns this step's entropies into
    # per-request draft lengths, in the row order of the returned drafts.
    def propose(self, *args, **kwargs) -> torch.Tensor:
        self._entropies = []
        drafts = super().propose(*args, **kwargs)
        if drafts.shape[-1] > 0:
            # Sequential drafting records one [B] entropy per position;
            # parallel drafting one [B*K]; both reshape to the drafts' [B, K].
            entropies = torch.stack(self._entropies, dim=-1).reshape(drafts.shape)
            self._draft_lengths = self.entropy_stop.lengths(entropies)
        self._entropies = []
        return drafts

    def take_draft_lengths(self) -> torch.Tensor | None:
        """Per-request draft lengths of the last `propose`, once (None when
        nothing was drafted since the last call)."""
        lengths, self._draft_lengths = self._draft_lengths, None
        return lengths


class VSpecEagleProposer(EntropyStopMixin, EagleProposer):
    """vLLM's EagleProposer with the entropy stop."""


class VSpecDraftModelProposer(EntropyStopMixin, DraftModelProposer):
    """vLLM's DraftModelProposer with the entropy stop."""


PROPOSERS: dict[type, type] = {
    EagleProposer: VSpecEagleProposer,
    DraftModelProposer: VSpecDraftModelProposer,
}


def entropy_stop_proposer(host_drafter, vllm_config, device, runner,
                          entropy_stop: EntropyStop):
    """Our counterpart of the proposer the host runner built."""
    cls = PROPOSERS.get(type(host_drafter))
    if cls is None:
        raise VSpecConfigError(
            "entropy_stop", True,
            f"only with speculative method draft_model or eagle "
            f"(this engine drafts with {type(host_drafter).__name__})")
    return cls(vllm_config, device, runner=runner, entropy_stop=entropy_stop)
