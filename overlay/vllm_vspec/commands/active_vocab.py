"""`vllm-vspec active-vocab`: the drafter's active vocabulary from a target-argmax trace.

Counts how often the target committed each token id for greedy requests in a
`target_argmax_trace_path` trace (diagnostics.py), and writes the ids file
that `draft_active_vocab_ids` reads: the special tokens first (always kept),
then the most frequent ids, `--size` ids in all (fewer when the trace saw
fewer distinct ids, unless `--fill-unseen` adds ids the trace never saw,
smallest id first: in a BPE vocabulary the earlier, more frequent merges).

File format (JSON):
    {"format": "vspec-active-vocab/1", "vocab_size": V, "special_ids": [...],
     "ids": [...], "counted_tokens": N, "source": "trace path"}
`ids` is ordered (specials, then by falling frequency, ties by id), so its
first N entries are the best N-id vocabulary: `draft_active_vocab_size: N`
uses exactly those.

Example (the bundled EAGLE pair):
    vllm-vspec active-vocab results/argmax.jsonl --model models/tiny-target \\
        --fraction 0.5 -o results/active-vocab-50.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any, Iterable

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


def load_ids(path: str | Path, size: int, vocab_size: int) -> list[int]:
    """The first `size` ids of an active-vocabulary file (0: all), checked
    against the drafter's vocabulary. Raises VSpecConfigError naming the key."""
    from vllm_vspec.config import VSpecConfigError

    key = "draft_active_vocab_ids"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise VSpecConfigError(key, str(path), f"a readable active-vocabulary JSON file ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise VSpecConfigError(key, str(path), f"a file in format {FORMAT!r} "
                               "(write one with `vllm-vspec active-vocab`)")
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


def special_ids_of(model: str) -> list[int]:
    """The tokenizer's special ids plus the eos/bos/pad ids of the model's
    config and generation config."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    ids: list[Any] = list(AutoTokenizer.from_pretrained(model).all_special_ids)
    configs: list[Any] = [AutoConfig.from_pretrained(model)]
    try:
        configs.append(GenerationConfig.from_pretrained(model))
    except OSError:
        pass   # no generation_config.json
    for cfg in configs:
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            v = getattr(cfg, name, None)
            ids.extend(v if isinstance(v, list) else [] if v is None else [v])
    return sorted(set(int(i) for i in ids))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from vllm_vspec.cli import HelpFormatter

    p = subparsers.add_parser("active-vocab", formatter_class=HelpFormatter, description=__doc__,
                              help="build a drafter active-vocabulary ids file from an argmax trace")
    p.add_argument("trace", help="a target_argmax trace (JSONL, vspec key target_argmax_trace_path)")
    p.add_argument("--model", required=True,
                   help="the target model directory (vocabulary size and special tokens)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--size", type=int, help="number of ids")
    size.add_argument("--fraction", type=float, help="number of ids as a fraction of the vocabulary")
    p.add_argument("--fill-unseen", action="store_true",
                   help="when the trace saw fewer distinct ids than asked, add ids it never "
                        "saw, smallest first")
    p.add_argument("-o", "--output", required=True, help="ids file to write (JSON)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from vllm_vspec.hosts.diagnostics import greedy_token_counts

    vocab_size = AutoConfig.from_pretrained(args.model).vocab_size
    n = args.size if args.size is not None else round(args.fraction * vocab_size)
    if not 1 <= n <= vocab_size:
        print(f"vllm-vspec active-vocab: size {n} is not in [1, {vocab_size}] (the vocabulary)")
        return 2
    counts = greedy_token_counts(args.trace)
    specials = special_ids_of(args.model)
    ids = build_ids(counts, specials, n, vocab_size if args.fill_unseen else 0)
    counted = sum(counts.values())
    write_ids(args.output, ids, specials, vocab_size, counted, str(args.trace))
    covered = sum(counts[i] for i in ids)
    unseen = sum(1 for i in ids if i not in counts and i not in specials)
    report = {"output": args.output, "ids": len(ids), "requested": n, "vocab_size": vocab_size,
              "special_ids": len(specials), "unseen_ids": unseen, "counted_tokens": counted,
              "trace_coverage": round(covered / counted, 4) if counted else None}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"wrote {args.output}: {len(ids)} ids of {vocab_size} (asked {n}; "
              f"{len(specials)} special, {unseen} unseen), covering {report['trace_coverage']} of the "
              f"{counted} greedy tokens in {args.trace}")
    return 0


__all__ = ["build_ids", "load_ids", "write_ids", "special_ids_of", "FORMAT"]
