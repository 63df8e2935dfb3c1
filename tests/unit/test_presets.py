"""Launch presets: every preset renders a command vLLM's own `vllm serve`
parser accepts; overrides win over the file; bad values name their key."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import typing
from pathlib import Path

import pytest

from vllm_vspec import cli
from vllm_vspec.launch import presets
from vllm_vspec.commands import serve
from vllm_vspec.hosts import wiring
from vllm_vspec.config import VSpecConfig

REPO = Path(__file__).resolve().parents[2]
PRESETS = presets.list_presets()
PLATFORMS = sorted(presets.PLATFORMS)


@pytest.fixture(scope="module")
def vllm_serve_parser():
    """`vllm serve`'s parser, built the way vLLM's CLI main builds it."""
    top, command = serve.vllm_serve_command()

    def parse(argv: list[str]):
        assert argv[:2] == ["vllm", "serve"], argv
        args = top.parse_args(argv[1:])
        command.validate(args)
        return args
    return parse


def dry_run(capsys, *argv: str) -> tuple[list[str], dict[str, str]]:
    """Run `vllm-vspec serve --dry-run ...`; return (vllm argv, exported env).
    `--dry-run` goes first: after a `--` it would be a vLLM argument. The
    last line is what runs on this host: on the CPU host vLLM's serve
    through vllm_vspec.commands.serve (returned as `vllm serve ...`)."""
    assert cli.main(["serve", "--dry-run", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    env = dict(shlex.split(line)[1].split("=", 1) for line in lines[:-1]
               if line.startswith("export "))
    command = shlex.split(lines[-1])
    if command[:3] == [sys.executable, "-m", "vllm_vspec.commands.serve"]:
        command = ["vllm", "serve", *command[3:]]
    return command, env


def test_the_seed_presets_and_the_tiny_presets_exist():
    assert set(PRESETS) >= {"draft", "eagle", "eagle-relaxed", "draft-arc-easy",
                            "eagle-arc-easy", "draft-adaptive", "tiny-draft", "tiny-eagle",
                            "tiny-eagle3", "tiny-mtp", "qwen3-eagle3", "qwen25-eagle3"}


def test_a_wheel_carries_the_presets(tmp_path):
    """`serve --preset` reads the package's `_configs`: in a checkout a link
    to configs/, in a wheel its files as package data."""
    import sys
    import zipfile

    repo = Path(__file__).resolve().parents[2]
    assert sorted(presets.list_presets()) == sorted(p.stem for p in (repo / "configs").glob("*.toml"))
    # Built from a copy (links kept as links), as the release audit builds it.
    sys.path.insert(0, str(repo))
    import release_check

    wheel = release_check.build_wheel(release_check.copy_sources(tmp_path / "src"), tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"vllm_vspec/_configs/{p}.toml" for p in PRESETS} <= set(names)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_renders_a_command_vllm_serve_accepts(name, platform, capsys,
                                                           vllm_serve_parser):
    argv, _ = dry_run(capsys, "--preset", name, "--platform", platform)
    args = vllm_serve_parser(argv)
    preset = presets.load(presets.preset_path(name))
    assert args.model_tag == preset.launch.target_model
    assert args.speculative_config["method"] == presets.METHODS[preset.launch.method]
    assert args.speculative_config["num_speculative_tokens"] == preset.launch.gamma
    assert args.scheduler_cls == wiring.SCHEDULER_CLS
    # What the engine will read back must validate as the same vspec settings.
    assert VSpecConfig.from_dict(args.additional_config["vspec"], preset.launch.gamma) == preset.vspec


def test_seed_values_of_the_14b_presets():
    draft = presets.load(presets.preset_path("draft")).launch
    assert (draft.target_model, draft.draft_model) == ("Qwen/Qwen2.5-14B-Instruct",
                                                       "Qwen/Qwen2.5-0.5B-Instruct")
    assert (draft.gamma, draft.max_num_seqs, draft.dtype, draft.graph_mode) == (
        4, 128, "bfloat16", "full-decode-only")
    arc = presets.load(presets.preset_path("eagle-arc-easy")).launch
    assert (arc.method, arc.max_num_seqs, arc.dtype, arc.graph_mode, arc.port) == (
        "eagle", 16, "float16", "full-decode-only", 18180)


def test_lossy_presets_say_so_and_strict_ones_are_lossless():
    lossy = {n for n in PRESETS if not presets.load(presets.preset_path(n)).vspec.lossless}
    assert lossy == {"eagle-relaxed", "draft-adaptive"}
    for name in lossy:
        assert "LOSSY" in presets.load(presets.preset_path(name)).description


def test_only_the_eagle_tree_preset_drafts_trees_and_it_says_experimental_cpu_only():
    trees = {n for n in PRESETS if presets.load(presets.preset_path(n)).vspec.tree_width > 1}
    assert trees == {"eagle-tree"}
    tree = presets.load(presets.preset_path("eagle-tree"))
    assert "EXPERIMENTAL" in tree.description and "CPU host only" in tree.description
    # the bundled CPU pair, K = 8 nodes, arms gamma <= 4 x width <= 4
    assert tree.launch == dataclasses.replace(
        presets.load(presets.preset_path("tiny-eagle")).launch, gamma=8)
    assert (tree.vspec.max_gamma, tree.vspec.tree_width, tree.vspec.policy) == (4, 4, "online")


def test_extends_inherits_the_base_and_overrides_key_by_key():
    relaxed = presets.load(presets.preset_path("eagle-relaxed"))
    eagle = presets.load(presets.preset_path("eagle"))
    assert relaxed.launch == eagle.launch
    assert relaxed.vspec.acceptance == "relaxed_topk"


def test_command_line_overrides_win_over_the_file(capsys, vllm_serve_parser):
    argv, _ = dry_run(capsys, "--preset", "eagle", "--platform", "cuda",
                      "--num-speculative-tokens", "3", "--max-num-seqs", "64",
                      "--no-prefix-caching", "--graph-mode", "piecewise",
                      "--vspec-min-gamma", "0", "--vspec-protected-token-ids", "1,2")
    args = vllm_serve_parser(argv)
    assert args.speculative_config["num_speculative_tokens"] == 3
    assert args.max_num_seqs == 64
    assert args.enable_prefix_caching is False
    assert args.compilation_config.cudagraph_mode.name == "PIECEWISE"
    assert args.additional_config["vspec"] == {"min_gamma": 0, "protected_token_ids": [1, 2]}


def test_every_config_field_has_a_generated_override_flag():
    from vllm_vspec.commands.vocabulary import launch_flag  # the CLI's shared names

    help_text = cli.build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for table, cls in (("launch", presets.LaunchConfig), ("vspec", VSpecConfig)):
        for f in dataclasses.fields(cls):
            flag = (launch_flag(f.name) if table == "launch"
                    else "--vspec-" + f.name.replace("_", "-"))
            assert flag in help_text, f"no flag {flag} for {table}.{f.name}"


def test_extra_vllm_args_after_double_dash_come_last(capsys, vllm_serve_parser):
    argv, _ = dry_run(capsys, "--preset", "draft", "--", "--max-model-len", "512", "--seed", "7")
    assert argv[-4:] == ["--max-model-len", "512", "--seed", "7"]
    args = vllm_serve_parser(argv)
    assert (args.max_model_len, args.seed) == (512, 7)  # vLLM: the last one wins


@pytest.mark.parametrize("flags, key, value", [
    (["--num-speculative-tokens", "16", "--platform", "npu"], "launch.gamma", "16"),
    (["--num-speculative-tokens", "0"], "launch.gamma", "0"),
    (["--dtype", "int3"], "launch.dtype", "int3"),
    (["--port", "0"], "launch.port", "0"),
    (["--gpu-memory-utilization", "1.5"], "launch.gpu_memory_utilization", "1.5"),
    (["--vspec-policy", "bandit"], "vspec.policy", "bandit"),
    (["--vspec-min-gamma", "7"], "vspec.min_gamma", "7"),
    (["--vspec-hysteresis", "fast"], "vspec.hysteresis", "fast"),
])
def test_bad_values_fail_naming_the_key_and_the_value(flags, key, value, capsys):
    assert cli.main(["serve", "--dry-run", "--preset", "draft", *flags]) == 2
    err = capsys.readouterr().err
    assert key in err and value in err and "the command line" in err, err


def test_k_above_ascends_verify_width_renders_where_the_host_has_no_such_limit(
        capsys, vllm_serve_parser):
    for platform in ("cpu", "cuda"):
        argv, _ = dry_run(capsys, "--preset", "draft", "--platform", platform,
                          "--num-speculative-tokens", "31")
        assert vllm_serve_parser(argv).speculative_config["num_speculative_tokens"] == 31
    # On npu only with vspec off: then the host runs as shipped.
    argv, _ = dry_run(capsys, "--preset", "draft", "--platform", "npu",
                      "--num-speculative-tokens", "31",
                      "--no-vspec-enabled")
    assert vllm_serve_parser(argv).speculative_config["num_speculative_tokens"] == 31


def write_preset(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


MINIMAL = '[launch]\ntarget_model = "t"\ndraft_model = "d"\n'


@pytest.mark.parametrize("text, key", [
    (MINIMAL + "gama = 4\n", "launch.gama"),
    (MINIMAL + "[vspec]\nmin_gama = 1\n", "vspec.min_gama"),
    (MINIMAL + "[vllm]\nseed = 1\n", "vllm"),
    (MINIMAL + "[env]\nFLAG = true\n", "env.FLAG"),
    ('[launch]\ntarget_model = "t"\n', "launch.draft_model"),
])
def test_a_bad_custom_file_fails_naming_the_key_and_the_file(tmp_path, capsys, text, key):
    path = write_preset(tmp_path, "custom", text)
    assert cli.main(["serve", "--dry-run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err and str(path) in err, err


def test_paths_in_a_preset_are_relative_to_its_file(tmp_path):
    sub = tmp_path / "presets"
    sub.mkdir()
    path = write_preset(sub, "local", '[launch]\ntarget_model = "../models/t"\n'
                        'draft_model = "org/hub-id"\n[vspec]\ntrace_path = "./trace.jsonl"\n')
    preset = presets.load(path)
    assert preset.launch.target_model == str(tmp_path / "models" / "t")
    assert preset.launch.draft_model == "org/hub-id"
    assert preset.vspec.trace_path == str(sub / "trace.jsonl")


def test_an_extends_cycle_is_refused(tmp_path):
    write_preset(tmp_path, "a", 'extends = "b"\n' + MINIMAL)
    write_preset(tmp_path, "b", 'extends = "a"\n')
    with pytest.raises(presets.PresetError, match="extends.*a -> b -> a"):
        presets.load(tmp_path / "a.toml")


def test_env_table_and_device_become_the_exported_environment(tmp_path, capsys):
    path = write_preset(tmp_path, "e", MINIMAL + '[env]\nVLLM_LOGGING_LEVEL = "DEBUG"\n')
    _, env = dry_run(capsys, "--config", str(path), "--platform", "npu", "--device", "2,3",
                     "--env", "OMP_NUM_THREADS=2")
    assert env == {"VLLM_LOGGING_LEVEL": "DEBUG", "ASCEND_RT_VISIBLE_DEVICES": "2,3",
                   "OMP_NUM_THREADS": "2"}


def test_graph_modes_map_per_platform(capsys, vllm_serve_parser):
    argv, _ = dry_run(capsys, "--preset", "draft", "--platform", "npu")
    assert vllm_serve_parser(argv).compilation_config.cudagraph_mode.name == "FULL_DECODE_ONLY"
    argv, _ = dry_run(capsys, "--preset", "draft", "--platform", "cpu")
    assert "--compilation-config" not in argv and "--enforce-eager" not in argv
    argv, _ = dry_run(capsys, "--preset", "draft", "--graph-mode", "eager")
    assert vllm_serve_parser(argv).enforce_eager is True


def test_every_platform_maps_every_graph_mode():
    modes = set(typing.get_args(typing.get_type_hints(presets.LaunchConfig)["graph_mode"]))
    for name, platform in presets.PLATFORMS.items():
        assert set(platform.graph_args) == modes, name


@pytest.mark.parametrize("mode", ["full", "full-decode-only"])
def test_full_cuda_graphs_render_piecewise_with_vspec_on(mode, capsys, vllm_serve_parser):
    # As vLLM does for its own dynamic speculation on the V1 CUDA runner.
    argv, _ = dry_run(capsys, "--preset", "draft", "--platform", "cuda", "--graph-mode", mode)
    assert vllm_serve_parser(argv).compilation_config.cudagraph_mode.name == "PIECEWISE"
    argv, _ = dry_run(capsys, "--preset", "draft", "--platform", "cuda", "--graph-mode", mode,
                      "--no-vspec-enabled")
    assert vllm_serve_parser(argv).compilation_config.cudagraph_mode.name == mode.upper().replace(
        "-", "_")


def test_async_scheduling_keeps_the_one_scheduler_path_and_is_off_on_cpu(capsys):
    argv, _ = dry_run(capsys, "--preset", "draft-adaptive", "--platform", "cuda")
    assert argv[argv.index("--scheduler-cls") + 1] == wiring.SCHEDULER_CLS
    assert "--async-scheduling" in argv
    argv, _ = dry_run(capsys, "--preset", "draft-adaptive", "--platform", "cpu")
    assert argv[argv.index("--scheduler-cls") + 1] == wiring.SCHEDULER_CLS
    assert "--no-async-scheduling" in argv


def test_rendered_class_paths_name_real_vspec_classes():
    import importlib
    paths = {wiring.SCHEDULER_CLS} | {w for w in wiring.WORKER_CLS.values() if w}
    for path in paths:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path


def test_the_vspec_worker_is_selected_on_cpu_and_cuda(capsys, vllm_serve_parser):
    for platform, worker in (("cpu", "VSpecCPUWorker"), ("cuda", "VSpecGPUWorker")):
        argv, env = dry_run(capsys, "--preset", "eagle-relaxed", "--platform", platform)
        assert vllm_serve_parser(argv).worker_cls.endswith("." + worker)
    assert env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # the cuda runner extends V1
    argv, env = dry_run(capsys, "--preset", "eagle-relaxed", "--platform", "npu")
    assert "--worker-cls" not in argv and env == {}


def test_the_additional_config_carries_only_the_keys_the_preset_sets(capsys):
    argv, _ = dry_run(capsys, "--preset", "draft-adaptive")
    vspec = json.loads(argv[argv.index("--additional-config") + 1])["vspec"]
    assert vspec == {"acceptance": "margin", "margin": 5.25}


@pytest.mark.parametrize("form", ["two words", "one word"])
def test_a_users_additional_config_joins_the_one_rendered_flag(form, tmp_path, capsys,
                                                               vllm_serve_parser):
    """`--vspec-min-gamma 1 -- --additional-config '{"vspec": {"trace_path": ...}}'`
    renders ONE --additional-config holding both keys (and the user's other
    keys): vLLM keeps only the last of two, which dropped the flag's setting."""
    trace = str(tmp_path / "t.jsonl")
    user = json.dumps({"vspec": {"trace_path": trace}, "other_plugin": {"x": 1}})
    extra = ["--additional-config", user] if form == "two words" else [f"--additional-config={user}"]
    argv, _ = dry_run(capsys, "--preset", "tiny-draft", "--vspec-min-gamma", "1", "--", *extra,
                      "--seed", "3")
    assert sum(a.split("=")[0] in presets.ADDITIONAL_CONFIG_FLAGS for a in argv) == 1, argv
    args = vllm_serve_parser(argv)
    assert args.additional_config == {"vspec": {"min_gamma": 1, "trace_path": trace},
                                      "other_plugin": {"x": 1}}
    assert argv[-2:] == ["--seed", "3"]  # the other extra arguments stay, last


def test_the_users_vspec_keys_win_and_each_conflict_is_reported(capsys, vllm_serve_parser):
    user = json.dumps({"vspec": {"min_gamma": 2, "policy": "online"}})
    assert cli.main(["serve", "--dry-run", "--preset", "tiny-draft", "--vspec-min-gamma", "1",
                     "--vspec-policy", "online", "--", "--additional-config", user]) == 0
    out = capsys.readouterr()
    command = shlex.split(out.out.strip().splitlines()[-1])
    config = json.loads(command[command.index("--additional-config") + 1])
    assert config == {"vspec": {"min_gamma": 2, "policy": "online"}}
    # Only the key whose values differ is reported, naming both values.
    assert out.err.strip().splitlines() == [
        "vllm-vspec serve: vspec.min_gamma: --additional-config's 2 wins over 1 "
        "(the preset or a --vspec-* flag)"]


def test_the_users_vspec_keys_are_validated_before_exec(capsys):
    user = json.dumps({"vspec": {"min_gamma": 9}})
    assert cli.main(["serve", "--dry-run", "--preset", "tiny-draft", "--",
                     "--additional-config", user]) == 2
    assert "vspec.min_gamma=9" in capsys.readouterr().err


def test_several_user_additional_configs_merge_later_keys_winning():
    merged, rest = presets.take_additional_config([
        "--additional-config", '{"vspec": {"policy": "fixed", "fixed_gamma": 1}, "a": 1}',
        "--seed", "1", '--additional-config={"vspec": {"fixed_gamma": 2}, "a": 2}'])
    assert merged == {"vspec": {"policy": "fixed", "fixed_gamma": 2}, "a": 2}
    assert rest == ["--seed", "1"]
    # vLLM's dotted form replaces the whole flag in vLLM's own parser: merged too.
    merged, rest = presets.take_additional_config([
        "--additional-config", '{"vspec": {"policy": "fixed"}}',
        "--additional-config.vspec.fixed_gamma", "2", "--additional-config.vspec.trace_path=t"])
    assert merged == {"vspec": {"policy": "fixed", "fixed_gamma": 2, "trace_path": "t"}}
    assert rest == []


def test_the_launcher_drains_on_sigterm_by_default(capsys, vllm_serve_parser):
    """vLLM 0.32's default --shutdown-timeout 0 aborts in-flight requests and
    could hang; every preset renders a drain window, overridable both ways."""
    for name in PRESETS:
        argv, _ = dry_run(capsys, "--preset", name, "--platform", "cpu")
        assert vllm_serve_parser(argv).shutdown_timeout == presets.LaunchConfig.shutdown_timeout
    assert presets.LaunchConfig.shutdown_timeout > 0
    argv, _ = dry_run(capsys, "--preset", "tiny-draft", "--shutdown-timeout", "5")
    assert vllm_serve_parser(argv).shutdown_timeout == 5
    argv, _ = dry_run(capsys, "--preset", "tiny-draft", "--", "--shutdown-timeout", "0")
    assert vllm_serve_parser(argv).shutdown_timeout == 0   # after `--`: the user's, last
    help_text = " ".join(serve.add_parser(
        __import__("argparse").ArgumentParser().add_subparsers()).format_help().split())
    assert "--shutdown-timeout" in help_text and "SIGTERM" in help_text


def test_the_dry_run_prints_the_command_that_runs_on_this_host(capsys):
    """On the CPU host the `vllm` script cannot run: the last line is the
    `python -m vllm_vspec.commands.serve ...` that exec runs, the `vllm serve`
    form above it as a comment; for another platform, the `vllm serve` line."""
    assert cli.main(["serve", "--dry-run", "--preset", "tiny-draft"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    runs = shlex.split(lines[-1])
    assert runs[:3] == [sys.executable, "-m", "vllm_vspec.commands.serve"]
    assert serve._exec_argv(["vllm", "serve", *runs[3:]]) == runs
    assert any(line.startswith("# = vllm serve ") for line in lines)
    assert cli.main(["serve", "--dry-run", "--preset", "tiny-draft", "--platform", "cuda"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("vllm serve ")


def test_committed_configuration_docs_are_up_to_date():
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert committed == presets.config_docs(), (
        "docs/configuration.md is stale: run "
        "`vllm-vspec serve --print-config-docs > docs/configuration.md`")


# ----------------------------------------------------------- tiny-ngram
def test_tiny_ngram_drafts_without_a_model_on_the_bundled_target(capsys, vllm_serve_parser):
    preset = presets.load(presets.preset_path("tiny-ngram"))
    tiny = presets.load(presets.preset_path("tiny-draft"))
    assert (preset.launch.method, preset.launch.draft_model) == ("ngram", "")
    assert preset.launch.target_model == tiny.launch.target_model     # the bundled tiny target
    assert preset.vspec == tiny.vspec                                  # every vspec key at its default
    argv, _ = dry_run(capsys, "--preset", "tiny-ngram")
    args = vllm_serve_parser(argv)
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 4,
                                       **wiring.NGRAM_PROMPT_LOOKUP}
    assert args.worker_cls == wiring.WORKER_CLS["cpu"]   # lazy gamma 0: no n-gram search
    from conftest import engine_config

    cfg = wiring.resolve(engine_config(method="ngram", worker_cls=args.worker_cls,
                                       vspec=args.additional_config["vspec"]))
    assert cfg.gamma0_mode == "lazy"


def test_a_draft_model_with_method_ngram_is_refused_naming_the_key(capsys):
    assert cli.main(["serve", "--dry-run", "--preset", "tiny-ngram",
                     "--draft", "models/tiny-draft"]) != 0
    assert "launch.draft_model" in capsys.readouterr().err


def test_the_method_table_names_every_per_method_refusal():
    docs = presets.config_docs()
    rows = {line.split(" | ")[0].strip("| `"): line for line in docs.splitlines()
            if line.startswith("| `") and line.count(" | ") == 4}
    assert {"draft_model", "eagle", "ngram", "suffix", "eagle3", "mtp"} <= set(rows)
    for method, key, _, _ in wiring.METHOD_REFUSALS:
        assert f"`{key}`" in rows[method].split(" | ")[-1], (method, key)
    assert rows["eagle3"].split(" | ")[1].startswith("supported: vLLM CPU (tested here")
    assert rows["mtp"].split(" | ")[1].startswith("supported: vLLM CPU (tested here")


def test_vllms_own_flags_need_no_double_dash(capsys):
    # Everything from the first option `serve` does not know goes to vLLM,
    # as if it followed `--`.
    extra = ["--seed", "7", "--enforce-eager"]
    with_dash, _ = dry_run(capsys, "--preset", "tiny-draft", "--", *extra)
    without, _ = dry_run(capsys, "--preset", "tiny-draft", *extra)
    assert without == with_dash
    assert without[-3:] == extra


def test_a_negative_value_of_a_serve_flag_is_not_taken_for_a_vllm_flag(capsys):
    # -1 is out of range for hysteresis: refused by vspec with the key named,
    # not handed to vLLM as a flag.
    assert cli.main(["serve", "--dry-run", "--preset", "tiny-draft", "--vspec-hysteresis", "-1"]) == 2
    assert "hysteresis" in capsys.readouterr().err
