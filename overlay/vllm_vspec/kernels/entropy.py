"""Per-request entropy stop: cut a draft where the draft model is unsure.

Host-agnostic and vectorised (pure torch, no vLLM import, no host syncs); the
vLLM proposers (hosts/vllm/proposers.py) and the NPU overlay share it.

For each request, draft position j is produced from the draft model's logits
at that position. Its *top-k entropy* H_j is the entropy (in nats) of the
draft distribution renormalised over its `entropy_topk` most likely tokens,
so it lies in [0, ln k]. The draft is cut at the first position j with
`entropy_scale * H_j > entropy_threshold ** 2`: positions j, j+1, ... are
dropped (a cut at 0 leaves the request with no draft this step). Cutting only
shortens drafts, so outputs stay exactly those of the acceptance rule in use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EntropyStop:
    """The entropy-stop settings of VSpecConfig, frozen for the hot path.
    No defaults here: VSpecConfig's entropy_* fields are the one source
    (build with `from_config`)."""

    topk: int
    threshold: float
    scale: float

    @classmethod
    def from_config(cls, cfg) -> "EntropyStop":
        return cls(topk=cfg.entropy_topk, threshold=cfg.entropy_threshold,
                   scale=cfg.entropy_scale)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        return topk_entropy(logits, self.topk)

    def lengths(self, entropies: torch.Tensor) -> torch.Tensor:
        return stop_lengths(entropies, self.threshold, self.scale)


def topk_entropy(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Entropy in nats of softmax over the top-k entries of each row of
    `logits` [..., V] (all entries when k >= V). Returns [...], float32.
    Rows with fewer than k finite logits count only their finite ones."""
    top = logits.float().topk(min(k, logits.shape[-1]), dim=-1).values
    logp = torch.log_softmax(top, dim=-1)
    # p * log p is 0 for p == 0 (masked logits); xlogy-style guard keeps it so.
    return -(logp.exp() * torch.where(torch.isfinite(logp), logp, 0.0)).sum(dim=-1)


def stop_lengths(entropies: torch.Tensor, threshold: float, scale: float) -> torch.Tensor:
    """Number of leading draft positions to keep per request: the index of the
    first position j with `scale * H_j > threshold ** 2`, or the full draft
    length when there is none. entropies [B, K] -> int64 [B]."""
    over = scale * entropies > threshold * threshold
    k = entropies.shape[-1]
    first = over.to(torch.int8).argmax(dim=-1).to(torch.int64)
    return torch.where(over.any(dim=-1), first, torch.full_like(first, k))


__all__ = ["EntropyStop", "stop_lengths", "topk_entropy"]
