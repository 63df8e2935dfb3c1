"""`vllm-vspec trace`: read vspec's diagnostics traces.

  summarize     what a trace holds (readers: tools/traces.py; formats:
                hosts/diagnostics.py)
  active-vocab  the drafter's active-vocabulary ids file from a target-argmax
                trace (commands/active_vocab.py)
"""

from __future__ import annotations

import argparse
import json

from vllm_vspec.hosts import diagnostics
from vllm_vspec.tools.traces import summarize


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from vllm_vspec.cli import HelpFormatter
    from vllm_vspec.commands import active_vocab

    p = subparsers.add_parser("trace", help="read vspec diagnostics traces",
                              description=__doc__ + "\n" + diagnostics.__doc__,
                              formatter_class=HelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = actions.add_parser("summarize", formatter_class=HelpFormatter,
                           help="summarise a controller trace (trace_path), a draft / target_argmax "
                                "trace or a trace directory")
    s.add_argument("path", help="a JSONL trace file or a safetensors trace directory")
    s.add_argument("--top", type=int, default=10, help="most frequent ids listed (argmax trace)")
    s.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    s.set_defaults(func=_summarize_main)
    active_vocab.add_parser(actions)


def _summarize_main(args: argparse.Namespace) -> int:
    try:
        summary = summarize(args.path, top=args.top)
    except OSError as e:
        raise SystemExit(f"vllm-vspec trace summarize: path={args.path!r} is not allowed: "
                         f"a readable trace file or directory ({e.strerror})") from None
    except ValueError as e:  # TraceError included: names the file, the line, the key
        raise SystemExit(f"vllm-vspec trace summarize: {e}") from None
    if args.json:
        print(json.dumps(summary))
        return 0
    for key, value in summary.items():
        print(f"{key:>20}: {json.dumps(value) if isinstance(value, (dict, list)) else value}")
    return 0
