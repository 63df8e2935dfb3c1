"""Which decode steps replay the target's FULL decode graph, through the host's
own code on both pins (nothing here runs on an NPU).

What is the host's own code, read at test time from the pinned sources
(hash-checked), never copied:
- vLLM-Ascend's NPUModelRunner._determine_batch_execution_and_padding
  (worker/model_runner_v1.py of the 0.23.0.post1 and 0.30.0rc2 sdists, taken
  out by name): the uniform-decode test and the dispatch of a step;
- vLLM's CudagraphDispatcher (v1/cudagraph_dispatcher.py of the vLLM each pin
  runs on, 0.23.0 and 0.30.0, from the pin's vLLM source wheel), keys
  initialised as NPUModelRunner._check_and_update_cudagraph_mode does it for
  FULL decode graphs at width 1 + K.
Stand-ins: the runner fields the method reads (an all-decode input batch, no
LoRA, DP 1, no sequence parallelism, no metrics).

What it shows: a step whose requests each schedule 1 + K tokens replays the
FULL graph; a step at gamma < K (1 + gamma tokens a request) fails the
uniform test and runs without it, on both pins. That is why the 0.23 default
pads the verify width inside the capture range (vspec's scheduler schedules
pad_drafts' K columns) and why vspec, which verifies 1 + gamma on 0.30, is
off by default there. A graph per verify width is built for 0.23, off by
default (`ascend_verify_width_graphs`; tests/ascend/test_width_graphs.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_ascend_graphs import host_batch_padding, host_dispatcher, pinned_vllm_module, sdist_file

PINS = ("0.23.0.post1", "0.30.0rc2")
K = 4
MAX_NUM_SEQS = 8
CAPTURE_SIZES = (5, 10, 20, 40)   # multiples of 1 + K, as vLLM rounds them for spec decode
REQUESTS = 4


@pytest.fixture(scope="module", params=PINS)
def host(request, tmp_path_factory):
    """(pin, the host's _determine_batch_execution_and_padding, its vLLM's dispatcher)."""
    version = request.param
    path = sdist_file(version, "vllm_ascend/worker/model_runner_v1.py", tmp_path_factory)
    dispatcher_cls = pinned_vllm_module(version,
                                        "vllm/v1/cudagraph_dispatcher.py").CudagraphDispatcher
    return SimpleNamespace(version=version, method=host_batch_padding(path),
                           dispatcher=host_dispatcher(dispatcher_cls, K, MAX_NUM_SEQS,
                                                      CAPTURE_SIZES))


def _runner(dispatcher) -> SimpleNamespace:
    """The NPUModelRunner fields the method reads, for an all-decode batch."""
    return SimpleNamespace(
        cudagraph_dispatcher=dispatcher, uniform_decode_query_len=1 + K,
        speculative_config=SimpleNamespace(num_speculative_tokens=K), use_dcp=False,
        model_config=SimpleNamespace(is_encoder_decoder=False, is_hybrid=False),
        input_batch=SimpleNamespace(num_computed_tokens_cpu=np.full(MAX_NUM_SEQS, 100),
                                    num_prompt_tokens=np.full(MAX_NUM_SEQS, 10),
                                    lora_id_to_lora_request={}),
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=1),
                                    observability_config=SimpleNamespace(
                                        cudagraph_metrics=False)),
        _pad_for_sequence_parallelism=lambda num_tokens: num_tokens)


def _dispatch(host, tokens_per_request: int):
    """(mode, descriptor) of a decode step of REQUESTS requests each
    scheduling `tokens_per_request` tokens."""
    scheduled = np.full(REQUESTS, tokens_per_request)
    mode, descriptor, *_ = host.method(
        _runner(host.dispatcher), num_tokens=int(scheduled.sum()), num_reqs=REQUESTS,
        num_scheduled_tokens_np=scheduled, max_num_scheduled_tokens=tokens_per_request,
        use_cascade_attn=False)
    return mode, descriptor


def test_a_step_verifying_k_drafts_a_request_replays_the_full_decode_graph(host):
    from vllm.config import CUDAGraphMode

    mode, descriptor = _dispatch(host, 1 + K)
    assert mode == CUDAGraphMode.FULL, host.version
    assert (descriptor.num_tokens, descriptor.num_reqs, descriptor.uniform) == \
        (REQUESTS * (1 + K), REQUESTS, True)


@pytest.mark.parametrize("gamma", range(K))
def test_a_step_below_k_fails_the_uniform_test_and_runs_without_the_full_graph(host, gamma):
    from vllm.config import CUDAGraphMode

    mode, descriptor = _dispatch(host, 1 + gamma)
    assert mode != CUDAGraphMode.FULL and not descriptor.uniform, (host.version, gamma)


@pytest.mark.parametrize("gamma", range(K))
def test_vspecs_padded_verify_width_turns_a_step_below_k_into_the_full_graph_step(host, gamma):
    """The 0.23 default: the scheduler keeps pad_drafts' K columns (gamma
    drafts, then invalid ones) for a step inside the capture range, so every
    request schedules 1 + K tokens and the host's uniform test passes."""
    from vllm.config import CUDAGraphMode

    from vllm_vspec.hosts.vllm.verify_width import pad_drafts

    columns = pad_drafts(torch.zeros(REQUESTS, max(gamma, 1), dtype=torch.long), gamma, K)
    assert columns.shape[1] == K
    mode, descriptor = _dispatch(host, 1 + columns.shape[1])
    assert mode == CUDAGraphMode.FULL and descriptor.num_reqs == REQUESTS, host.version
