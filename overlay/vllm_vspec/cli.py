"""`vllm-vspec` console script: one command, subcommands registered in SUBCOMMANDS.

Each subcommand lives in its own module exposing `add_parser(subparsers)`
(which sets `func` on its parser). The CLI only composes; it holds no logic.
A subcommand's module is imported only when that subcommand runs (some pull
in vLLM, torch or httpx at import): `vllm-vspec --help` lists the others
from SUMMARIES without importing them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module path.
SUBCOMMANDS: dict[str, str] = {
    "bench": "vllm_vspec.commands.bench",
    "demo": "vllm_vspec.commands.demo",
    "doctor": "vllm_vspec.commands.doctor",
    "serve": "vllm_vspec.commands.serve",
    "models": "vllm_vspec.commands.models",
    "sim": "vllm_vspec.commands.sim",
    "fit-profile": "vllm_vspec.commands.fit_profile",
    "profile": "vllm_vspec.commands.profile",
    "trace": "vllm_vspec.commands.trace",
    "active-vocab": "vllm_vspec.commands.active_vocab",
    "draft-head-bench": "vllm_vspec.commands.draft_head_bench",
    "manage": "vllm_vspec.commands.manage",
}

# name -> the one line `vllm-vspec --help` shows for it: the `help` its
# module's add_parser gives (tests/test_cli.py checks that they agree).
SUMMARIES: dict[str, str] = {
    "bench": "serving benchmark: dynamic vs fixed gamma (or a seed protocol)",
    "demo": "target-only vs speculative decoding on the bundled pair.",
    "doctor": "host versions, features, vspec settings and the host ABI check",
    "serve": "launch `vllm serve` from a preset (configs/*.toml)",
    "models": "find, validate and register the default drafters",
    "sim": "simulate gamma policies on acceptance traces and a latency profile",
    "fit-profile": "fit a latency profile JSON from latency samples",
    "profile": "measure latency samples on this host and fit a latency profile",
    "trace": "read vspec diagnostics traces",
    "active-vocab": "build a drafter active-vocabulary ids file from an argmax trace",
    "draft-head-bench": "measure draft time and acceptance of the draft LM head options",
    "manage": "status, enable/disable, upgrade/rollback, uninstall",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """For subcommands: the module docstring as written, and every option's
    default in --help."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with the real sub-parser of `command` (its module
    imported); every other subcommand is a stub listed with its summary.
    None: every sub-parser real (every module imported)."""
    parser = argparse.ArgumentParser(
        prog="vllm-vspec",
        description="Speculative decoding with dynamic gamma for vLLM (vSpec Adaptive).")
    from vllm_vspec import __version__
    parser.add_argument("--version", action="version", version=f"vllm-vspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=SUMMARIES.get(name))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The top-level options take no value, so the first word is the command.
    command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(command if command in SUBCOMMANDS else "")
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
