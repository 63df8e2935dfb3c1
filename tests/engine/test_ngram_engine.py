"""n-gram drafting (`method: ngram`, no draft model) under vspec on a real engine.

Spec: with gamma changing every step (cycle policy, gamma 0 included),
greedy float32 outputs are token-identical to target-only decoding, on
prefix-cache hits and across preemptions, on vspec's worker (gamma0_mode
`auto` -> `lazy`: a gamma-0 step runs no n-gram search) and on vLLM's own
worker (`sync`: the search still runs, asked for 0 tokens). Per request per
step the n-gram proposer drafts at most the gamma the scheduler asked for
(counted in the worker from the SchedulerOutput each step, before the
scheduler trims anything).

vLLM's ngram proposer imports numba, whose llvmlite `lib` proxy answers any
attribute; vLLM's CPU kernel-override scan of sys.modules then crashes every
later in-process engine. So these engines run in their own process
(VLLM_ENABLE_V1_MULTIPROCESSING=1) and the test process never imports
numba; the per-step counts come back through collective_rpc. One engine per
worker, shared by the module's tests (a KV cache small enough to preempt,
prefix caching on).
"""

from __future__ import annotations

import pytest

from conftest import assert_same_tokens, close_llm, counter, greedy, make_llm

pytestmark = pytest.mark.engine

NGRAM = {"method": "ngram", "num_speculative_tokens": 4,
         "prompt_lookup_min": 2, "prompt_lookup_max": 4}
CYCLE = {"policy": "cycle", "min_gamma": 0}


def _record_drafts(wrapper) -> None:
    """Runs in the engine process: log, per step, the gamma the scheduler
    asked for, each request's draft length, and whether the n-gram search ran."""
    runner = getattr(wrapper, "worker", wrapper).model_runner
    log = runner.ngram_test_log = []
    propose, search = runner.propose_draft_token_ids, runner.drafter.propose
    searched = []

    def counted_search(*args, **kwargs):
        searched.append(1)
        return search(*args, **kwargs)

    def counted_propose(scheduler_output, *args, **kwargs):
        searched.clear()
        drafts = propose(scheduler_output, *args, **kwargs)
        lengths = [len(d) for d in drafts] if isinstance(drafts, list) else \
            [int(drafts.shape[-1])] * int(drafts.shape[0])
        log.append((scheduler_output.num_spec_tokens_to_schedule, lengths, bool(searched)))
        return drafts

    runner.propose_draft_token_ids, runner.drafter.propose = counted_propose, counted_search


def _take_log(wrapper) -> list:
    runner = getattr(wrapper, "worker", wrapper).model_runner
    log, runner.ngram_test_log[:] = list(runner.ngram_test_log), []
    return log


@pytest.fixture(scope="module", params=["vspec-worker", "vllm-worker"])
def ngram_llm(request, reference, monkeypatch_module):
    import vllm.envs

    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    vllm.envs.disable_envs_cache()
    monkeypatch_module.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch_module.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the callables above
    worker = {"worker_cls": CPU_WORKER_CLS} if request.param == "vspec-worker" else {}
    llm = make_llm(speculative_config=NGRAM, vspec=CYCLE, **worker,
                   enable_prefix_caching=True, kv_cache_memory_bytes=5 << 20,
                   max_model_len=256, disable_log_stats=False)
    llm.collective_rpc(_record_drafts)
    yield request.param, llm
    close_llm(llm)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _steps(llm) -> list:
    return llm.collective_rpc(_take_log)[0]


def test_exact_on_prefix_cache_hits_and_drafts_at_most_the_asked_gamma(ngram_llm, prompts,
                                                                       reference):
    worker, llm = ngram_llm
    _steps(llm)
    assert_same_tokens(greedy(llm, prompts[:4]), reference[:4], f"ngram cycle, {worker}")
    hits = counter(llm, "vllm:prefix_cache_hits")
    assert_same_tokens(greedy(llm, prompts[:4]), reference[:4],
                       f"ngram cycle, prefix-cached prompts, {worker}")
    assert counter(llm, "vllm:prefix_cache_hits") > hits, "no prefix-cache hit happened"
    steps = _steps(llm)
    assert {g for g, _, _ in steps} == {0, 1, 2, 3, 4}, f"cycle gammas: {steps}"
    for asked, lengths, _ in steps:
        assert all(n <= asked for n in lengths), f"drafted more than asked ({asked}): {lengths}"
    assert sum(n for _, lengths, _ in steps for n in lengths) > 0, "ngram never drafted"
    assert any(n == g > 0 for g, lengths, _ in steps for n in lengths), \
        f"no request ever drafted the full gamma asked: {steps}"
    zero = [searched for g, _, searched in steps if g == 0]
    if worker == "vspec-worker":   # lazy: a gamma-0 step is a target-only step
        assert zero and not any(zero), "a gamma-0 step ran the n-gram search"
    else:                          # sync: the host searches for 0 tokens
        assert zero and all(zero)


def test_exact_across_preemptions(ngram_llm, prompts, reference):
    worker, llm = ngram_llm
    before = counter(llm, "vllm:num_preemptions")
    assert_same_tokens(greedy(llm, prompts), reference, f"ngram cycle, batch 16, {worker}")
    assert counter(llm, "vllm:num_preemptions") > before, "the tiny KV cache caused no preemption"
    steps = _steps(llm)
    assert all(n <= g for g, lengths, _ in steps for n in lengths)
