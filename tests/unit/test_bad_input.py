"""A user's bad input ends a command in one line naming the key or flag and
the value, exit code 2, never a traceback; vspec settings naming files are
checked (readable, well-formed, writable) before any engine starts.

Each bad input runs the real console entry point in a fresh interpreter
(`python -m vllm_vspec.cli ...`), so what is asserted is exactly what a user
sees on stderr and as the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_vspec.config import VSpecConfig, VSpecConfigError

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "cpu-tiny-draft.json"
UNWRITABLE = "/proc/vspec-nosuch/trace.jsonl"  # /proc takes no new files, root or not


def run_cli(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_vspec.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_one_line(out: subprocess.CompletedProcess, *named: str) -> str:
    """Exit 2, nothing but one line on stderr, naming each of `named`."""
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    out = {"not_json": d / "not.json", "bad_samples": d / "samples.json",
           "bad_profile": d / "profile.json", "bad_ids": d / "ids.json"}
    out["not_json"].write_text("kind,ctx,ms\nstep,1,2\n")
    out["bad_samples"].write_text(json.dumps([{"kind": "target", "ctx": 10, "n": "two",
                                               "ms": 1.0}]))
    out["bad_profile"].write_text(json.dumps({"schema": "vllm-vspec/latency-profile",
                                              "version": 1, "target": {"alpha": -1}}))
    out["bad_ids"].write_text(json.dumps({"format": "vspec-active-vocab/1", "ids": [1, 1]}))
    return out


# (label, argv builder, texts the line must name)
CASES = [
    ("profile fit on a non-JSON samples file",
     lambda f, t: ["profile", "fit", str(f["not_json"]), str(t / "p.json")], ["not.json", "JSON"]),
    ("profile fit on bad fields",
     lambda f, t: ["profile", "fit", str(f["bad_samples"]), str(t / "p.json")],
     ["samples[0].n", "'two'"]),
    ("profile fit on a missing samples file",
     lambda f, t: ["profile", "fit", str(t / "nosuch.json"), str(t / "p.json")], ["nosuch.json"]),
    ("sim --profile missing",
     lambda f, t: ["sim", "--profile", str(t / "nosuch.json"), "--output-dir", str(t)],
     ["--profile", "nosuch.json"]),
    ("sim --profile malformed (not JSON)",
     lambda f, t: ["sim", "--profile", str(f["not_json"]), "--output-dir", str(t)],
     ["--profile", "not.json"]),
    ("sim --profile malformed (bad field)",
     lambda f, t: ["sim", "--profile", str(f["bad_profile"]), "--output-dir", str(t)],
     ["--profile", "target.alpha"]),
    ("sim --vspec with an unknown key",
     lambda f, t: ["sim", "--profile", str(PROFILE), "--vspec", '{"polcy":1}', "--output-dir", str(t)],
     ["vspec.polcy=1", "did you mean 'policy'"]),
    ("sim --vspec not JSON",
     lambda f, t: ["sim", "--profile", str(PROFILE), "--vspec", "{policy", "--output-dir", str(t)],
     ["--vspec", "{policy"]),
    ("serve --config with a missing file",
     lambda f, t: ["serve", "--dry-run", "--config", str(t / "nosuch.toml")], ["nosuch.toml"]),
    ("serve with an unwritable trace_path",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft", "--vspec-trace-path",
                   UNWRITABLE], ["vspec.trace_path", UNWRITABLE]),
    ("serve with a missing profile_path",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft", "--vspec-policy", "profile",
                   "--vspec-profile-path", str(t / "nosuch.json")],
     ["vspec.profile_path", "nosuch.json", "vllm-vspec profile"]),
    ("serve with a malformed profile_path",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft", "--vspec-policy", "profile",
                   "--vspec-profile-path", str(f["bad_profile"])],
     ["vspec.profile_path", "target.alpha"]),
    ("serve with a malformed active-vocab ids file",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft",
                   "--vspec-draft-active-vocab-ids", str(f["bad_ids"])],
     ["vspec.draft_active_vocab_ids", "ids.json", "distinct"]),
    ("serve with hysteresis above its bound",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft", "--vspec-hysteresis", "5"],
     ["vspec.hysteresis=5.0", "[0.0, 1.0]"]),
    ("serve with an unwritable trace_path in -- --additional-config",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft", "--", "--additional-config",
                   json.dumps({"vspec": {"trace_path": UNWRITABLE}})],
     ["vspec.trace_path", UNWRITABLE]),
    ("serve with a non-JSON -- --additional-config",
     lambda f, t: ["serve", "--dry-run", "--preset", "tiny-draft", "--", "--additional-config",
                   "{vspec"], ["--additional-config", "{vspec"]),
    ("bench serve --variants nosuch",
     lambda f, t: ["bench", "serve", "--dry-run", "--variants", "nosuch"],
     ["--variants nosuch", "fixed-2", "eagle-online", "eagle-tree-online"]),
    ("trace summarize on a missing file",
     lambda f, t: ["trace", "summarize", str(t / "nosuch.jsonl")], ["nosuch.jsonl"]),
]


@pytest.mark.parametrize("label,argv,named", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_ends_in_one_line_and_exit_2(label, argv, named, files, tmp_path):
    assert_one_line(run_cli(*argv(files, tmp_path)), *named)


def test_bench_lists_every_variant_even_away_from_the_bundled_models(tmp_path):
    """Outside the repository the default model paths do not exist: the
    line still lists every variant and says which paths were not found."""
    line = assert_one_line(run_cli("bench", "serve", "--dry-run", "--variants", "nosuch",
                                   cwd=tmp_path),
                           "--variants nosuch", "online", "eagle-fixed-2", "profile")
    assert "not found" in line and "--draft" in line


# ------------------------------------------- VSpecConfig.from_dict file checks
def test_file_keys_are_checked_when_enabled_and_name_key_value_and_fix(tmp_path):
    bad = {"trace_path": UNWRITABLE}
    with pytest.raises(VSpecConfigError) as err:
        VSpecConfig.from_dict(bad, 4)
    assert (err.value.key, err.value.value) == ("trace_path", UNWRITABLE)
    assert "writable file path" in err.value.allowed
    # Disabled settings write nothing: names and types only.
    VSpecConfig.from_dict({**bad, "enabled": False}, 4)
    # A path whose parent directories do not exist yet is fine (the writers create them).
    VSpecConfig.from_dict({"trace_path": str(tmp_path / "a" / "b" / "t.jsonl")}, 4)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("key", ["draft_io_trace_dir", "target_hidden_trace_dir"])
def test_a_dump_directory_may_not_be_a_file(key, tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(VSpecConfigError, match=f"vspec.{key}=.*writable directory"):
        VSpecConfig.from_dict({key: str(tmp_path / "f")}, 4)


@pytest.mark.parametrize("key", ["draft_trace_path", "target_argmax_trace_path"])
def test_a_trace_file_may_not_be_a_directory(key, tmp_path):
    with pytest.raises(VSpecConfigError, match=f"vspec.{key}=.*writable file"):
        VSpecConfig.from_dict({key: str(tmp_path)}, 4)


def test_a_good_profile_and_ids_file_pass(tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"format": "vspec-active-vocab/1", "vocab_size": 8,
                               "ids": [0, 3, 5]}))
    cfg = VSpecConfig.from_dict({"policy": "profile", "profile_path": str(PROFILE),
                                 "draft_active_vocab_ids": str(ids),
                                 "draft_active_vocab_size": 2}, 4)
    assert cfg.profile_path == str(PROFILE)
    with pytest.raises(VSpecConfigError, match="draft_active_vocab_size=4.*at most the 3 ids"):
        VSpecConfig.from_dict({"draft_active_vocab_ids": str(ids),
                               "draft_active_vocab_size": 4}, 4)


def test_hysteresis_has_an_upper_bound():
    assert VSpecConfig.from_dict({"hysteresis": 1.0}).hysteresis == 1.0
    with pytest.raises(VSpecConfigError, match=r"vspec.hysteresis=1.5 .*\[0.0, 1.0\]"):
        VSpecConfig.from_dict({"hysteresis": 1.5})


def test_the_engine_resolver_checks_files_before_any_model_loads():
    """wiring.resolve (what vspec's model runner calls in its __init__,
    before vLLM loads weights, and the scheduler) raises the same error."""
    from conftest import engine_config
    from vllm_vspec.hosts import wiring

    with pytest.raises(VSpecConfigError, match="vspec.trace_path"):
        wiring.resolve(engine_config(vspec={"trace_path": UNWRITABLE}))


# ------------------------------------------------------------- cli.main itself
def test_cli_main_turns_a_message_exit_into_one_line_and_2_and_keeps_exit_codes(
        monkeypatch, capsys):
    from vllm_vspec import cli

    def fake(command_error):
        def add_parser(sub):
            p = sub.add_parser("sim")
            p.set_defaults(func=lambda args: (_ for _ in ()).throw(command_error))
        return add_parser

    import vllm_vspec.commands.sim as sim_cmd
    monkeypatch.setattr(sim_cmd, "add_parser", fake(SystemExit("--x=1 is not allowed: y")))
    assert cli.main(["sim"]) == 2
    assert capsys.readouterr().err == "vllm-vspec sim: --x=1 is not allowed: y\n"
    monkeypatch.setattr(sim_cmd, "add_parser", fake(SystemExit(3)))
    with pytest.raises(SystemExit) as err:
        cli.main(["sim"])
    assert err.value.code == 3
    # A bug is not a user error: its traceback stays.
    monkeypatch.setattr(sim_cmd, "add_parser", fake(KeyError("bug")))
    with pytest.raises(KeyError):
        cli.main(["sim"])
    # VSPEC_TRACEBACK=1 shows a user error's traceback too.
    monkeypatch.setattr(sim_cmd, "add_parser", fake(VSpecConfigError("policy", 1, "z")))
    monkeypatch.setenv("VSPEC_TRACEBACK", "1")
    with pytest.raises(VSpecConfigError):
        cli.main(["sim"])


def test_redirected_bench_progress_prints_one_flushed_line_per_phase(capsys):
    from vllm_vspec.commands.bench import _LineProgress

    lines = _LineProgress(total=6, started=0.0)
    for what in ("target / steady", "target / steady", "target / bursty",
                 "online / steady", "online / steady", "online / bursty"):
        lines.advance(what)
    lines.variant_done([], {})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6, out   # start, four phases, one server done
    assert "target / bursty: running (3/6 requests done)" in out[2]
    assert "server done (6/6 requests" in out[-1]
