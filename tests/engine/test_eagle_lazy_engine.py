"""Lazy gamma 0 for EAGLE (models/tiny-eagle) and EAGLE-3
(models/tiny-eagle3) on a real engine (CPU, float32, greedy, vspec's worker).

Spec:
- A lazy gamma-0 step runs no head forward; the head catches up on the
  skipped positions from the target hidden states the step kept, so every
  step's drafts equal those of a `sync` engine, token for token, with gamma
  changing every step (cycle policy, gamma 0 included), on prefix-cache hits
  and across preemptions; outputs equal target-only decoding.
- With a retained budget too small for a step (`gamma0_retained_tokens`),
  those steps run sync and the drafts still equal sync's.

Each comparison runs the same requests on a sync and a lazy engine built
alike (a KV cache small enough to preempt, prefix caching on, 32-token
blocks: vLLM caches whole blocks, and the CPU default of 128 would leave
these prompts few hits).
"""

from __future__ import annotations

import pytest

from conftest import (EAGLE, MODELS, assert_same_tokens, close_llm, counter, greedy, make_llm,
                      record_drafter_calls, runner_of)

pytestmark = pytest.mark.engine

K = 4
SPECS = {
    "eagle": {"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": K},
    "eagle3": {"method": "eagle3", "model": str(MODELS / "tiny-eagle3"),
               "num_speculative_tokens": K},
}
CYCLE = {"policy": "cycle", "min_gamma": 0}
ENGINE = dict(enable_prefix_caching=True, block_size=32, kv_cache_memory_bytes=5 << 20,
              max_model_len=256, disable_log_stats=False)


def _engine(method: str, mode: str, **vspec):
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    llm = make_llm(speculative_config=SPECS[method], worker_cls=CPU_WORKER_CLS,
                   vspec={**CYCLE, "gamma0_mode": mode, **vspec}, **ENGINE)
    return llm, _record(llm)


def _record(llm) -> list:
    """Per drafter call: (gamma asked, the drafts by batch row, head forwards)."""
    return record_drafter_calls(llm, lambda out, drafts, runner: (
        out.num_spec_tokens_to_schedule, drafts.tolist()))


def _assert_same_drafts(lazy: list, sync: list, label: str) -> None:
    """Fail at the first step whose drafts differ, naming the rows."""
    assert len(lazy) == len(sync), f"{label}: {len(lazy)} drafter calls, sync {len(sync)}"
    for step, ((g, got, _), (g_sync, want, _)) in enumerate(zip(lazy, sync)):
        assert g == g_sync, f"{label}: step {step} asked gamma {g}, sync {g_sync}"
        rows = [f"  row {r}: lazy {a} sync {b}" for r, (a, b) in enumerate(zip(got, want)) if a != b]
        assert got == want, f"{label}: step {step} (gamma {g}) drafts differ\n" + "\n".join(rows)


def _twice(llm, prompts):
    """The prompts (a batch the KV cache preempts), then the first four
    twice (the second time from the prefix cache): outputs, prefix-cache
    hits and preemptions of the runs."""
    hits, preempted = counter(llm, "vllm:prefix_cache_hits"), counter(llm, "vllm:num_preemptions")
    outs = greedy(llm, prompts) + greedy(llm, prompts[:4]) + greedy(llm, prompts[:4])
    return (outs, counter(llm, "vllm:prefix_cache_hits") - hits,
            counter(llm, "vllm:num_preemptions") - preempted)


@pytest.fixture(scope="module", params=list(SPECS))
def sync_run(request, prompts):
    llm, log = _engine(request.param, "sync")
    try:
        outs = _twice(llm, prompts)
    finally:
        close_llm(llm)
    return request.param, outs, log


@pytest.mark.parametrize("budget", [None, 24], ids=["default-budget", "budget-24"])
def test_lazy_drafts_equal_sync_on_cache_hits_and_across_preemptions(sync_run, budget, prompts,
                                                                     reference):
    method, (sync_outs, _, _), sync_log = sync_run
    if budget is not None and method != "eagle":
        pytest.skip("the budget path is the method's own: one method runs it")
    vspec = {} if budget is None else {"gamma0_retained_tokens": budget}
    llm, log = _engine(method, "lazy", **vspec)
    try:
        head_lag = runner_of(llm).lag
        assert head_lag is not None and head_lag.aux == (method == "eagle3")
        outs, hits, preempted = _twice(llm, prompts)
    finally:
        close_llm(llm)
    label = f"{method} lazy ({vspec or 'default budget'})"
    assert_same_tokens(outs, reference + reference[:4] + reference[:4], label)
    assert outs == sync_outs
    assert hits > 0, "no prefix-cache hit happened"
    assert preempted > 0, "the tiny KV cache caused no preemption"
    _assert_same_drafts(log, sync_log, label)
    assert {g for g, _, _ in log} == set(range(K + 1)), "the cycle did not reach every gamma"
    gamma0 = [forwards for g, _, forwards in log if g == 0]
    # A gamma-0 step runs no head forward, unless its tokens did not fit
    # (then it ran sync, after catching its requests up).
    assert sum(map(bool, gamma0)) == head_lag.forced_sync, f"{label}: gamma-0 forwards {gamma0}"
    assert (head_lag.forced_sync > 0) == (budget is not None), head_lag.forced_sync
    assert len(head_lag.store) <= head_lag.store.capacity
