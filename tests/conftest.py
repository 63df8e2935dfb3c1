"""Shared fixtures for the real-engine tests.

Engines run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, uni executor): they
start in seconds instead of a minute on 2 cores, and a test can read the
scheduler's controller directly. Exactness tests use float32, where greedy
speculative decoding and target-only decoding agree token for token (bf16
near-ties are a host-numerics question; docs/models.md reports them).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# One OpenMP thread for torch, here and in what the tests start: the tiny
# models gain nothing from a second one, and a second one spin-waits whenever
# anything else holds a core (the other xdist worker, a server, a peer suite).
# Nine engine tests beside two niced busy loops took 1.58x their idle wall
# time with torch's default two threads, 1.06x with one (2026-12-02, 2 cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

REPO = Path(__file__).resolve().parents[1]  # conftest.py stays in tests/
MODELS = REPO / "models"
TARGET = MODELS / "tiny-target"
DEEP_TARGET = MODELS / "derived" / "tiny-target-deep"
DRAFT = MODELS / "tiny-draft"
EAGLE = MODELS / "tiny-eagle"


def load_prompts(family: str, n: int) -> list[str]:
    lines = (MODELS / "prompts" / f"{family}.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()][:n]


_RUNNING: dict = {}  # "item": the test being set up or run (make_llm checks its marker)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    _RUNNING["item"] = item


@pytest.fixture(autouse=True, scope="module")
def warm_state_dir(tmp_path_factory):
    """The `model` policy's warm-start files (core/warm_state.py) of a test
    module's engines and the servers it starts go to a directory of the
    module's own: never the user's cache, never another module's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_VSPEC_STATE_DIR", str(tmp_path_factory.mktemp("vspec-state")))
        yield


def make_llm(model: Path = TARGET, *, speculative_config: dict | None = None,
             vspec: dict | None = None, **overrides):
    """A small in-process vLLM engine; `vspec` (a table of VSpecConfig keys)
    selects VSpecScheduler. vLLM's own worker unless `worker_cls` is passed,
    so a test chooses what vspec's worker adds (lazy gamma 0, lossy rules)."""
    from vllm import LLM

    from vllm_vspec.hosts import wiring

    item = _RUNNING.get("item")
    if item is not None and item.get_closest_marker("engine") is None:
        raise RuntimeError(f"{item.nodeid} starts a vLLM engine but is not marked "
                           f"`engine` (pytest.mark.engine): mark the test or its module")
    kwargs = dict(model=str(model), dtype="float32", max_model_len=512, seed=0,
                  gpu_memory_utilization=0.3, kv_cache_memory_bytes=128 << 20,
                  max_num_seqs=16, enforce_eager=True,
                  distributed_executor_backend="uni", generation_config="vllm",
                  # Named: with a `vspec` table vspec's platform hook would
                  # otherwise fill `auto` with vspec's worker (platform.py).
                  worker_cls="vllm.v1.worker.cpu_worker.CPUWorker")
    # vspec's engine arguments win over the defaults above: with the engine
    # core in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1) they
    # select vspec's executor, as they do for users (wiring.EXECUTOR_CLS).
    kwargs.update(wiring.engine_args(speculative_config, vspec, platform="cpu",
                                     with_worker=False))
    kwargs.update(overrides)
    return LLM(**kwargs)


def engine_config(method: str = "draft_model", k: int = 4, vspec: dict | None = None, *,
                  device: str = "cpu", worker_cls: str = "auto", async_scheduling: bool = False,
                  scheduler_cls: str | None = None, data_parallel_size: int = 1,
                  moe: bool = False, cudagraph_mode: str = "NONE", v2_runner: bool = False,
                  static_table: list | None = None):
    """A stand-in for the VllmConfig fields vspec's wiring reads (no engine
    starts); `method=None` is an engine without speculative decoding."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    spec = None if method is None else SimpleNamespace(
        method=method, num_speculative_tokens=k,
        num_speculative_tokens_per_batch_size=static_table)
    return SimpleNamespace(
        speculative_config=spec,
        additional_config={} if vspec is None else {"vspec": vspec},
        device_config=SimpleNamespace(device_type=device),
        model_config=SimpleNamespace(is_moe=moe),
        parallel_config=SimpleNamespace(worker_cls=worker_cls,
                                        data_parallel_size=data_parallel_size),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling,
                                         scheduler_cls=scheduler_cls),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode[cudagraph_mode]),
        use_v2_model_runner=v2_runner)


def close_llm(llm) -> None:
    from vllm_vspec.tools.engine_runs import shutdown_llm

    shutdown_llm(llm)


def scheduler_of(llm):
    """The engine's scheduler (in-process engines only)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def runner_of(llm):
    """The model runner of an in-process (uni executor) engine."""
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def record_drafter_calls(llm, row) -> list:
    """Wrap the runner's propose_draft_token_ids: after every call append
    `row(scheduler_output, drafts, runner) + (drafter forwards during the
    call,)` to the returned log."""
    runner = runner_of(llm)
    log, forwards = [], [0]
    runner.drafter.model.register_forward_pre_hook(
        lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    propose = runner.propose_draft_token_ids

    def recorded(scheduler_output, *args, **kwargs):
        forwards[0] = 0
        drafts = propose(scheduler_output, *args, **kwargs)
        log.append((*row(scheduler_output, drafts, runner), forwards[0]))
        return drafts

    runner.propose_draft_token_ids = recorded
    return log


class TokenBuffer:
    """A drafter's backup-token buffer (vLLM's CpuGpuBuffer on CPU)."""

    def __init__(self, n: int):
        import torch

        self.cpu = torch.zeros(n, dtype=torch.int32)
        self.gpu = torch.zeros(n, dtype=torch.int32)
        self.np = self.cpu.numpy()

    def copy_to_gpu(self, n: int):
        return self.gpu[:n].copy_(self.cpu[:n])


MAX_TOKENS = 48  # tokens per request in the exactness tests (and `reference`)


def greedy(llm, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def assert_same_tokens(got: list[list[int]], want: list[list[int]], label: str) -> None:
    """Fail with the first differing position of every differing request."""
    diffs = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            pos = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            diffs.append(f"  request {i}: first difference at token {pos}: "
                         f"got {g[pos:pos + 8]} want {w[pos:pos + 8]}")
    assert len(got) == len(want) and not diffs, (
        f"{label}: {len(diffs)}/{len(want)} requests differ from target-only\n" + "\n".join(diffs))


@pytest.fixture(scope="session")
def code_prompts() -> list[str]:
    return load_prompts("code", 16)


@pytest.fixture(scope="session")
def prose_prompts() -> list[str]:
    return load_prompts("prose", 16)


def counter(llm, name: str) -> float:
    """Current value of a vLLM Prometheus counter (sum over labels). Counters
    are process-global, so tests compare values before and after a run."""
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)


def run_preempted(llm, run):
    """run()'s result; `llm` (built with a KV cache smaller than the batch
    needs) is closed afterwards, and the test fails unless vLLM preempted a
    request meanwhile."""
    try:
        before = counter(llm, "vllm:num_preemptions")
        out = run()
        preempted = counter(llm, "vllm:num_preemptions") - before
    finally:
        close_llm(llm)
    assert preempted > 0, "the tiny KV cache caused no preemption; shrink it"
    return out


@pytest.fixture(scope="session")
def random_draft(tmp_path_factory) -> Path:
    """A freshly initialised draft with the bundled draft's shape and tokenizer.
    Its LM head is untied: a random model with tied embeddings predicts its
    input token again, which a looping target would accept."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("random-draft")
    torch.manual_seed(1234)
    config = AutoConfig.from_pretrained(DRAFT)
    config.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16).save_pretrained(out)
    for f in DRAFT.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def pin():
    """The default vLLM-Ascend host pin (patches/hosts.toml), an
    vllm_vspec.tools.ascend_build.common.Pin."""
    from vllm_vspec.tools.ascend_build import common

    default, pins = common.load_pins()
    return pins[default]


@pytest.fixture(scope="session")
def prompts(code_prompts, prose_prompts) -> list[str]:
    """Eight code and eight prose held-out prompts: one batch of 16."""
    return code_prompts[:8] + prose_prompts[:8]


@pytest.fixture(scope="session")
def reference(prompts) -> list[list[int]]:
    """Target-only greedy tokens of `prompts`, the oracle of every exactness
    test: one target-only engine for the whole session, started and closed
    before the first module that asks for it builds its own engines (pytest
    sets up session fixtures before module ones; only one in-process engine
    may be alive at a time)."""
    llm = make_llm()
    try:
        return greedy(llm, prompts)
    finally:
        close_llm(llm)


# ------------------------------------------------- commands and servers
def run_command(command: list[str], timeout_s: float, *, cwd: Path | None = None):
    """Run `command` to its end: a CompletedProcess (text stdout, stderr) with
    `seconds` added. Its own process group, so that the deadline (the test
    fails) or a session stopped early (Ctrl-C) stops what it started too (the
    peer suites run pytest processes of their own)."""
    import signal
    import subprocess
    import time

    # An inner pytest must not inherit this run's options (-k, -x, ...) or
    # its xdist worker identity.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException as e:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            pytest.fail(f"{' '.join(map(str, command))}: still running after {timeout_s:.0f} s; "
                        f"stopped")
        raise
    done = subprocess.CompletedProcess(command, proc.returncode, out, err)
    done.seconds = time.monotonic() - started
    return done


@contextlib.contextmanager
def started(*servers):
    """Enter `servers` (bench.server.Server) side by side, one thread each (a
    server's start-up waits on its own processes), and stop all of them on
    exit; on a failed start, stop the rest and raise the first error."""
    import threading

    errors: list[BaseException] = []

    def enter(server) -> None:
        try:
            server.__enter__()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    threads = [threading.Thread(target=enter, args=(s,)) for s in servers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        yield servers
    finally:
        for server in servers:
            server.stop()


# --------------------------------------------------------------- ordering
def pytest_collection_modifyitems(config, items) -> None:
    """The biggest test files first, so that `make test`'s two workers
    (pytest-xdist, one file at a time each, in this order) finish together:
    files with a peer suite, then files by their number of engine tests,
    then the rest, each file's tests in their own order. A serial run
    runs the same order."""
    def marked(item, name: str) -> bool:
        return item.get_closest_marker(name) is not None
    files: dict = {}
    for item in items:
        peer, engines = files.get(item.path, (False, 0))
        files[item.path] = (peer or marked(item, "peer"), engines + marked(item, "engine"))
    rank = {path: (not peer, -engines) for path, (peer, engines) in files.items()}
    items.sort(key=lambda item: rank[item.path])  # stable: a file's tests keep their order
