"""Which drafter options a vspec config asks for, and the predicates the
proposers (hosts/vllm/proposers.py, the Ascend overlay's) and the start-up
checks (hosts/wiring.py) share: plain Python over a VSpecConfig, so a
start-up check needs no torch (the head itself is kernels/draft_head.py)."""

from __future__ import annotations

from typing import Any

from vllm_vspec.config import VSpecConfigError


# vspec keys carried out by vspec's proposers (this head and the
# diagnostics traces), each with its test of being on.
DRAFTER_KEYS = {
    "draft_active_vocab_ids": lambda c: bool(c.draft_active_vocab_ids),
    "draft_lm_head_quantization": lambda c: c.draft_lm_head_quantization != "none",
    **{key: (lambda c, key=key: bool(getattr(c, key))) for key in (
        "draft_trace_path", "draft_io_trace_dir", "target_hidden_trace_dir",
        "target_argmax_trace_path")},
}


def pure_greedy(sampling_metadata: Any) -> bool:
    """A step's whole batch is temperature 0 without logprobs, penalties or
    token masks (the fields of vLLM's SamplingMetadata, 0.23 and 0.32): the
    premise under which an active vocabulary was collected, so the only
    steps that draft from it."""
    m = sampling_metadata
    return (m.all_greedy and m.max_num_logprobs is None and m.no_penalties
            and m.allowed_token_ids_mask is None and not m.bad_words_token_ids)


def head_key(cfg: Any) -> str:
    """The vspec key a draft-head refusal names."""
    return ("draft_active_vocab_ids" if cfg.draft_active_vocab_ids
            else "draft_lm_head_quantization")


def wants_head(cfg: Any) -> bool:
    """Whether `cfg` asks for a DraftHead (an active vocabulary or int8)."""
    return bool(cfg.draft_active_vocab_ids) or cfg.draft_lm_head_quantization != "none"


def refuse_head(cfg: Any, why: str) -> None:
    """Raise VSpecConfigError naming the head key: the host drafter cannot
    take the head, `why` says what it needs."""
    key = head_key(cfg)
    raise VSpecConfigError(key, getattr(cfg, key), why)


def drafter_features(cfg) -> list[str]:
    """The DRAFTER_KEYS set in `cfg`."""
    return [key for key, on in DRAFTER_KEYS.items() if on(cfg)]


__all__ = ["DRAFTER_KEYS", "drafter_features", "pure_greedy", "head_key", "wants_head",
           "refuse_head"]
