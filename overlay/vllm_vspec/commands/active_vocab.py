"""`vllm-vspec trace active-vocab`: the drafter's active vocabulary from a target-argmax trace.

Counts how often the target committed each token id for greedy requests in a
`target_argmax_trace_path` trace (hosts/diagnostics.py), and writes the ids file
that `draft_active_vocab_ids` reads: the special tokens first (always kept),
then the most frequent ids, `--size` ids in all (fewer when the trace saw
fewer distinct ids, unless `--fill-unseen` adds ids the trace never saw,
smallest id first: in a BPE vocabulary the earlier, more frequent merges).

The file format and its ranking are core/active_vocab.py.

Example (the bundled EAGLE pair):
    vllm-vspec trace active-vocab results/argmax.jsonl --target models/tiny-target \\
        --fraction 0.5 --output results/active-vocab-50.json
"""

from __future__ import annotations

import argparse
import json

from vllm_vspec.core.active_vocab import build_ids, write_ids


def add_parser(actions: argparse._SubParsersAction) -> None:
    """`trace`'s action `active-vocab`."""
    from vllm_vspec.cli import HelpFormatter
    from vllm_vspec.commands import vocabulary

    p = actions.add_parser("active-vocab", formatter_class=HelpFormatter, description=__doc__,
                           help="build a drafter active-vocabulary ids file from an argmax trace")
    p.add_argument("trace", help="a target_argmax trace (JSONL, vspec key target_argmax_trace_path)")
    # Required, the old spelling counting as given (a required group of two).
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--target",
                        help="the target model directory (vocabulary size and special tokens)")
    vocabulary.deprecated(target, "--model", "--target", dest="target")
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

    from vllm_vspec.tools.drafters import special_ids_of
    from vllm_vspec.tools.traces import greedy_token_counts

    vocab_size = AutoConfig.from_pretrained(args.target).vocab_size
    n = args.size if args.size is not None else round(args.fraction * vocab_size)
    if not 1 <= n <= vocab_size:
        flag = "--size" if args.size is not None else "--fraction"
        raise SystemExit(f"{flag}={args.size if args.size is not None else args.fraction} is "
                         f"not allowed: {n} ids, which must be in [1, {vocab_size}] (the "
                         "vocabulary)")
    counts = greedy_token_counts(args.trace)
    specials = special_ids_of(args.target)
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
