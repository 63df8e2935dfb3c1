"""The NPU proposers' graph mode and commit op, over test_overlay's stand-in
host (vLLM-Ascend needs torch_npu; nothing here runs on an NPU).

Spec: under dynamic gamma the draft model keeps its full graphs, one
wrapper per gamma, unless `ascend_draft_full_graph = false` (the host's own
`use_cuda_graph` switch; tests/ascend/test_ascend_graphs.py drives the host's own
capture and replay code); the NPU sampler counts generated tokens from the
runner's batch; the commit of a verification step comes
from torch.ops.vspec.commit_accepted and equals vLLM-Ascend 0.23's own
computation. The proposer tests check vspec's StepGammaProposer over a stand-in host
written for these tests (test_overlay's _HostProposer), not the host.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TokenBuffer as _Buffer
from test_overlay import _make, _step, _Wrapper, proposers  # noqa: F401 (fixture)

VOCAB = 30


def test_draft_graphs_are_kept_under_dynamic_gamma_by_default(proposers):
    proposer = _make(proposers, k=3, full_graphs=True, vspec={})
    assert proposer.use_cuda_graph is True
    assert isinstance(proposer._runnable, _Wrapper) and sorted(proposer._vspec_runnables) == [1, 2]


def test_eager_drafts_are_opt_in(proposers, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm_ascend.utils", SimpleNamespace(enable_sp=lambda c: False))
    monkeypatch.setitem(sys.modules, "vllm_ascend.spec_decode.llm_base_proposer",
                        SimpleNamespace(_maybe_eager_context=None))
    proposer = _make(proposers, k=3, full_graphs=True, vspec={"ascend_draft_full_graph": False})
    assert proposer.use_cuda_graph is False
    assert not isinstance(proposer._runnable, _Wrapper) and proposer._vspec_runnables == {}
    assert proposer._propose(**_step(gamma=2)).tolist() == [[0, 1, -1]] * 2


def _host_commit(sampled, backup, discard_indices, num_discarded, vocab_size):
    """vLLM-Ascend 0.23.0.post1's AscendSpecDecodeBaseProposer
    .prepare_next_token_ids_padded after its backup tokens, restated."""
    ids = sampled.clone()
    ids[discard_indices[:num_discarded].long()] = -1
    count = ((ids != -1) & (ids < vocab_size)).sum(dim=1)
    last = torch.clamp(count - 1, min=0)
    chosen = torch.gather(ids, 1, last.unsqueeze(1)).squeeze(1)
    return torch.where(count - 1 != -1, chosen, backup[:ids.shape[0]]), count


# `proposers` is only the imported module; each example builds its own proposer.
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 6), width=st.integers(1, 5), data=st.data())
def test_the_commit_op_gives_what_the_hosts_computation_gives(proposers, batch, width, data):
    rows = []
    for _ in range(batch):
        n = data.draw(st.integers(0, width))
        rows.append(data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
                    + [-1] * (width - n))
    histories = [data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4))
                 for _ in range(batch)]
    discarded = data.draw(st.lists(st.integers(0, batch - 1), unique=True, max_size=batch))
    ids = [f"r{i}" for i in range(batch)]
    requests = {r: SimpleNamespace(get_token_id=lambda i, h=h: h[i])
                for r, h in zip(ids, histories)}
    input_batch = SimpleNamespace(num_reqs=batch, req_ids=ids, vocab_size=VOCAB,
                                  num_tokens_no_spec=[len(h) for h in histories])
    indices = torch.tensor(discarded + [0] * 3, dtype=torch.int32)  # padded, as the host's buffer
    sampled = torch.tensor(rows, dtype=torch.int32)

    proposer = _make(proposers, k=width)
    proposer.backup_next_token_ids = _Buffer(8)
    next_token, count = proposer.prepare_next_token_ids_padded(
        sampled, requests, input_batch, indices, len(discarded))
    backup = torch.tensor([h[-1] for h in histories], dtype=torch.int32)
    want_next, want_count = _host_commit(sampled, backup, indices, len(discarded), VOCAB)
    assert next_token.tolist() == want_next.tolist()
    assert count.tolist() == want_count.tolist()


# ------------------------------------------------------------------------------
# The NPU sampler counts generated tokens from the runner's
# input batch, so a lossy rule relaxes past its strict prefix without penalties.
@pytest.fixture
def npu_sampler(monkeypatch):
    """vllm_ascend.vspec.sampler over a stand-in AscendRejectionSampler whose
    logits processors change nothing (what the host's do for greedy rows)."""
    import sys
    import types

    class AscendRejectionSampler:
        def __init__(self, sampler):
            self.sampler = sampler

        def apply_logits_processors(self, logits, sampling_metadata, metadata):
            return logits

    for name, attrs in {"vllm_ascend.sample": {},
                        "vllm_ascend.sample.rejection_sampler":
                            {"AscendRejectionSampler": AscendRejectionSampler}}.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.sampler", raising=False)
    import vllm_ascend.vspec.sampler as module

    yield module
    sys.modules.pop("vllm_ascend.vspec.sampler", None)


def _relaxed_rows(npu_sampler, runner, prompt_lens, generated):
    """Two greedy requests, one draft each (token 1, second best of its row),
    verified with relaxed_topk 2 after 16 tokens; no penalties, so vLLM hands
    the sampler no output ids. Which rows the rule promoted."""
    from vllm_ascend.vspec.routing import rejection_sampler_factory
    from test_overlay import _engine_config

    config = _engine_config("draft_model", 1, vspec={"acceptance": "relaxed_topk",
                                                     "relaxed_topk": 2,
                                                     "relaxed_after_tokens": 16})
    if runner is not None:
        runner.input_batch = SimpleNamespace(
            num_tokens_no_spec_cpu_tensor=torch.tensor([p + g for p, g in zip(prompt_lens, generated)]),
            num_prompt_tokens_cpu_tensor=torch.tensor(prompt_lens))
    sampler = rejection_sampler_factory(config, object, runner)(sampler=None)
    assert type(sampler).__name__ == "VSpecAscendRejectionSampler"
    logits = torch.tensor([[2.0, 1.0, 0.0]] * 2)
    meta = SimpleNamespace(num_draft_tokens=[1, 1], draft_token_ids=torch.tensor([1, 1]),
                           cu_num_draft_tokens=torch.tensor([1, 2]))
    sampling = SimpleNamespace(all_random=False, all_greedy=True, output_token_ids=[],
                               temperature=None)
    out = sampler.apply_logits_processors(logits, sampling, meta)
    return (out.argmax(dim=-1) == 1).tolist()


def test_the_npu_lossy_rule_counts_generated_tokens_from_the_runners_batch(npu_sampler):
    runner = SimpleNamespace()
    # 20 and 15 tokens generated (prompts 7 and 30 long): only the first is past the prefix.
    assert _relaxed_rows(npu_sampler, runner, [7, 30], [20, 15]) == [True, False]
    assert _relaxed_rows(npu_sampler, runner, [7, 30], [16, 16]) == [True, True]


def test_without_a_runner_the_npu_rule_stays_strict(npu_sampler):
    # Without a runner: empty output ids, every request fresh.
    assert _relaxed_rows(npu_sampler, None, [7, 30], [20, 15]) == [False, False]


def test_the_worker_says_when_the_padding_keeps_no_graph(proposers, caplog):
    """The worker's final compilation config (here: NONE, as after a
    downgrade at model_runner_v1.py line 5061) has no full decode graph:
    one line on the first step, naming the mode and how the engine core
    learns it (tests/ascend/test_ascend_worker_graphs.py)."""
    proposer = _make(proposers, k=3)
    with caplog.at_level("WARNING"):
        proposer._propose(**_step(gamma=2))
        proposer._propose(**_step(gamma=1))
    warned = [r for r in caplog.records if "no full decode graph" in r.getMessage()]
    assert len(warned) == 1 and "final cudagraph_mode is NONE" in warned[0].getMessage()
    assert "worker_graphs.py" in warned[0].getMessage()


def test_the_npu_proposer_falls_back_to_torch_ops_without_the_library(proposers, monkeypatch,
                                                                      tmp_path):
    """A wheel without vspec's compiled ops serves through the torch
    implementation (kernels/ops.py load): the commit gives the host's result."""
    from vllm_vspec.kernels import ops

    monkeypatch.setattr(ops, "_loaded", None)
    monkeypatch.setattr(ops, "_fallback", None)
    monkeypatch.setattr(ops, "library_candidates", lambda: [tmp_path / ops.LIBRARY])
    proposer = _make(proposers, k=3)
    assert proposer.vspec_ops is ops.TORCH_OPS
    proposer.backup_next_token_ids = _Buffer(8)
    sampled = torch.tensor([[5, 6, -1], [-1, -1, -1], [7, 8, 9]], dtype=torch.int32)
    requests = {r: SimpleNamespace(get_token_id=lambda i: 3) for r in "abc"}
    batch = SimpleNamespace(num_reqs=3, req_ids=list("abc"), vocab_size=VOCAB,
                            num_tokens_no_spec=[1, 1, 1])
    indices = torch.tensor([2, 0, 0], dtype=torch.int32)
    next_token, count = proposer.prepare_next_token_ids_padded(sampled, requests, batch,
                                                               indices, 1)
    want_next, want_count = _host_commit(sampled, torch.tensor([3, 3, 3], dtype=torch.int32),
                                         indices, 1, VOCAB)
    assert next_token.tolist() == want_next.tolist() and count.tolist() == want_count.tolist()
