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
