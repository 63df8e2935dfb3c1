"""vspec's commit op on the spec-decode hot path of the vLLM (CPU) engine.

Spec: vspec's proposers compute what a verification step commits
(`prepare_next_token_ids_padded`: valid token counts and next tokens) with
torch.ops.vspec.commit_accepted, the CPU twin of the AscendC kernel, and get
exactly what vLLM's own computation gives; an engine running vspec's worker
on the torch fallback (no compiled library) calls it every decode step and
stays token-identical to target-only (the compiled op in the engine:
tests/engine/test_exactness_matrix.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DRAFT, TokenBuffer, assert_same_tokens, close_llm, greedy, make_llm, runner_of

VOCAB = 40


@st.composite
def step(draw):
    """A batch after rejection sampling: per request its tokens so far, the
    sampler's row (accepted prefix, -1 after) and whether it is discarded."""
    batch = draw(st.integers(1, 8))
    width = draw(st.integers(1, 6))
    rows, histories = [], []
    for _ in range(batch):
        n = draw(st.integers(0, width))
        rows.append(draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
                    + [-1] * (width - n))
        histories.append(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)))
    discard = draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
    return rows, histories, discard


def _call_site(method, rows, histories, discard):
    """Run one `prepare_next_token_ids_padded` with the arguments vLLM 0.32's
    runner passes; returns (next_token_ids, valid_sampled_tokens_count)."""
    from vllm_vspec.kernels import ops

    ids = [f"r{i}" for i in range(len(rows))]
    requests = {r: SimpleNamespace(get_token_id=lambda i, h=h: h[i])
                for r, h in zip(ids, histories)}
    batch = SimpleNamespace(num_reqs=len(rows), req_ids=ids, vocab_size=VOCAB,
                            num_tokens_no_spec=[len(h) for h in histories])
    drafter = SimpleNamespace(backup_next_token_ids=TokenBuffer(16), vspec_ops=ops.load(),
                              observers=())
    mask = torch.zeros(16, dtype=torch.bool)
    mask[:len(rows)] = torch.tensor(discard)
    return method(drafter, torch.tensor(rows, dtype=torch.int32), requests, batch, mask)


@pytest.fixture(scope="module")
def host_kernels():
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.register_triton_kernel_overrides()  # the host kernel's CPU build


@settings(max_examples=25, deadline=None)
@given(case=step())
def test_the_commit_op_gives_what_vllms_own_computation_gives(host_kernels, case):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from vllm_vspec.hosts.vllm.proposers import VSpecProposer

    ours = _call_site(VSpecProposer.prepare_next_token_ids_padded, *case)
    host = _call_site(SpecDecodeBaseProposer.prepare_next_token_ids_padded, *case)
    for name, got, want in zip(("next_token_ids", "valid_sampled_tokens_count"), ours, host):
        assert got.tolist() == want.tolist(), (name, case)


class _Counting:
    """Calls `fn` and counts the calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.mark.engine
def test_the_torch_fallback_commits_every_decode_step(prompts, reference, monkeypatch):
    """draft_model on vspec's worker, gamma cycling 4, 0, 3, 1, 2 (widths 1..5),
    the compiled library hidden (VSPEC_OPS_LIB=none): the engine serves
    through the torch fallback and says so. (The compiled op on the hot path:
    tests/engine/test_exactness_matrix.py's draft_model lazy row.)"""
    from vllm_vspec.hosts.vllm.proposers import VSpecProposer
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
    from vllm_vspec.kernels import ops

    monkeypatch.setenv(ops.ENV, "none")
    monkeypatch.setattr(ops, "_fallback", None)

    llm = make_llm(speculative_config={"method": "draft_model", "model": str(DRAFT),
                                       "num_speculative_tokens": 4},
                   worker_cls=CPU_WORKER_CLS, vspec={"policy": "cycle", "min_gamma": 0})
    try:
        drafter = runner_of(llm).drafter
        assert isinstance(drafter, VSpecProposer), type(drafter).__mro__
        assert drafter.vspec_ops is ops.TORCH_OPS
        assert ops.backend() == "torch fallback: VSPEC_OPS_LIB=none"
        # Instance attributes over the bound ones: count without changing them.
        commits = _Counting(drafter.vspec_ops.commit_accepted)
        drafter.vspec_ops = SimpleNamespace(commit_accepted=commits)
        drafter.propose = passes = _Counting(drafter.propose)
        got = greedy(llm, prompts[:8])
    finally:
        close_llm(llm)
    assert_same_tokens(got, reference[:8], "torch fallback commit on the hot path")
    # Every draft pass starts from what the op committed (lazy gamma-0 steps
    # run neither).
    assert commits.calls == passes.calls > 10
