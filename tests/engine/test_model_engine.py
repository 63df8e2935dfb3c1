"""The `model` policy inside the real engine: whatever it chooses (its
cold-start sweep and Thompson draws change gamma from step to step, gamma 0
included), greedy outputs are token-identical to target-only, for the
draft model (vspec's worker: lazy gamma 0) and EAGLE, at batch 16 and 1,
with prefix-cache hits and across preemptions (one engine per method: its
KV cache is small enough to preempt)."""

from __future__ import annotations

import pytest

from conftest import (DRAFT, EAGLE, assert_same_tokens, close_llm, counter, greedy, make_llm,
                      scheduler_of)

pytestmark = pytest.mark.engine

MODEL = {"policy": "model", "min_gamma": 0}
SPECS = {"draft_model": {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4},
         "eagle": {"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": 4}}


@pytest.fixture(scope="module", params=list(SPECS))
def engine(request):
    """A KV cache the batch of 16 overflows (preemptions), prefix caching on
    with 32-token blocks (hits are whole blocks)."""
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    llm = make_llm(speculative_config=SPECS[request.param], vspec=MODEL,
                   worker_cls=CPU_WORKER_CLS, enable_prefix_caching=True, block_size=32,
                   kv_cache_memory_bytes=5 << 20, max_model_len=256, disable_log_stats=False)
    yield llm
    close_llm(llm)


def test_exact_at_batch_16_across_preemptions_and_at_batch_1_on_prefix_cache_hits(
        engine, prompts, reference):
    preempted = counter(engine, "vllm:num_preemptions")
    assert_same_tokens(greedy(engine, prompts), reference, "model policy, batch 16")
    assert counter(engine, "vllm:num_preemptions") > preempted, \
        "the tiny KV cache caused no preemption"
    hits = counter(engine, "vllm:prefix_cache_hits")
    got = [greedy(engine, [p])[0] for p in prompts[:2] for _ in range(2)]  # the second from the cache
    assert_same_tokens(got, [r for r in reference[:2] for _ in range(2)],
                       "model policy, batch 1, prefix-cached prompts")
    assert counter(engine, "vllm:prefix_cache_hits") > hits, "no prefix-cache hit happened"


def test_the_policy_chose_more_than_one_gamma(engine, prompts):
    greedy(engine, prompts[:2])
    steps = scheduler_of(engine).vspec.summary()["steps"]
    assert len([a for a, n in steps.items() if n]) > 1, steps


def test_prefill_steps_reach_the_cost_model_with_their_prompt_tokens(engine, prompts):
    # Every step teaches the cost model: the decided decode steps and the
    # prefill steps the scheduler hands on (observe_cost), whose prompt
    # tokens the model counts against the tokens committed.
    policy = scheduler_of(engine).vspec.policy
    samples, prompt_tokens = policy.cost.samples + policy.cost.skipped, policy.prompt_tokens
    decided = sum(scheduler_of(engine).vspec.summary()["steps"].values())
    greedy(engine, prompts[:4])
    decided = sum(scheduler_of(engine).vspec.summary()["steps"].values()) - decided
    assert policy.cost.samples + policy.cost.skipped - samples > decided
    assert policy.prompt_tokens > prompt_tokens


def test_each_decided_step_tells_the_policy_its_requests_and_the_tokens_they_have_left(
        engine, prompts):
    # The drain objective (core/drain.py) reads them: a request's tokens
    # left are its max_tokens less those it generated, never below 0.
    policy = scheduler_of(engine).vspec.policy
    seen = []
    decide = policy.decide

    def spy(batch, *args):
        seen.append((batch.requests, batch.remaining))
        return decide(batch, *args)

    policy.decide = spy
    try:
        greedy(engine, prompts[:3], max_tokens=24)
    finally:
        del policy.decide
    assert seen
    assert all(len(ids) == len(left) and all(0 <= r < 24 for r in left) for ids, left in seen)
    # A request's tokens left fall by what its steps committed.
    first = {}
    for ids, left in seen:
        for i, r in zip(ids, left):
            first.setdefault(i, []).append(r)
    assert all(rs == sorted(rs, reverse=True) and rs[0] > rs[-1] for rs in first.values())
