"""The drafter's active-vocabulary ids file (`draft_active_vocab_ids`): its
format, how its ids are ranked and written, and the loader the draft head
uses (kernels/draft_head.py). `vllm-vspec trace active-vocab` (commands/) writes one.

File format (JSON):
    {"format": "vspec-active-vocab/1", "vocab_size": V, "special_ids": [...],
     "ids": [...], "counted_tokens": N, "source": "trace path"}
`ids` is ordered (specials, then by falling frequency, ties by id), so its
first N entries are the best N-id vocabulary: `draft_active_vocab_size: N`
uses exactly those.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Iterable

from vllm_vspec.config import VSpecConfigError

FORMAT = "vspec-active-vocab/1"


def build_ids(counts: collections.Counter, special_ids: Iterable[int], size: int,
              fill_from: int = 0) -> list[int]:
    """Special ids (in the order given, duplicates dropped), then the most
    frequent other ids (ties by smaller id), `size` ids in all; the specials
    are kept even when they alone exceed `size`. With `fill_from` V > 0, ids
    in [0, V) that `counts` never saw complete a short list, smallest first."""
    specials = list(dict.fromkeys(int(i) for i in special_ids))
    taken = set(specials)
    ranked = sorted((tid for tid in counts if tid not in taken), key=lambda t: (-counts[t], t))
    ranked += [t for t in range(fill_from) if t not in taken and t not in counts]
    return specials + ranked[:max(size - len(specials), 0)]


def write_ids(path: str | Path, ids: list[int], special_ids: list[int], vocab_size: int,
              counted_tokens: int, source: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({
        "format": FORMAT, "vocab_size": vocab_size, "special_ids": special_ids, "ids": ids,
        "counted_tokens": counted_tokens, "source": source}, indent=1) + "\n")


def check_file(path: str | Path, size: int) -> dict:
    """The parsed ids file, checked as far as it can be without the drafter
    (readable JSON in FORMAT, distinct non-negative integer ids, `size` at
    most their count). Raises VSpecConfigError naming the key and the fix."""
    key = "draft_active_vocab_ids"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VSpecConfigError(key, str(path), "a readable active-vocabulary JSON file "
                               f"({getattr(e, 'strerror', None) or e}); write one with "
                               "`vllm-vspec trace active-vocab`") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise VSpecConfigError(key, str(path), f"a file in format {FORMAT!r} "
                               "(write one with `vllm-vspec trace active-vocab`)")
    ids = raw.get("ids")
    if (not isinstance(ids, list) or len(set(map(repr, ids))) != len(ids)
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise VSpecConfigError(key, str(path), "a file whose ids are distinct integers >= 0 "
                               "(write one with `vllm-vspec trace active-vocab`)")
    if size > len(ids):
        raise VSpecConfigError("draft_active_vocab_size", size,
                               f"at most the {len(ids)} ids in {path}")
    return raw


def load_ids(path: str | Path, size: int, vocab_size: int) -> list[int]:
    """The first `size` ids of an active-vocabulary file (0: all), checked
    against the drafter's vocabulary. Raises VSpecConfigError naming the key."""
    key = "draft_active_vocab_ids"
    raw = check_file(path, size)
    ids = raw["ids"]
    if raw.get("vocab_size") != vocab_size:
        raise VSpecConfigError(key, str(path), f"ids for a {vocab_size}-token vocabulary "
                               f"(this file was built for {raw.get('vocab_size')})")
    if len(set(ids)) != len(ids) or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
        raise VSpecConfigError(key, str(path), f"distinct integer ids in [0, {vocab_size})")
    if size > len(ids):
        raise VSpecConfigError("draft_active_vocab_size", size,
                               f"at most the {len(ids)} ids in {path}")
    return ids[:size] if size else ids


__all__ = ["build_ids", "check_file", "load_ids", "write_ids", "FORMAT"]
