"""Shared fixtures for the real-engine tests.

Engines run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, uni executor): they
start in seconds instead of a minute on 2 cores, and a test can read the
scheduler's controller directly. Exactness tests use float32, where greedy
speculative decoding and target-only decoding agree token for token (bf16
near-ties are a host-numerics question; docs/models.md reports them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest

REPO = Path(__file__).resolve().parents[1]
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
                  distributed_executor_backend="uni", generation_config="vllm")
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


def draft_acceptance(draft: Path, prompts: list[str]) -> list[float]:
    """vLLM's per-position acceptance rates of `draft` (K=4) for greedy runs
    of `prompts` against the bundled target."""
    from vllm_vspec.tools.engine_runs import read_spec_counters

    llm = make_llm(speculative_config={"method": "draft_model", "model": str(draft),
                                       "num_speculative_tokens": 4},
                   disable_log_stats=False)
    try:
        before = read_spec_counters(llm)
        greedy(llm, prompts)
        return (read_spec_counters(llm) - before).acceptance_per_position
    finally:
        close_llm(llm)


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


# ---------------------------------------------------------------- peer suites
PEER_RUN = pytest.StashKey["PeerRun"]()


class PeerRun:
    """One peer suite's command (a test marked `peer(command=[...])`),
    started when collection ends and waited for by its test, which runs
    last. The suites run their own pytest processes and read nothing this
    session writes, so they run beside the rest of the session at a lower
    priority (nice 10), on the CPU the session leaves idle (its tests mostly
    run one thread at a time: 0.8 core-seconds a second measured, unit tests
    and engine modules alike), instead of after it."""

    def __init__(self, command: list[str], timeout_s: float, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        """`env`: the environment to start from (this process's when None)."""
        import subprocess
        import tempfile
        import time

        # The inner pytest must not inherit this run's options (-k, -x, ...).
        env = {k: v for k, v in (os.environ if env is None else env).items()
               if not k.startswith("PYTEST_")}
        self.command, self.deadline = command, time.monotonic() + timeout_s
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        # Its own process group, so that a session ending early stops the
        # suite's pytest processes too; nice(1), not a preexec_fn, which is
        # unsafe in a process with threads (EarlyRun starts from one).
        self.proc = subprocess.Popen(["nice", "-n", "10", *command], env=env, stdout=self.out,
                                     stderr=self.err, cwd=cwd, start_new_session=True)

    def wait(self) -> tuple[int, str, str]:
        """(exit status, stdout, stderr); pytest.fail past the deadline."""
        import subprocess
        import time

        try:
            rc = self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{' '.join(self.command)}: still running at its deadline; stopped")
        texts = []
        for f in (self.out, self.err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
        return rc, texts[0], texts[1]

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def _peer_command(item) -> list[str] | None:
    mark = item.get_closest_marker("peer")
    return None if mark is None else mark.kwargs.get("command")


def _early_builder(node):
    mark = node.get_closest_marker("early")
    return None if mark is None else mark.kwargs["build"]


def pytest_collection_modifyitems(config, items) -> None:
    # The peer suites' tests last: they only wait for what ran meanwhile.
    # Before them the tests marked `early`, whose servers and commands then
    # have the rest of the session to start in.
    items.sort(key=lambda item: (_peer_command(item) is not None,
                                 _early_builder(item) is not None))


def pytest_collection_finish(session) -> None:
    if session.config.option.collectonly:
        return
    for item in session.items:
        if (command := _peer_command(item)) is not None:
            timeout_s = item.get_closest_marker("peer").kwargs["timeout_s"]
            item.stash[PEER_RUN] = PeerRun(command, timeout_s)
    builders = list(dict.fromkeys(b for item in session.items
                                  if (b := _early_builder(item)) is not None))
    if builders:
        # The session's TempPathFactory, what the tmp_path_factory fixture returns.
        session.config.stash[EARLY] = EarlyStarts(builders, session.config._tmp_path_factory)


def pytest_sessionfinish(session) -> None:
    for item in session.items:
        run = item.stash.get(PEER_RUN, None)
        if run is not None:
            run.stop()
    early = session.config.stash.get(EARLY, None)
    if early is not None:
        early.stop()


@pytest.fixture
def peer_run(request) -> tuple[int, str, str]:
    """The result of this test's peer suite (started at collection end)."""
    return request.node.stash[PEER_RUN].wait()


# ------------------------------------------------------- early starts
EARLY = pytest.StashKey["EarlyStarts"]()
# The session's environment when collection ended: what starts early starts
# with it, whatever a module running meanwhile sets (test_ngram_engine's
# engines run with VLLM_ENABLE_V1_MULTIPROCESSING=1).
_START_ENV: dict[str, str] = {}


def early_server(argv: list[str], port: int, log_path: Path, *,
                 env: dict[str, str] | None = None, startup_timeout_s: float = 600.0):
    """A bench.server.Server for an `early` builder: this session's
    environment at collection end plus `env`, at nice 10."""
    from vllm_vspec.bench.server import Server

    return Server(argv, port, log_path, startup_timeout_s=startup_timeout_s,
                  env={**_START_ENV, **(env or {})}, nice=10)


class EarlyRun:
    """A command for an `early` builder, run to its end as a peer suite is
    (PeerRun: its own process group, nice 10, a deadline) in this session's
    environment at collection end: `returncode`, `stdout`, `stderr` and
    `seconds` after. `outputs`: files it writes, for its test to read."""

    def __init__(self, command: list[str], timeout_s: float, *, cwd: Path | None = None,
                 outputs: dict[str, Path] | None = None):
        self.command, self.timeout_s, self.cwd = command, timeout_s, cwd
        self.outputs = outputs or {}
        self.run: PeerRun | None = None

    def __enter__(self) -> "EarlyRun":
        import time

        started = time.monotonic()
        self.run = PeerRun(self.command, self.timeout_s, env=_START_ENV, cwd=self.cwd)
        self.returncode, self.stdout, self.stderr = self.run.wait()
        self.seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()


class EarlyStarts:
    """What the tests marked `early(build=...)` wait for and that needs nothing
    of the session: vLLM servers to be healthy (`early_server`), commands to
    finish (`EarlyRun`), started when collection ends instead of in the
    tests. `build(tmp_path)` returns one module's or test's such objects,
    not yet started; one background thread builds and starts them in
    session order, the objects of one builder side by side, each builder's
    done before the next one's is built (so its free ports are chosen
    then). A server spends most of its start-up compiling, profiling and
    loading, at nice 10 on the CPU the session leaves idle (as the peer
    suites do); the early tests run last, before the peer suites', and take
    their objects, started, with `early(request)`. The session's end stops
    every one still running, one still starting included."""

    def __init__(self, builders: list, tmp_path_factory):
        import threading

        _START_ENV.update(os.environ)
        self.tmp_path_factory = tmp_path_factory
        self.done = {b: threading.Event() for b in builders}
        self.started: dict = {b: [] for b in builders}
        self.errors: dict = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._start_all, args=(builders,),
                                       name="early-starts", daemon=True)
        self.thread.start()

    def _start_all(self, builders: list) -> None:
        import threading

        for build in builders:
            try:
                if self.stopping:
                    raise RuntimeError("the session ended before this was started")
                module = build.__module__.rsplit(".", 1)[-1].removeprefix("test_")
                self.started[build] = build(self.tmp_path_factory.mktemp(
                    f"{module}-{build.__name__.strip('_')}"))
                errors: list[BaseException] = []

                def enter(obj) -> None:
                    try:
                        obj.__enter__()
                    except BaseException as e:  # noqa: BLE001 - handed to the test
                        errors.append(e)
                threads = [threading.Thread(target=enter, args=(o,)) for o in self.started[build]]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if errors:
                    raise errors[0]
            except BaseException as e:  # noqa: BLE001 - handed to the test
                self.errors[build] = e
                for obj in self.started[build]:
                    obj.stop()
            finally:
                self.done[build].set()

    def get(self, build) -> list:
        """`build`'s objects, started; raises what starting them raised."""
        self.done[build].wait()
        if build in self.errors:
            raise self.errors[build]
        return self.started[build]

    def stop(self) -> None:
        self.stopping = True
        for build, done in self.done.items():
            # One still starting: stop it until its start gives up (stop()
            # finds no process before Popen has returned).
            while not done.wait(0.5):
                for obj in self.started[build]:
                    obj.stop()
            for obj in self.started[build]:
                obj.stop()


def early(request) -> list:
    """The started objects of the requesting test's or module's `early(build=...)`
    marker, in the order `build` returned them."""
    build = _early_builder(request.node)
    if build is None:
        raise RuntimeError(f"{request.node.nodeid}: early() needs the marker "
                           f"pytest.mark.early(build=...)")
    starts = request.config.stash.get(EARLY, None)
    if starts is None or build not in starts.done:
        raise RuntimeError(f"{request.node.nodeid}: its early starts were not begun at "
                           f"collection end (conftest.pytest_collection_finish)")
    return starts.get(build)
