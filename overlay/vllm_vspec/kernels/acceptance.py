"""Greedy acceptance rules for draft tokens: which draft tokens the target accepts.

Host-agnostic and vectorised (pure torch, no vLLM import, no host syncs): the
vLLM adapter (hosts/vllm/rejection_sampler.py) and the NPU overlay
(vllm_ascend/vspec/sampler.py) both call `apply_to_greedy_rows`, which
decides with `accept_mask` on device tensors and expresses the decision with
`promote_accepted` in the only language the host's greedy verifier speaks,
the argmax.

Layout shared by every function here: the draft tokens of all requests of a
step are flattened request-major into N rows, exactly as the target logits
rows that verify them (vLLM's `target_logits_indices` order). Per row we need
the draft token id, its 0-based position inside its request's draft, and the
number of tokens its request had generated before this step's first draft
token. `draft_positions` derives the position from vLLM's
`cu_num_draft_tokens`.

Rules (`VSpecConfig.acceptance`):
- `strict`: accept iff the draft token is the target's argmax. Lossless.
- `relaxed_topk`: strict, or the draft token is among the target's top
  `relaxed_topk` logits once the token would be generated token number
  `relaxed_after_tokens` or later (0-based; the first `relaxed_after_tokens`
  output tokens are decided strictly: a strict prefix). LOSSY.
- `margin`: strict, or `max_logit - logit[draft] <= margin` at draft positions
  >= `margin_from_position` once `margin_after_tokens` tokens are generated.
  LOSSY.
Invariants of the lossy rules: a protected token id is accepted only by exact
(strict) match; a token whose logit is -inf (masked by the host's logits
processors: allowed-token lists, bad words, min-tokens) is never accepted; and
every token strict accepts, they accept too.

Acceptance is prefix-wise: the verifier walks a request's draft and stops at
the first rejected position, so `accept_mask` only needs to be right per row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

# The one "no token" value of a draft or token slot: vLLM's PLACEHOLDER_TOKEN_ID.
# Never a target argmax nor a sampled token, so every verifier rejects it: a
# slot padded with it (a verify width above gamma, an entropy-stopped draft,
# a tree's padding nodes) can never be accepted.
NO_TOKEN = -1


@dataclass(frozen=True)
class AcceptanceRule:
    """The acceptance settings of VSpecConfig, frozen for the hot path.
    Build with `AcceptanceRule.from_config(vspec_config)`."""

    name: str = "strict"
    topk: int = 1
    margin: float = 0.0
    from_position: int = 0
    after_tokens: int = 0
    protected_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, cfg) -> "AcceptanceRule":
        """From a VSpecConfig; only the knobs of the selected rule matter."""
        if cfg.acceptance == "relaxed_topk":
            return cls("relaxed_topk", topk=cfg.relaxed_topk,
                       after_tokens=cfg.relaxed_after_tokens,
                       protected_token_ids=tuple(cfg.protected_token_ids))
        if cfg.acceptance == "margin":
            return cls("margin", margin=cfg.margin, from_position=cfg.margin_from_position,
                       after_tokens=cfg.margin_after_tokens,
                       protected_token_ids=tuple(cfg.protected_token_ids))
        return cls("strict")

    @property
    def lossless(self) -> bool:
        return self.name == "strict"


def draft_positions(cu_num_draft_tokens: torch.Tensor, num_tokens: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, position inside that request's draft) of each of the
    `num_tokens` flattened draft rows, from the inclusive cumulative draft
    counts [B] (vLLM's `SpecDecodeMetadata.cu_num_draft_tokens`)."""
    cu = cu_num_draft_tokens.to(torch.int64)
    rows = torch.arange(num_tokens, device=cu.device, dtype=torch.int64)
    # Row r belongs to the first request whose inclusive end exceeds r; empty
    # drafts (cu equal to their predecessor's) are skipped by `right=True`.
    req = torch.searchsorted(cu, rows, right=True)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    return req, rows - starts[req]


def accept_mask(rule: AcceptanceRule, target_logits: torch.Tensor,
                draft_token_ids: torch.Tensor, positions: torch.Tensor,
                generated: torch.Tensor) -> torch.Tensor:
    """Bool [N]: whether `rule` accepts each draft token.

    target_logits [N, V] (after the host's logits processors), draft_token_ids
    [N], positions [N] (0-based position in the request's draft), generated [N]
    (tokens the request had generated before its first draft token this step).
    Draft ids < 0 (vLLM pads invalid drafts with -1) are never accepted."""
    valid = draft_token_ids >= 0
    ids = draft_token_ids.clamp(min=0).to(torch.int64).unsqueeze(-1)
    draft_logit = target_logits.gather(-1, ids).squeeze(-1)
    strict = valid & (target_logits.argmax(dim=-1) == ids.squeeze(-1))
    if rule.lossless:
        return strict
    # The draft token at position j becomes output token number generated + j.
    relaxable = valid & ((generated + positions) >= rule.after_tokens)
    relaxable &= draft_logit > float("-inf")
    if rule.protected_token_ids:
        protected = _id_tensor(rule.protected_token_ids, ids.device)
        relaxable &= ~torch.isin(ids.squeeze(-1), protected)
    return strict | (relaxable & _RELAXATIONS[rule.name](rule, target_logits,
                                                           draft_logit, positions))


@functools.lru_cache(maxsize=8)
def _id_tensor(token_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # Built once per (ids, device): no host-to-device copy in the hot path.
    return torch.tensor(token_ids, device=device, dtype=torch.int64)


def _within_topk(rule: AcceptanceRule, logits: torch.Tensor, draft_logit: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    # In the top K iff fewer than K logits are strictly larger, i.e. the draft
    # logit reaches the K-th largest value (ties count as inside).
    k = min(rule.topk, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[..., -1]
    return draft_logit >= kth


def _within_margin(rule: AcceptanceRule, logits: torch.Tensor, draft_logit: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
    gap = logits.max(dim=-1).values - draft_logit
    return (gap <= rule.margin) & (positions >= rule.from_position)


# rule name -> the extra condition under which a non-argmax draft is accepted.
_RELAXATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "relaxed_topk": _within_topk,
    "margin": _within_margin,
}


def promote_accepted(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                     accept: torch.Tensor) -> torch.Tensor:
    """Make each accepted draft token the unique argmax of its row, in place.

    A greedy verifier (argmax == draft) then accepts exactly the rows of
    `accept` that it would not have accepted anyway, and on a rejected row its
    argmax (the recovered token) is unchanged. The promoted logit is the next
    float above the row maximum, so only that one entry moves, by one ulp
    beyond the maximum. Rows where `accept` is false are left untouched."""
    ids = draft_token_ids.clamp(min=0).to(torch.int64).unsqueeze(-1)
    row_max = target_logits.max(dim=-1, keepdim=True).values
    bumped = torch.nextafter(row_max, torch.full_like(row_max, float("inf")))
    current = target_logits.gather(-1, ids)
    target_logits.scatter_(-1, ids, torch.where(accept.unsqueeze(-1), bumped, current))
    return target_logits


# How vLLM's rejection samplers (vLLM's and vLLM-Ascend's) tell a greedy
# request: temperature exactly 0 (SamplingParams stores greedy as 0.0). Only
# those rows are verified by the host's greedy kernel, so only they may be
# promoted; a sampled row keeps standard rejection sampling.
GREEDY_TEMPERATURE = 0.0


def apply_to_greedy_rows(rule: AcceptanceRule, target_logits: torch.Tensor,
                         draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                         generated: torch.Tensor | None,
                         temperature: torch.Tensor | None) -> torch.Tensor:
    """The one application of a rule inside a host's rejection sampler, after
    its logits processors: promote (in place) the draft tokens `rule` accepts
    on greedy rows, so the host's greedy verifier accepts exactly them.

    `generated` [B]: tokens each request had generated before this step's
    drafts, or None when the host does not say (every request then counts as
    fresh, so the rule's strict prefix keeps acceptance strict: never more
    lossy than configured). `temperature` [B]: per request, or None when every
    request is greedy."""
    if rule.lossless or target_logits.shape[0] == 0:
        return target_logits
    req, pos = draft_positions(cu_num_draft_tokens, target_logits.shape[0])
    generated = torch.zeros_like(req) if generated is None else generated.to(torch.int64)[req]
    accept = accept_mask(rule, target_logits, draft_token_ids, pos, generated)
    if temperature is not None:
        accept &= (temperature == GREEDY_TEMPERATURE)[req]
    return promote_accepted(target_logits, draft_token_ids, accept)


__all__ = ["NO_TOKEN", "AcceptanceRule", "accept_mask", "apply_to_greedy_rows", "draft_positions",
           "promote_accepted", "GREEDY_TEMPERATURE"]
