"""vspec's executor on vLLM-CPU (hosts/vllm/executor.py, issue 29): a step
scheduled at gamma 0 costs no draft round trip to the worker process, any
other step asks as stock vLLM does. The worker process itself is replaced by
a recording stand-in (what crosses the executor's queues is the host's
business; the served tests, tests/engine/test_serving_faults.py, run the real one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_vspec.hosts import wiring


@pytest.fixture
def executor():
    from vllm_vspec.hosts.vllm.executor import VSpecMultiprocExecutor

    ex = VSpecMultiprocExecutor.__new__(VSpecMultiprocExecutor)   # no worker processes
    ex.calls = []
    ex.output_rank, ex.kv_output_aggregator, ex.ec_output_aggregator = 0, None, None

    def collective_rpc(method, *args, **kwargs):
        ex.calls.append(method)
        return f"{method} answer"

    ex.collective_rpc = collective_rpc
    return ex


@pytest.mark.parametrize("gamma, asks", [(0, False), (1, True), (4, True), (None, True)])
def test_the_worker_is_asked_for_drafts_unless_the_step_drafted_nothing(executor, gamma, asks):
    step = SimpleNamespace() if gamma is None else SimpleNamespace(num_spec_tokens_to_schedule=gamma)
    assert executor.execute_model(step) == "execute_model answer"
    got = executor.take_draft_token_ids()
    assert executor.calls == (["execute_model", "take_draft_token_ids"] if asks
                              else ["execute_model"])
    assert got == ("take_draft_token_ids answer" if asks else None)


def test_each_step_decides_for_itself(executor):
    for gamma in (0, 3, 0):
        executor.execute_model(SimpleNamespace(num_spec_tokens_to_schedule=gamma))
        executor.take_draft_token_ids()
    assert executor.calls.count("take_draft_token_ids") == 1


def test_vspec_engines_on_cpu_select_it_when_the_engine_core_has_its_own_process(monkeypatch):
    spec = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    args = wiring.engine_args(spec, {}, platform="cpu")
    assert args["distributed_executor_backend"] == wiring.EXECUTOR_CLS["cpu"]
    assert "--distributed-executor-backend" in wiring.serve_argv(args)
    # In-process engines keep the host's `uni` executor (no worker process).
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert "distributed_executor_backend" not in wiring.engine_args(spec, {}, platform="cpu")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    # Stock engines, and other platforms, keep the host's own choice.
    assert "distributed_executor_backend" not in wiring.engine_args(spec, None, platform="cpu")
    assert "distributed_executor_backend" not in wiring.engine_args(spec, {}, platform="cuda")
