"""VSpecScheduler keeps vLLM's spec-decode statistics true to what each step
verified while gamma changes between steps or is 0.

Real vLLM 0.32 objects (VllmConfig on the bundled tiny target, KV cache
manager, Scheduler and its stats), no engine: a stand-in runner plays the
runner's part. vLLM 0.32's runner drafts `num_spec_tokens_to_schedule`
tokens after a step; vLLM 0.23's NPU runner hands back K (gamma drafts, then
-1), and 0.32's `custom_class` proposers are not told the step's count. The
scheduler verifies at most the gamma the step asked for
(VSpecScheduler.update_draft_token_ids), and vLLM's per-step records
(per_step_drafted/per_step_accepted, the histogram, the aggregate
SpecDecodingStats) must then say what each step verified.

vLLM's own tests of these records (tests/v1/core/test_scheduler.py, run by
the peer suite) hand the scheduler K drafts after every step, whatever it
asked for; under gamma 0 they differ for that reason (tests/peer/suite.toml).
"""

from __future__ import annotations

import pytest

from conftest import TARGET

K = 3


def _scheduler(vspec: dict):
    import torch
    from vllm.config import (CacheConfig, ModelConfig, ObservabilityConfig, SchedulerConfig,
                             SpeculativeConfig, VllmConfig)
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_vspec.hosts.vllm.scheduler import VSpecScheduler

    model = ModelConfig(model=str(TARGET), dtype="float32", seed=0, max_model_len=512)
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512,
                                         max_model_len=512, watermark=0.0,
                                         is_encoder_decoder=model.is_encoder_decoder),
        cache_config=CacheConfig(block_size=16, gpu_memory_utilization=0.9,
                                 enable_prefix_caching=False),
        speculative_config=SpeculativeConfig(model="ngram", num_speculative_tokens=K),
        observability_config=ObservabilityConfig(per_request_spec_decode_metrics="detailed"),
        additional_config={"vspec": vspec})
    config.cache_config.num_gpu_blocks = 256
    register_all_kvcache_specs(config)
    kv = KVCacheConfig(num_blocks=256, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1,
                                     dtype=torch.float32))])
    return VSpecScheduler(vllm_config=config, kv_cache_config=kv, block_size=16, log_stats=True,
                          structured_output_manager=StructuredOutputManager(config))


def _request(req_id: str):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=64, ignore_eos=True)
    params.update_from_generation_config({}, 2)
    return Request(request_id=req_id, prompt_token_ids=[7] * 5, sampling_params=params,
                   pooling_params=None)


def _run(scheduler, accept: list[int], drafts_per_step=None):
    """Prefill, then one step per entry of `accept` for one request: the
    runner accepts that many of the drafts the step verifies (at most all of
    them) and hands back `drafts_per_step(asked)` new drafts (default: what
    the step asked for). Returns, per step, (gamma the step asked the runner
    to draft, drafts it verified, drafts accepted), and the step's stats."""
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    request = _request("r")
    scheduler.add_request(request)
    steps, stats = [], []
    for i in range(len(accept) + 1):
        out = scheduler.schedule()
        spec = out.scheduled_spec_decode_tokens.get("r", [])
        assert out.num_scheduled_tokens["r"] == (5 if i == 0 else 1 + len(spec))
        n_acc = min(accept[i - 1], len(spec)) if i else 0
        sampled = [100 + i] * (n_acc + 1)       # accepted drafts + the bonus/recovered one
        result = scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=["r"], req_id_to_index={"r": 0}, sampled_token_ids=[sampled],
            logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        asked = out.num_spec_tokens_to_schedule
        n_new = asked if drafts_per_step is None else drafts_per_step(asked)
        scheduler.update_draft_token_ids(DraftTokenIds(["r"], [[9] * n_new]))
        steps.append((asked, len(spec), n_acc))
        engine_out = result.get(0)
        stats.append(engine_out.scheduler_stats.spec_decoding_stats
                     if engine_out and engine_out.scheduler_stats else None)
    return request, steps, stats


@pytest.mark.parametrize("vspec, gammas", [
    ({"policy": "cycle", "min_gamma": 0}, [3, 0, 2, 1, 3, 0, 2]),
    ({"policy": "fixed", "min_gamma": 0, "fixed_gamma": 0}, [0] * 7),
    ({"policy": "fixed", "fixed_gamma": 2}, [2] * 7),
])
@pytest.mark.parametrize("runner_drafts", ["asked", "always K"])
def test_per_step_records_count_what_each_step_verified(vspec, gammas, runner_drafts):
    scheduler = _scheduler(vspec)
    accept = [3, 1, 0, 2, 3, 1, 0]
    request, steps, stats = _run(scheduler, accept,
                                 None if runner_drafts == "asked" else lambda asked: K)
    asked = [s[0] for s in steps]
    # The prefill step keeps the gamma in force: before any decision, the
    # policy's opening arm (fixed: its own gamma; cycle starts at K); the
    # decode steps ask for the policy's gammas.
    opening = vspec["fixed_gamma"] if vspec["policy"] == "fixed" else K
    assert asked == [opening] + gammas
    # Each step verifies what the step before it asked the runner to draft,
    # never more (a runner handing back K drafts after a gamma-g step).
    verified = [s[1] for s in steps[1:]]
    assert verified == asked[:-1]
    accepted = [s[2] for s in steps[1:]]
    assert any(v == 0 for v in verified) == (0 in gammas[:-1])
    payload = request.spec_decode_metrics.to_dict()
    # vLLM records only the steps that verified a draft (the step after a
    # gamma-0 step verifies none), in order.
    recorded = [(v, a) for v, a in zip(verified, accepted) if v]
    assert payload.get("per_step_drafted", []) == [v for v, _ in recorded]
    assert payload.get("per_step_accepted", []) == [a for _, a in recorded]
    assert payload["num_spec_steps"] == len(recorded)
    assert payload["num_draft_tokens"] == sum(verified)
    assert payload["num_accepted_draft_tokens"] == sum(accepted)
    assert payload["acceptance_histogram"] == [sum(a == j for _, a in recorded)
                                               for j in range(K + 1)]
    # The aggregate per-step SpecDecodingStats (what the engine logs/exports).
    for v, a, st in zip(verified, accepted, stats[1:]):
        if v == 0:
            assert st is None
        else:
            assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens) == (1, v, a)
            assert st.num_accepted_tokens_per_pos == [1] * a + [0] * (K - a)
