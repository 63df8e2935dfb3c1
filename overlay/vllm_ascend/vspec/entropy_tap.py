"""Entropy stop on the NPU path (not yet run on NPU).

The host's merged draft loop computes draft logits and keeps only their argmax,
so the tap sits where those logits are produced: a transparent wrapper around
the draft model whose `compute_logits` also records, per draft position, the
top-k entropy of every request into a preallocated buffer. It writes into a
fixed buffer with tensor ops so that it can be captured: the i-th
`compute_logits` call of a pass writes row i, and a graph captured per gamma
(the default, proposers.py) would replay those writes. That is the intent,
not a shown fact: no ACL graph capture has run with the tap (no NPU here;
tests/test_overlay.py runs it eagerly on a stand-in proposer).

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
from vllm_ascend.vspec.model_tap import ModelTap

from vllm_vspec.kernels.acceptance import NO_TOKEN
from vllm_vspec.kernels.entropy import EntropyStop
from vllm_vspec.config import VSpecConfig


# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")


class EntropyTap(ModelTap):
    """Wraps the draft model (ModelTap), recording entropies in compute_logits."""

    def __init__(self, model: torch.nn.Module, settings: VSpecConfig, max_gamma: int,
                 max_reqs: int, device: torch.device):
        super().__init__(model)
        self.stop = EntropyStop.from_config(settings)
        self.entropy = torch.zeros((max_gamma, max_reqs), dtype=torch.float32, device=device)
        self.calls = 0

    @classmethod
    def maybe_install(cls, proposer: Any, settings: VSpecConfig | None) -> "EntropyTap | None":
        """Wrap `proposer.model` when entropy stop is on; None otherwise."""
        if settings is None or not settings.entropy_stop:
            return None
        logger.warning("vspec entropy_stop on vLLM-Ascend only changes acceptance: the host's "
                       "merged draft loop has a fixed width, so cut drafts are still drafted "
                       "and verified (no draft or verify compute is saved; docs/ascend.md)")
        return cls(proposer.model, settings, proposer.max_num_speculative_tokens,
                   proposer.runner.max_num_reqs, proposer.device).install(proposer)

    def compute_logits(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        logits = self.inner.compute_logits(hidden_states, *args, **kwargs)
        if self.calls < self.entropy.shape[0]:
            rows = min(logits.shape[0], self.entropy.shape[1])
            self.entropy[self.calls, :rows].copy_(self.stop.entropy(logits[:rows]))
        self.calls += 1
        return logits

    def reset(self) -> None:
        self.calls = 0

    def cut(self, draft: torch.Tensor) -> torch.Tensor:
        """draft: [batch, gamma] token ids; positions at or after each row's
        stop position become NO_TOKEN."""
        batch, gamma = draft.shape
        keep = self.stop.lengths(self.entropy[:gamma, :batch].T)
        positions = torch.arange(gamma, device=draft.device).unsqueeze(0)
        return torch.where(positions < keep.unsqueeze(1).to(draft.device), draft,
                           torch.full_like(draft, NO_TOKEN))
