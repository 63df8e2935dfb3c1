"""EAGLE-3 (`method: eagle3`, models/tiny-eagle3) and MTP (`method: mtp`,
models/tiny-mimo) under vspec on a real engine (CPU, float32, greedy).

Spec:
- With gamma changing every step (cycle policy, gamma 0 included), greedy
  outputs are token-identical to target-only decoding, on prefix-cache hits
  and across preemptions.
- Each step the proposer drafts exactly the gamma the scheduler asked for,
  for every request of the batch (counted in the runner, from the step's
  SchedulerOutput, before the scheduler trims anything).
- Gamma 0 (gamma0_mode auto) is `sync` for mtp: the drafter's first pass
  still runs over the step's tokens, so a step runs max(1, gamma) drafter
  forwards; for eagle3 it is `lazy`: a gamma-0 step runs none (it keeps the
  target's hidden states) and a drafting step runs gamma forwards plus its
  catch-up passes (tests/engine/test_eagle_lazy_engine.py compares its drafts with
  sync's). Counted.
- The MiMo-style checkpoint's target-only decoding is the bundled target's
  (its model.safetensors is the target's; vLLM runs it as MiMoForCausalLM).

One engine per method on vspec's worker, shared by the module's tests (a KV
cache small enough to preempt, prefix caching on, 32-token blocks).
"""

from __future__ import annotations

import pytest

from conftest import (MODELS, TARGET, assert_same_tokens, close_llm, counter, greedy, make_llm,
                      record_drafter_calls)

pytestmark = pytest.mark.engine

K = 4
EAGLE3 = MODELS / "tiny-eagle3"
MIMO = MODELS / "tiny-mimo"
SPECS = {
    "eagle3": (None, {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": K}),
    "mtp": (MIMO, {"method": "mtp", "num_speculative_tokens": K}),
}
CYCLE = {"policy": "cycle", "min_gamma": 0}


def _record(llm) -> list:
    """Log, per drafter call: (gamma asked, drafts' shape, requests in the
    batch, drafter forwards during the call)."""
    return record_drafter_calls(llm, lambda out, drafts, runner: (
        out.num_spec_tokens_to_schedule, tuple(drafts.shape), runner.input_batch.num_reqs))


@pytest.fixture(scope="module", params=list(SPECS))
def method_llm(request, reference, prompts):
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    target, spec = SPECS[request.param]
    mimo_target_only = None
    if target is not None:   # the checkpoint's own target-only run, before the engine under test
        plain = make_llm(target, max_model_len=256)
        try:
            mimo_target_only = greedy(plain, prompts)
        finally:
            close_llm(plain)
    llm = make_llm(target or TARGET, speculative_config=spec, vspec=CYCLE, worker_cls=CPU_WORKER_CLS,
                   # block 32: hits are whole blocks (the CPU default is 128), and
                   # for mtp vLLM drops the last one, so its prompts need two
                   # (vspec keeps it for eagle3: hosts/vllm/prefix_tail.py)
                   enable_prefix_caching=True, block_size=32, kv_cache_memory_bytes=5 << 20,
                   max_model_len=256,
                   disable_log_stats=False)
    log = _record(llm)
    yield request.param, llm, log, mimo_target_only
    close_llm(llm)


def test_exact_on_prefix_cache_hits_and_drafts_exactly_the_asked_gamma(method_llm, prompts,
                                                                       reference):
    method, llm, log, _ = method_llm
    log.clear()
    assert_same_tokens(greedy(llm, prompts[:4]), reference[:4], f"{method} cycle")
    hits = counter(llm, "vllm:prefix_cache_hits")
    assert_same_tokens(greedy(llm, prompts[:4]), reference[:4],
                       f"{method} cycle, prefix-cached prompts")
    assert counter(llm, "vllm:prefix_cache_hits") > hits, "no prefix-cache hit happened"
    assert {asked for asked, _, _, _ in log} == set(range(K + 1)), f"cycle gammas: {log}"
    for asked, shape, reqs, forwards in log:
        assert shape == (reqs, asked), f"{method}: asked {asked} for {reqs} requests, drafted {shape}"
        if method == "mtp":  # sync gamma 0: the first pass runs at every step, then gamma - 1
            assert forwards == max(1, asked), f"{method}: {forwards} forwards at gamma {asked}"
        else:  # lazy: none at gamma 0; gamma plus any catch-up passes
            assert forwards >= asked and (forwards == 0) == (asked == 0), \
                f"{method}: {forwards} drafter forwards at gamma {asked}"


def test_exact_across_preemptions(method_llm, prompts, reference):
    method, llm, log, _ = method_llm
    before = counter(llm, "vllm:num_preemptions")
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    assert_same_tokens(greedy(llm, prompts), reference, f"{method} cycle, batch 16")
    assert counter(llm, "vllm:num_preemptions") > before, "the tiny KV cache caused no preemption"
    assert counter(llm, "vllm:spec_decode_num_accepted_tokens") > accepted, "nothing accepted"
    assert all(shape[-1] == asked for asked, shape, _, _ in log)


def test_the_mimo_checkpoint_decodes_as_the_bundled_target(method_llm, reference):
    method, _, _, mimo_target_only = method_llm
    if method != "mtp":
        pytest.skip("the MiMo-style checkpoint is the mtp engine's target")
    assert_same_tokens(mimo_target_only, reference, "tiny-mimo target-only")
