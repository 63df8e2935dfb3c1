"""The NPU proposers' graph mode and commit op, over test_overlay's stand-in
host (vLLM-Ascend needs torch_npu; nothing here runs on an NPU).

Spec: under dynamic gamma the draft model runs eagerly unless
`ascend_draft_full_graph` opts in (the host's own `use_cuda_graph` switch);
the commit of a verification step comes from torch.ops.vspec.commit_accepted
and equals vLLM-Ascend 0.23's own computation.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_commit_hot_path import _Buffer
from test_overlay import _make, _step, _Wrapper, proposers  # noqa: F401 (fixture)

VOCAB = 30


def test_draft_graphs_are_off_under_dynamic_gamma_by_default(proposers):
    proposer = _make(proposers, k=3, full_graphs=True, vspec={})
    assert proposer.use_cuda_graph is False
    assert not isinstance(proposer._runnable, _Wrapper) and proposer._vspec_runnables == {}
    assert proposer._propose(**_step(gamma=2)).tolist() == [[0, 1, -1]] * 2


def test_full_draft_graphs_are_opt_in(proposers):
    proposer = _make(proposers, k=3, full_graphs=True, vspec={"ascend_draft_full_graph": True})
    assert proposer.use_cuda_graph is True
    assert isinstance(proposer._runnable, _Wrapper) and sorted(proposer._vspec_runnables) == [1, 2]


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
