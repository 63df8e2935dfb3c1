"""`vllm-vspec` console script: one command, subcommands registered in SUBCOMMANDS.

Each subcommand lives in its own module exposing `add_parser(subparsers)`
(which sets `func` on its parser). The CLI only composes; it holds no logic.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module path; a module is imported only when its subcommand runs or
# when `--help` lists it, so `vllm-vspec --help` stays fast.
SUBCOMMANDS: dict[str, str] = {
    "bench": "vllm_vspec.bench.command",
    "demo": "vllm_vspec.demo",
    "doctor": "vllm_vspec.doctor",
    "serve": "vllm_vspec.serve",
    "models": "vllm_vspec.drafters",
    "sim": "vllm_vspec.sim",
    "fit-profile": "vllm_vspec.latency",
    "profile": "vllm_vspec.profile_collect",
    "manage": "vllm_vspec.manage",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """For subcommands: the module docstring as written, and every option's
    default in --help."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-vspec",
        description="Speculative decoding with dynamic gamma for vLLM (vSpec Adaptive).")
    from vllm_vspec import __version__
    parser.add_argument("--version", action="version", version=f"vllm-vspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
