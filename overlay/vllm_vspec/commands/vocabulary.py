"""The flag names every `vllm-vspec` subcommand shares, and the old
spellings still accepted for one release.

- `--target`, `--draft` (and `--eagle`, `--eagle3` for heads): model paths or ids;
- `--prompts`: a path (a prompts file or directory); a count is `--num-prompts`;
- `--output`: a file to write; `--output-dir`: a directory to write into;
  `--json`: print JSON instead of a table (takes no value);
- `--num-speculative-tokens`: K, vLLM's own name for it.

Commands that belong together are actions of one command (`bench serve`,
`profile fit`); their old spellings run as the new ones for one release,
after the same one line (cli.RENAMED_COMMANDS, cli.FORMER_ACTION).

tests/unit/test_cli.py walks every subcommand's parser against these rules.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Spellings no subcommand shows (the rule each breaks); `deprecated` keeps
# some accepted, hidden from --help.
RETIRED = {
    "--out": "--output (a file) or --output-dir (a directory)",
    "--target-model": "--target",
    "--draft-model": "--draft",
    "--model": "--target or --draft",
    "--gamma": "--num-speculative-tokens (K)",
    "--k": "--num-speculative-tokens (K)",
}


# serve's flags for the [launch] keys live with the keys (the launch layer,
# which the config docs read too).
from vllm_vspec.launch.presets import LAUNCH_FLAGS, launch_flag  # noqa: E402,F401


class _Deprecated(argparse.Action):
    """Stores like the flag it stands for, after one line on stderr."""

    def __init__(self, option_strings, dest, *, new: str, **kwargs: Any):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from vllm_vspec.cli import notice

        print(notice(option_string, self.new), file=sys.stderr)
        setattr(namespace, self.dest, values)


def deprecated(parser: Any, old: str, new: str, *, dest: str, **kwargs: Any) -> None:
    """Accept `old` as `new` (same `dest`, same `type`/`metavar` in
    `kwargs`), hidden from --help, with a deprecation line when used."""
    parser.add_argument(old, dest=dest, action=_Deprecated, new=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **kwargs)


def is_deprecated(action: argparse.Action) -> bool:
    return isinstance(action, _Deprecated)


__all__ = ["LAUNCH_FLAGS", "RETIRED", "deprecated", "is_deprecated", "launch_flag"]
