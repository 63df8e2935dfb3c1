"""`vllm-vspec` console script: one command, subcommands registered in SUBCOMMANDS.

Each subcommand lives in its own module exposing `add_parser(subparsers)`
(which sets `func` on its parser, or on each of its actions' parsers). The
CLI only composes, and runs a command's old spelling (RENAMED_COMMANDS,
FORMER_ACTION) as its new one for one release. A subcommand's module is
imported only when that subcommand runs (some pull in vLLM, torch or httpx
at import): `vllm-vspec --help` lists the others from SECTIONS, SUMMARIES
and ACTIONS without importing them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import textwrap

# name -> module path.
SUBCOMMANDS: dict[str, str] = {
    "serve": "vllm_vspec.commands.serve",
    "demo": "vllm_vspec.commands.demo",
    "bench": "vllm_vspec.commands.bench",
    "profile": "vllm_vspec.commands.profile",
    "sim": "vllm_vspec.commands.sim",
    "replay": "vllm_vspec.commands.replay",
    "doctor": "vllm_vspec.commands.doctor",
    "trace": "vllm_vspec.commands.trace",
    "models": "vllm_vspec.commands.models",
    "manage": "vllm_vspec.commands.manage",
}

# name -> the one line `vllm-vspec --help` shows for it: the `help` its
# module's add_parser gives (tests/unit/test_cli.py checks that they agree).
SUMMARIES: dict[str, str] = {
    "serve": "launch `vllm serve` from a preset (configs/*.toml)",
    "demo": "target-only vs speculative decoding on the bundled pair.",
    "bench": "benchmarks: vspec's servers against fixed gamma, a seed protocol, draft LM heads",
    "profile": "this host's latency profile (the profile policy and the simulators read it)",
    "sim": "simulate gamma policies on acceptance traces and a latency profile",
    "replay": "score gamma policies exactly on recorded streams and measured step costs",
    "doctor": "host versions, features, vspec settings and the host ABI check",
    "trace": "read vspec diagnostics traces",
    "models": "find, validate and register the default drafters",
    "manage": "the vspec install in this environment",
}

# A command that groups actions -> its actions, in the order its --help
# lists them (the test checks them against the real parsers).
ACTIONS: dict[str, tuple[str, ...]] = {
    "bench": ("serve", "protocol", "draft-head"),
    "profile": ("collect", "fit"),
    "replay": ("record", "costs", "score"),
    "trace": ("summarize", "active-vocab"),
    "manage": ("status", "validate", "enable", "disable", "upgrade", "rollback", "uninstall"),
}

# How `vllm-vspec --help` groups the commands: (heading, commands).
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run", ("serve", "demo")),
    ("measure and tune", ("bench", "profile", "sim", "replay")),
    ("inspect and install", ("doctor", "trace", "models", "manage")),
)

# An old command -> the command and action that replaced it.
RENAMED_COMMANDS: dict[str, tuple[str, str]] = {
    "fit-profile": ("profile", "fit"),
    "draft-head-bench": ("bench", "draft-head"),
    "active-vocab": ("trace", "active-vocab"),
}
# A command that was a single action and is now a group -> the action its
# options alone still run; given `--protocol`, bench's is `protocol`.
FORMER_ACTION: dict[str, str] = {"bench": "serve", "profile": "collect"}


def notice(old: str, new: str) -> str:
    """The one deprecation line, for a flag or a command."""
    return (f"vllm-vspec: {old} is deprecated and will be removed in the next release; "
            f"use {new}")


def current_command(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` with an old command spelling replaced by the new one, and the
    deprecation line to show (None: `argv` was current). A group given
    nothing, or only --help, is the group itself."""
    if not argv or argv[0].startswith("-"):
        return argv, None
    old, rest = argv[0], argv[1:]
    if old in RENAMED_COMMANDS:
        new = list(RENAMED_COMMANDS[old])
    elif old in FORMER_ACTION and rest and rest[0] not in ACTIONS[old] \
            and rest[0] not in ("-h", "--help"):
        if old == "bench" and any(a == "--protocol" or a.startswith("--protocol=") for a in rest):
            new, rest = [old, "protocol"], _protocol_positional(rest)
        else:
            new = [old, FORMER_ACTION[old]]
    else:
        return argv, None
    return new + rest, notice(f"`vllm-vspec {old}`", f"`vllm-vspec {' '.join(new)}`")


def _protocol_positional(rest: list[str]) -> list[str]:
    """bench's old `--protocol NAME` as `bench protocol`'s positional NAME."""
    out: list[str] = []
    it = iter(rest)
    for a in it:
        if a == "--protocol":
            out.insert(0, next(it, ""))
        elif a.startswith("--protocol="):
            out.insert(0, a.split("=", 1)[1])
        else:
            out.append(a)
    return out


DESCRIPTION = (
    "Speculative decoding with dynamic gamma for vLLM (vSpec Adaptive). Plain `vllm serve` "
    "runs it when --additional-config holds a \"vspec\" table (docs/plain-vllm.md); these "
    "commands launch, measure and tune it.")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """For subcommands: the module docstring as written, and every option's
    default in --help. A required option has no default to show, and an
    option whose default is None shows none: its help says what leaving it
    out does."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


def command_listing(width: int | None = None) -> str:
    """The commands by section, each with its summary and, for a group,
    its actions: the body of `vllm-vspec --help`."""
    width = width or min(100, shutil.get_terminal_size().columns)
    column = 2 + max(map(len, SUBCOMMANDS)) + 2
    lines: list[str] = []
    for heading, names in SECTIONS:
        lines.append(f"{heading}:")
        for name in names:
            text = SUMMARIES[name] + (f" [{' | '.join(ACTIONS[name])}]" if name in ACTIONS else "")
            wrapped = textwrap.wrap(text, max(30, width - column)) or [""]
            lines.append(f"  {name:<{column - 2}}{wrapped[0]}")
            lines += [" " * column + more for more in wrapped[1:]]
    return "\n".join(lines)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with the real sub-parser of `command` (its module
    imported); every other subcommand is a stub. None: every sub-parser
    real (every module imported)."""
    parser = argparse.ArgumentParser(
        prog="vllm-vspec", usage="vllm-vspec [-h] [--version] COMMAND [ACTION] [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n".join(textwrap.wrap(DESCRIPTION, 80)) + "\n\n" + command_listing(),
        epilog="`vllm-vspec COMMAND --help` shows a command's options, or a group's actions.")
    from vllm_vspec import __version__
    parser.add_argument("--version", action="version", version=f"vllm-vspec {__version__}")
    # The listing is the epilog (by section); the sub-parsers' own entries
    # stay out of --help.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS,
                                prog="vllm-vspec")
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
    # A command's old spelling runs as its new one, after one line.
    argv, line = current_command(argv)
    if line:
        print(line, file=sys.stderr)
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
    # A one-line error names the command as typed: `bench serve`, `sim`.
    action = getattr(args, "action", None)
    if command in ACTIONS and action in ACTIONS[command]:
        command = f"{command} {action}"
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
