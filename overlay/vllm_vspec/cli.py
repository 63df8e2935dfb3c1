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
import os
import sys

# name -> module path.
SUBCOMMANDS: dict[str, str] = {
    "bench": "vllm_vspec.commands.bench",
    "demo": "vllm_vspec.commands.demo",
    "doctor": "vllm_vspec.commands.doctor",
    "serve": "vllm_vspec.commands.serve",
    "models": "vllm_vspec.commands.models",
    "sim": "vllm_vspec.commands.sim",
    "replay": "vllm_vspec.commands.replay",
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
    "replay": "score gamma policies exactly on recorded streams and measured step costs",
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


class UserError(ValueError):
    """A user's input a command cannot use (a flag's value, a file): `main`
    prints it as one line and exits 2, as argparse does for a bad flag."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a user's input was wrong, each already
    naming the key or flag, the value and what is allowed: one line, exit 2,
    no traceback (VSPEC_TRACEBACK=1 shows it anyway)."""
    from vllm_vspec.config import VSpecConfigError
    from vllm_vspec.core.trace import TraceError

    errors: list[type[BaseException]] = [UserError, VSpecConfigError, TraceError]
    for module, name in (("vllm_vspec.launch.presets", "PresetError"),
                         ("vllm_vspec.core.latency", "ProfileError"),
                         ("vllm_vspec.tools.drafters", "DrafterError"),
                         ("vllm_vspec.hosts.vllm.platform", "VSpecStartupError")):
        loaded = sys.modules.get(module)  # only what the command imported
        if loaded is not None:
            errors.append(getattr(loaded, name))
    return tuple(errors)


def _one_line(command: str, message: str) -> str:
    text = " ".join(str(message).split())
    prefix = f"vllm-vspec {command}".rstrip()
    return text if text.startswith("vllm-vspec") else f"{prefix}: {text}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The top-level options take no value, so the first word is the command.
    command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(command if command in SUBCOMMANDS else "")
    # A subcommand that hands unknown options on (serve: to vLLM's parser)
    # marks where they start.
    split = getattr(sys.modules.get(SUBCOMMANDS.get(command, "")), "split_argv", None)
    if split is not None and argv and argv[0] == command:
        argv = split(parser, argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SystemExit as exc:
        if not isinstance(exc.code, str):  # an exit status: pass it on
            raise
        if os.environ.get("VSPEC_TRACEBACK"):
            raise
        print(_one_line(command, exc.code), file=sys.stderr)
        return 2
    except Exception as exc:
        if not isinstance(exc, user_errors()) or os.environ.get("VSPEC_TRACEBACK"):
            raise
        print(_one_line(command, str(exc)), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
