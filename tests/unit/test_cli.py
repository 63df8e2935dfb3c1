"""`vllm-vspec`: the command tree and its one vocabulary.

Spec:
- a subcommand's module is imported only when it runs, so `--help` and the
  light commands never pay for vLLM, torch or httpx;
- `vllm-vspec --help` lists every command once, by section, with its
  summary and, for a group, its actions;
- related commands are actions of one group (`bench serve`, `profile fit`);
  the old spellings run as the new ones for one release, after one line;
- every parser speaks the shared flag names (commands/vocabulary.py);
- an option a command cannot run without is required, and no --help shows
  "(default: None)".
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_vspec import cli
from vllm_vspec.commands import vocabulary

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


@pytest.mark.parametrize("argv", [["--help"], ["sim", "--help"], [], ["fit-profile", "--help"]])
def test_help_and_sim_import_no_heavy_package(argv):
    assert imported_after(argv) == set()


# ------------------------------------------------------------ the listing
def top_help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    return capsys.readouterr().out


def test_help_lists_every_command_with_its_summary_and_actions(capsys):
    listing = " ".join(top_help(capsys).split())
    for name in cli.SUBCOMMANDS:
        actions = f" [{' | '.join(cli.ACTIONS[name])}]" if name in cli.ACTIONS else ""
        assert f"{name} {' '.join(cli.SUMMARIES[name].split())}{actions}" in listing, name


def test_help_lists_each_command_once_under_a_section(capsys):
    listed = [n for _, names in cli.SECTIONS for n in names]
    assert sorted(listed) == sorted(cli.SUBCOMMANDS)
    text = top_help(capsys)
    for name in cli.SUBCOMMANDS:
        assert len(re.findall(rf"^  {re.escape(name)} ", text, re.M)) == 1, name
    assert "{" not in text.split("\n\n")[2]  # argparse's own {a,b,...} list is not shown


def test_each_summary_is_the_help_its_module_gives():
    full = cli.build_parser()._subparsers._group_actions[0]
    given = {a.dest: a.help for a in full._choices_actions}
    assert given == cli.SUMMARIES


def test_each_groups_listed_actions_are_its_parsers_actions():
    real = {name: tuple(sub) for name, sub in _groups().items()}
    assert real == cli.ACTIONS


def _groups() -> dict[str, dict[str, argparse.ArgumentParser]]:
    top = cli.build_parser()._subparsers._group_actions[0].choices
    out = {}
    for name, parser in top.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out[name] = action.choices
    return out


# ------------------------------------------------------------- the walk
def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) of every subcommand and nested action."""
    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(f"{name} {sub}".strip(), p)

    walk("", cli.build_parser())
    return out[1:]


def parser_of(path: str) -> argparse.ArgumentParser:
    (parser,) = [p for name, p in parsers() if name == path]
    return parser


def test_the_walk_reaches_every_command_and_action():
    expected = set(cli.SUBCOMMANDS) | {f"{g} {a}" for g, acts in cli.ACTIONS.items()
                                        for a in acts}
    assert {name for name, _ in parsers()} == expected


def shown(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Option string -> action of every flag --help shows."""
    return {s: a for a in parser._actions if a.help is not argparse.SUPPRESS
            for s in a.option_strings}


# ------------------------------------------------------------- vocabulary
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
        "bench serve", "demo", "serve", "profile collect", "bench draft-head",
        "trace active-vocab", "replay record"}


def test_serve_takes_k_as_num_speculative_tokens():
    assert "--num-speculative-tokens" in shown(parser_of("serve"))


@pytest.mark.parametrize("argv, old, dest, value", [
    (["serve", "--list", "--gamma", "3"], "--gamma", "override:launch:gamma", "3"),
    (["serve", "--list", "--target-model", "t"], "--target-model",
     "override:launch:target_model", "t"),
    (["serve", "--list", "--draft-model", "d"], "--draft-model", "override:launch:draft_model",
     "d"),
    (["demo", "--json", "r.json"], "--json", "output", Path("r.json")),
    (["bench", "serve", "--out", "r"], "--out", "output_dir", Path("r")),
    (["sim", "--profile", "p.json", "--out", "r"], "--out", "output_dir", Path("r")),
    (["trace", "active-vocab", "t.jsonl", "--size", "8", "-o", "x", "--model", "m"], "--model",
     "target", "m"),
    (["bench", "draft-head", "--k", "3"], "--k", "num_speculative_tokens", 3),
    (["bench", "draft-head", "--prompts", "4"], "--prompts", "num_prompts", 4),
])
def test_an_old_flag_spelling_still_works_for_one_release_with_one_line(argv, old, dest, value,
                                                                          capsys):
    args = cli.build_parser(argv[0]).parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"vllm-vspec: {old} is deprecated") \
        and "removed in the next release" in err[0], err
    path = " ".join(argv[:2]) if argv[0] in cli.ACTIONS else argv[0]
    assert old not in shown(parser_of(path))  # hidden from --help


# ------------------------------------------------------- old command names
@pytest.mark.parametrize("old, new", [
    (["fit-profile", "s.json", "p.json"], ["profile", "fit", "s.json", "p.json"]),
    (["draft-head-bench", "--num-prompts", "4"], ["bench", "draft-head", "--num-prompts", "4"]),
    (["active-vocab", "t.jsonl", "--target", "m", "--size", "8", "--output", "x"],
     ["trace", "active-vocab", "t.jsonl", "--target", "m", "--size", "8", "--output", "x"]),
    (["bench", "--dry-run", "--variants", "target"],
     ["bench", "serve", "--dry-run", "--variants", "target"]),
    (["profile", "--decode-steps", "2"], ["profile", "collect", "--decode-steps", "2"]),
    (["bench", "--base-url", "u", "--protocol", "gsm8k", "--dataset", "d"],
     ["bench", "protocol", "gsm8k", "--base-url", "u", "--dataset", "d"]),
    (["bench", "--protocol=arc-easy", "--base-url", "u", "--dataset", "d"],
     ["bench", "protocol", "arc-easy", "--base-url", "u", "--dataset", "d"]),
])
def test_an_old_command_spelling_runs_as_its_new_one_after_one_line(old, new):
    argv, notice = cli.current_command(old)
    assert argv == new
    named = " ".join(new[:2])
    assert notice == (f"vllm-vspec: `vllm-vspec {old[0]}` is deprecated and will be removed "
                      f"in the next release; use `vllm-vspec {named}`")
    # The new spelling parses to the new action's function.
    args = cli.build_parser(new[0]).parse_args(argv)
    assert args.func is cli.build_parser(new[0]).parse_args(new).func


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--help"], ["profile", "-h"],
                                  ["bench", "serve", "--dry-run"], ["profile", "fit", "a", "b"],
                                  ["trace", "summarize", "t"], ["--help"], []])
def test_a_current_spelling_is_left_alone(argv):
    assert cli.current_command(argv) == (argv, None)


def test_main_runs_an_old_command_as_the_new_one(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["draft-head-bench", "--help"])
    assert info.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: vllm-vspec bench draft-head")
    assert err.splitlines() == [cli.notice("`vllm-vspec draft-head-bench`",
                                                  "`vllm-vspec bench draft-head`")]


def test_a_group_without_an_action_names_its_actions_and_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: ACTION" in err


# ---------------------------------------------------- required is required
def test_no_help_shows_default_none():
    assert [name for name, p in parsers() if "(default: None)" in p.format_help()] == []


def _required(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    return action.required or any(g.required and action in g._group_actions
                                  for g in parser._mutually_exclusive_groups)


def test_where_help_shows_defaults_an_option_without_one_says_what_leaving_it_out_does():
    silent = [(name, a.option_strings[0]) for name, p in parsers()
              if issubclass(p.formatter_class, cli.HelpFormatter)
              for a in shown(p).values()
              if a.default is None and a.nargs != 0 and not _required(p, a)
              and not re.search(r"\b(unset|default)\b", a.help or "")]
    assert silent == []


@pytest.mark.parametrize("argv, missing", [
    (["bench", "protocol", "gsm8k", "--dataset", "d.jsonl"], "--base-url"),
    (["bench", "protocol", "gsm8k", "--base-url", "u"], "--dataset"),
    (["bench", "protocol", "--base-url", "u", "--dataset", "d.jsonl"], "protocol"),
    (["serve", "--dry-run"], "one of the arguments --preset --config"),
    (["sim"], "--profile"),
    (["replay", "costs"], "--recording"),
    (["manage", "upgrade"], "--wheel"),
    (["trace", "active-vocab", "t.jsonl", "--size", "4", "--output", "x"], "--target"),
    (["trace", "active-vocab", "t.jsonl", "--target", "m", "--output", "x"], "--size"),
    (["profile", "fit", "samples.json"], "profile"),
])
def test_an_option_a_command_cannot_run_without_is_required(argv, missing, capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser(argv[0]).parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "required" in err and missing in err, err
