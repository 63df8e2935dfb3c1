"""`vllm-vspec`: a subcommand's module is imported only when it runs, so
`--help` and the light commands never pay for vLLM, torch or httpx."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_vspec import cli

HEAVY = ("vllm", "torch", "httpx")


def imported_after(argv: list[str]) -> set[str]:
    """Top-level packages of HEAVY that `vllm-vspec ARGV` imported (run in a
    fresh interpreter, so nothing this test process imported counts)."""
    code = ("import json, sys\n"
            "from vllm_vspec.cli import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit:\n"
            "    pass\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["sim", "--help"], []])
def test_help_and_sim_import_no_heavy_package(argv):
    assert imported_after(argv) == set()


def test_help_lists_every_subcommand_with_its_summary(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    for name in cli.SUBCOMMANDS:
        assert f"{name} {' '.join(cli.SUMMARIES[name].split())}" in listing, name


def test_each_summary_is_the_help_its_module_gives():
    full = cli.build_parser()._subparsers._group_actions[0]
    given = {a.dest: a.help for a in full._choices_actions}
    assert given == cli.SUMMARIES


# ------------------------------------------------------------- vocabulary
# One vocabulary across the subcommands (commands/vocabulary.py).
import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

from vllm_vspec.commands import vocabulary  # noqa: E402

def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) of every subcommand and nested subcommand."""
    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(f"{name} {sub}".strip(), p)

    walk("", cli.build_parser())
    return out[1:]


def shown(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Option string -> action of every flag --help shows."""
    return {s: a for a in parser._actions if a.help is not argparse.SUPPRESS
            for s in a.option_strings}


def test_the_walk_reaches_every_subcommand():
    assert {name.split()[0] for name, _ in parsers()} == set(cli.SUBCOMMANDS)


def test_no_subcommand_shows_a_retired_spelling():
    found = {(name, flag) for name, p in parsers() for flag in shown(p)
             if flag in vocabulary.RETIRED}
    assert not found, {f: vocabulary.RETIRED[f[1]] for f in found}


def _path_like(action: argparse.Action) -> bool:
    return action.type in (None, str, Path) and action.nargs not in (0,)


def test_prompts_is_always_a_path_and_a_count_is_num_prompts():
    for name, p in parsers():
        flags = shown(p)
        if "--prompts" in flags:
            assert _path_like(flags["--prompts"]), name
        if "--num-prompts" in flags:
            assert flags["--num-prompts"].type is not None and \
                flags["--num-prompts"].type not in (str, Path), name


def test_json_takes_no_value_and_output_takes_one():
    for name, p in parsers():
        flags = shown(p)
        if "--json" in flags:
            assert flags["--json"].nargs == 0, f"{name}: --json is a switch; a file is --output"
        for flag in ("--output", "--output-dir"):
            if flag in flags:
                assert flags[flag].nargs != 0, f"{name}: {flag} names where to write"


def test_model_paths_are_target_and_draft():
    spelled = {name: {f for f in shown(p) if f in ("--target", "--draft")}
               for name, p in parsers()}
    assert {n for n, f in spelled.items() if f} >= {
        "bench", "demo", "serve", "profile", "draft-head-bench", "active-vocab"}


def test_serve_takes_k_as_num_speculative_tokens():
    (serve,) = [p for name, p in parsers() if name == "serve"]
    assert "--num-speculative-tokens" in shown(serve)


@pytest.mark.parametrize("argv, old, dest, value", [
    (["serve", "--gamma", "3"], "--gamma", "override:launch:gamma", "3"),
    (["serve", "--target-model", "t"], "--target-model", "override:launch:target_model", "t"),
    (["serve", "--draft-model", "d"], "--draft-model", "override:launch:draft_model", "d"),
    (["demo", "--json", "r.json"], "--json", "output", Path("r.json")),
    (["bench", "--out", "r"], "--out", "output_dir", Path("r")),
    (["sim", "--profile", "p.json", "--out", "r"], "--out", "output_dir", Path("r")),
    (["active-vocab", "t.jsonl", "--size", "8", "-o", "x", "--model", "m"], "--model", "target",
     "m"),
    (["draft-head-bench", "--k", "3"], "--k", "num_speculative_tokens", 3),
    (["draft-head-bench", "--prompts", "4"], "--prompts", "num_prompts", 4),
])
def test_an_old_spelling_still_works_for_one_release_with_one_line(argv, old, dest, value,
                                                                     capsys):
    args = cli.build_parser(argv[0]).parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"vllm-vspec: {old} is deprecated") \
        and "removed in the next release" in err[0], err
    (parser,) = [p for name, p in parsers() if name == argv[0]]
    assert old not in shown(parser)  # hidden from --help
