"""Entropy stop on the NPU path (not yet run on NPU).

The host's merged draft loop computes draft logits and keeps only their
argmax, so the entropy stop observes them where they are produced: an
observer (hosts/draft_observers.py) of the draft model's logits tap
(draft_head_tap.DraftLogitsTap) that records, per draft position, the top-k
entropy of every request into a preallocated buffer. It writes into a fixed
buffer with tensor ops so that it can be captured: the i-th greedy draft
distribution of a pass writes row i, and a graph captured per gamma (the
default, proposers.py) would replay those writes. That is the intent, not a
shown fact: no ACL graph capture has run with it (no NPU here;
tests/ascend/test_overlay.py runs it eagerly on a stand-in proposer). The
proposers restart the rows at every draft pass, dummy and capture passes
included (`reset`).

It saves no compute (the startup log says so): the merged draft loop and the
verification keep their width, which the captured graphs bake in. After a
pass, `cut` replaces the drafted tokens from each request's first
too-uncertain position onward with -1 (vLLM's invalid draft id, which no
target token equals): they are rejected, so outputs stay exact, and the
controller sees the shorter draft. The maths (top-k entropy, first position
over the threshold) is the host-agnostic core's, in vllm_vspec.kernels.entropy.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm.logger import init_logger

from vllm_vspec.hosts.draft_observers import DraftObserver
from vllm_vspec.kernels.acceptance import NO_TOKEN
from vllm_vspec.kernels.entropy import EntropyStop
from vllm_vspec.config import VSpecConfig


# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")


class EntropyBuffer(DraftObserver):
    """Records the top-k entropy of each greedy draft distribution of a pass
    into row `calls` of a [max_gamma, max_reqs] buffer."""

    reads_logits = True

    def __init__(self, settings: VSpecConfig, max_gamma: int, max_reqs: int,
                 device: torch.device):
        self.stop = EntropyStop.from_config(settings)
        self.entropy = torch.zeros((max_gamma, max_reqs), dtype=torch.float32, device=device)
        self.calls = 0

    @classmethod
    def maybe(cls, proposer: Any, settings: VSpecConfig | None) -> "EntropyBuffer | None":
        """The buffer of `proposer` when entropy stop is on; None otherwise."""
        if settings is None or not settings.entropy_stop:
            return None
        logger.warning("vspec entropy_stop on vLLM-Ascend only changes acceptance: the host's "
                       "merged draft loop has a fixed width, so cut drafts are still drafted "
                       "and verified (no draft or verify compute is saved; docs/ascend.md)")
        return cls(settings, proposer.max_num_speculative_tokens, proposer.runner.max_num_reqs,
                   proposer.device)

    def sampled(self, hidden: torch.Tensor, logits: torch.Tensor,
                ids: torch.Tensor | None) -> None:
        if self.calls < self.entropy.shape[0]:
            rows = min(logits.shape[0], self.entropy.shape[1])
            self.entropy[self.calls, :rows].copy_(self.stop.entropy(logits[:rows]))
        self.calls += 1

    def reset(self) -> None:
        """A new draft pass: its first distribution writes row 0."""
        self.calls = 0

    def cut(self, draft: torch.Tensor) -> torch.Tensor:
        """draft: [batch, gamma] token ids; positions at or after each row's
        stop position become NO_TOKEN."""
        batch, gamma = draft.shape
        keep = self.stop.lengths(self.entropy[:gamma, :batch].T)
        positions = torch.arange(gamma, device=draft.device).unsqueeze(0)
        return torch.where(positions < keep.unsqueeze(1).to(draft.device), draft,
                           torch.full_like(draft, NO_TOKEN))
