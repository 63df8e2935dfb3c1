"""Draft probabilities carried with the draft token ids (issue 28).

The `budget` policy ranks draft slots by the drafter's probability of the
token it drafted. The proposer has those logits already (they gave the
greedy token), so the probability is a reduction over them, no extra pass:

    q = softmax(logits)[argmax] = 1 / sum_v exp(logits_v - max logits)

- `DraftProbsMixin` (proposers: draft_model and EAGLE-1, in
  proposers.py's classes): while `record_draft_probs` is on, each greedy
  draft step also records q per row; `propose` stacks them to [B, depth]
  (the drafts' shape), `take_draft_probs` hands them over once. With an
  active vocabulary (draft_head.py) q is over the active ids, what the
  head drafted from. Off (the default) it adds nothing to a step.
- `ScoredDraftTokenIds`: vLLM's DraftTokenIds with `draft_probs`
  (per request, one float per drafted token, in the same order): what the
  runner hands the scheduler. Stock code reads it as a DraftTokenIds.
- `DraftProbsRunnerMixin` (model runners): attaches the drafter's
  probabilities to the drafts `take_draft_token_ids` returns, cut to each
  request's draft length (an entropy stop may have cut a draft; tree
  drafts are not scored: the budget policy refuses trees).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from vllm.v1.outputs import DraftTokenIds

from vllm_vspec.kernels.draft_head import DraftHead


@dataclass
class ScoredDraftTokenIds(DraftTokenIds):
    """Drafts with the drafter's probability of each drafted token."""

    draft_probs: list[list[float]] = field(default_factory=list)


def top_probability(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax [N], softmax probability of the argmax [N] float32) of logits [N, V]."""
    logits = logits.float()
    top, ids = logits.max(dim=-1)
    return ids, 1.0 / torch.exp(logits - top.unsqueeze(-1)).sum(dim=-1)


class DraftProbsMixin:
    """Records the drafter's probability of each greedy draft token (module
    docstring). Sits directly above DraftHeadMixin in a proposer's bases,
    so `_draft_logits` is the head every greedy draft comes from."""

    # extends SpecDecodeBaseProposer.__init__: off unless asked for.
    def __init__(self, *args, record_draft_probs: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The host's own greedy variants (local argmax, a draft vocabulary of
        # its own) never hold the full logits: not scored, drafts as before.
        self.record_draft_probs = record_draft_probs and not (
            self.use_local_argmax_reduction or getattr(self, "use_heterogeneous_vocab", False))
        self._step_probs: list[torch.Tensor] = []
        self._draft_probs: torch.Tensor | None = None

    # extends SpecDecodeBaseProposer._greedy_sample: the same token (the
    # argmax of the same logits), and its probability.
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.record_draft_probs:
            return super()._greedy_sample(hidden_states)
        logits, ids = self._draft_logits(hidden_states)
        top, q = top_probability(logits)
        self._step_probs.append(q)
        return DraftHead.to_full_ids(top, ids)

    # extends SpecDecodeBaseProposer.propose: the probabilities of this
    # step's drafts, in their [B, depth] shape.
    def propose(self, *args, **kwargs) -> torch.Tensor:
        if not self.record_draft_probs:
            return super().propose(*args, **kwargs)
        self._step_probs = []
        self._draft_probs = None
        drafts = super().propose(*args, **kwargs)
        if drafts.shape[-1] > 0 and self._step_probs:
            # One [B] per sequential draft position, or one [B*K] for
            # parallel drafting: both reshape to the drafts' [B, K].
            probs = torch.stack(self._step_probs, dim=-1)
            if probs.numel() == drafts.numel():
                self._draft_probs = probs.reshape(drafts.shape)
        self._step_probs = []
        return drafts

    def take_draft_probs(self) -> torch.Tensor | None:
        """[B, depth] probabilities of the last `propose`, once (None when
        nothing was recorded since the last call)."""
        probs, self._draft_probs = self._draft_probs, None
        return probs


class DraftProbsRunnerMixin:
    """Model runner side: the drafts handed to the scheduler carry their
    probabilities when the drafter records them."""

    # extends GPUModelRunner.take_draft_token_ids (after vspec's own cuts).
    def take_draft_token_ids(self) -> DraftTokenIds | None:
        out = super().take_draft_token_ids()
        drafter = getattr(self, "drafter", None)
        if not getattr(drafter, "record_draft_probs", False):
            return out
        probs = drafter.take_draft_probs()
        if out is None or probs is None or type(out) is not DraftTokenIds:
            return out
        rows = probs.cpu().tolist()
        return ScoredDraftTokenIds(
            out.req_ids, out.draft_token_ids,
            [row[:len(d)] for row, d in zip(rows, out.draft_token_ids)])


__all__ = ["ScoredDraftTokenIds", "DraftProbsMixin", "DraftProbsRunnerMixin",
           "top_probability"]
