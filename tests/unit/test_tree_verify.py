"""The runner's tree step (hosts/vllm/tree/verify.py), no engine: its
inputs (`tree_step`), its sampling (`sample_tree`) and the drafter's inputs
after it (`accepted_paths_first`), on hand-built runner state.

Sampling: one step mixes what an engine batch can hold: a width-2 tree, a request
without drafts (a new request's prefill: the host sampler's token) and a
chain (a linear draft). The oracle is tree.greedy_accept per request on the
target's argmax at each node, in the rejection sampler's [B, max_spec_len +
1] layout padded with -1. With a lossy rule the oracle is hand-derived: the
target rows carry an argmax and a runner-up (within margin 1.0 and the top
2), so the paths the rule may take are known node by node.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_vspec.kernels import tree
from vllm_vspec.kernels.acceptance import AcceptanceRule
from vllm_vspec.hosts.vllm.tree.verify import TreeSpecDecodeMetadata, sample_tree
from vllm_vspec.kernels.acceptance import NO_TOKEN

VOCAB = 8


def greedy_sampler(logits, sampling_metadata, predict_bonus_token):
    """The host sampler on a greedy batch: the argmax of each row."""
    assert predict_bonus_token
    return SimpleNamespace(sampled_token_ids=logits.argmax(-1, keepdim=True).to(torch.int32))


def step(trees: list[tuple[list[int], list[int]] | None], argmax: list[list[int]]):
    """Metadata and logits of a step: trees[b] = (tokens, parents) or None (no
    drafts); argmax[b] = the target's argmax at each of b's rows."""
    logits = torch.cat([torch.nn.functional.one_hot(torch.tensor(a), VOCAB).float()
                        for a in argmax])
    num_draft = [0 if t is None else len(t[0]) - 1 for t in trees]
    num_sampled = torch.tensor(num_draft) + 1
    cu_sampled = num_sampled.cumsum(0)
    rows = [b for b, t in enumerate(trees) if t is not None]
    width = max(len(trees[b][0]) for b in rows)
    tokens = torch.full((len(rows), width), NO_TOKEN)
    parents = torch.zeros((len(rows), width), dtype=torch.int64)
    for k, b in enumerate(rows):
        n = len(trees[b][0])
        tokens[k, :n], parents[k, :n] = torch.tensor(trees[b][0]), torch.tensor(trees[b][1])
    metadata = TreeSpecDecodeMetadata(
        draft_token_ids=torch.tensor([x for t in trees if t for x in t[0][1:]]),
        num_draft_tokens=num_draft, cu_num_draft_tokens=torch.tensor(num_draft).cumsum(0),
        cu_num_sampled_tokens=cu_sampled, target_logits_indices=torch.zeros(0),
        bonus_logits_indices=cu_sampled - 1, logits_indices=torch.arange(int(cu_sampled[-1])),
        rows=tuple(rows), tokens=tokens, parents=parents,
        seq_lens=torch.zeros(len(rows), dtype=torch.int64))
    return metadata, logits


GREEDY = SimpleNamespace(max_num_logprobs=None, all_greedy=True, temperature=None)


def test_a_mixed_step_emits_each_requests_accepted_path_then_the_targets_token():
    # Request 0: width 2, gamma 2; the target follows node 2 (rank 1) then node 4.
    tree0 = ([5, 1, 2, 3, 4], [tree.NO_NODE, 0, 0, 1, 2])
    argmax0 = [2, 0, 4, 0, 6]
    # Request 2: a chain of 3 drafts, the second rejected.
    tree2 = ([7, 3, 3, 1], [tree.NO_NODE, 0, 1, 2])
    argmax2 = [3, 5, 0, 0]
    metadata, logits = step([tree0, None, tree2], [argmax0, [6], argmax2])
    out = sample_tree(greedy_sampler, logits, metadata, GREEDY).sampled_token_ids
    assert out.shape == (3, metadata.max_spec_len + 1)
    assert out.tolist() == [[2, 4, 6, -1, -1],
                            [6, -1, -1, -1, -1],
                            [3, 5, -1, -1, -1]]
    assert metadata.acceptance.path[0, :3].tolist() == [0, 2, 4]
    assert metadata.acceptance.length.tolist() == [3, 2]


def test_padding_nodes_are_never_accepted():
    # Request 1's tree is shorter: its padding hangs from the root with NO_TOKEN.
    metadata, logits = step([([0, 1, 2, 3], [tree.NO_NODE, 0, 1, 2]),
                             ([0, 1], [tree.NO_NODE, 0])],
                            [[1, 2, 3, 4], [1, 7]])
    out = sample_tree(greedy_sampler, logits, metadata, GREEDY).sampled_token_ids
    assert out.tolist() == [[1, 2, 3, 4], [1, 7, -1, -1]]


def test_a_request_with_drafts_that_is_not_greedy_is_refused():
    metadata, logits = step([([0, 1], [tree.NO_NODE, 0])], [[1, 2]])
    sampled = SimpleNamespace(max_num_logprobs=None, all_greedy=False,
                              temperature=torch.tensor([0.7]))
    with pytest.raises(RuntimeError, match="not greedy"):
        sample_tree(greedy_sampler, logits, metadata, sampled)


def graded_step(trees, argmax: list[list[int]], runner_up: list[list[int]]):
    """`step` whose target rows score the argmax 2, the runner-up 1 and the
    rest 0: the runner-up is within margin 1.0 and in the top 2, nothing
    else is."""
    metadata, logits = step(trees, argmax)
    second = torch.cat([torch.nn.functional.one_hot(torch.tensor(r), VOCAB).float()
                        for r in runner_up])
    return metadata, 2 * logits + second


# Width 2, gamma 2: nodes 1 (token 1) and 2 (token 2) under the root, node 3
# (token 3) under node 1, node 4 (token 4) under node 2.
TREE = ([5, 1, 2, 3, 4], [tree.NO_NODE, 0, 0, 1, 2])
# Tree A: strict follows node 2 and stops (node 4 is not even the runner-up);
# token 1 is the root's runner-up and node 3 is node 1's argmax.
A_ARGMAX, A_SECOND = [2, 3, 0, 7, 5], [1, 0, 6, 0, 0]
# Tree C: strict follows node 2; node 4 is node 2's runner-up (depth 2).
C_ARGMAX, C_SECOND = [2, 0, 0, 7, 5], [3, 1, 4, 0, 0]
MARGIN = AcceptanceRule("margin", margin=1.0)
TOP2 = AcceptanceRule("relaxed_topk", topk=2)


@pytest.mark.parametrize("rule", [MARGIN, TOP2], ids=["margin", "relaxed_topk"])
def test_a_lossy_rule_accepts_a_tree_path_through_a_token_the_rule_allows(rule):
    metadata, logits = graded_step([TREE], [A_ARGMAX], [A_SECOND])
    strict = sample_tree(greedy_sampler, logits, metadata, GREEDY).sampled_token_ids
    assert strict.tolist() == [[2, 0, -1, -1, -1]]
    lossy = sample_tree(greedy_sampler, logits, metadata, GREEDY, rule,
                        torch.tensor([0])).sampled_token_ids
    # Node 1 (the root's runner-up), node 3 (node 1's argmax), then node 3's argmax.
    assert lossy.tolist() == [[1, 3, 7, -1, -1]]
    assert metadata.acceptance.path.tolist() == [[0, 1, 3]]


@pytest.mark.parametrize("rule", [MARGIN, TOP2], ids=["margin", "relaxed_topk"])
def test_a_lossy_rule_never_accepts_a_tree_path_through_a_protected_id(rule):
    protected = dataclasses.replace(rule, protected_token_ids=(1,))
    metadata, logits = graded_step([TREE], [A_ARGMAX], [A_SECOND])
    out = sample_tree(greedy_sampler, logits, metadata, GREEDY, protected,
                      torch.tensor([0])).sampled_token_ids
    assert out.tolist() == [[2, 0, -1, -1, -1]]   # strict's path: token 1 only by exact match


def test_a_lossy_rule_on_trees_is_strict_within_its_strict_prefix_counted_per_depth():
    """after_tokens=1: the first output token of every request is decided
    strictly. Tree A's relaxed node is at depth 1 (output token number
    generated + 0), tree C's at depth 2 (generated + 1)."""
    rule = AcceptanceRule("margin", margin=1.0, after_tokens=1)
    trees = [TREE, None, TREE, TREE]
    argmax = [A_ARGMAX, [6], C_ARGMAX, A_ARGMAX]
    second = [A_SECOND, [1], C_SECOND, A_SECOND]
    generated = torch.tensor([0, 0, 1])   # per tree row: requests 0, 2, 3
    metadata, logits = graded_step(trees, argmax, second)
    strict = sample_tree(greedy_sampler, logits, metadata, GREEDY).sampled_token_ids
    assert strict.tolist() == [[2, 0, -1, -1, -1], [6, -1, -1, -1, -1],
                               [2, 0, -1, -1, -1], [2, 0, -1, -1, -1]]
    out = sample_tree(greedy_sampler, logits, metadata, GREEDY, rule, generated).sampled_token_ids
    assert out.tolist() == [[2, 0, -1, -1, -1],    # A, fresh: node 1 is output token 0, strict
                            [6, -1, -1, -1, -1],
                            [2, 4, 5, -1, -1],     # C, fresh: node 4 is output token 1, relaxed
                            [1, 3, 7, -1, -1]]     # A after 1 token: node 1 is output token 1
    # after_tokens=3: every node here is output token 2 or earlier.
    beyond = AcceptanceRule("margin", margin=1.0, after_tokens=3)
    out = sample_tree(greedy_sampler, logits, metadata, GREEDY, beyond, generated)
    assert torch.equal(out.sampled_token_ids, strict)


def test_after_a_tree_step_the_drafter_sees_each_accepted_path_as_a_linear_verify():
    """accepted_paths_first on a runner's buffers: a tree
    request's rows are reordered path first (node j of the path at row j),
    at positions seq_len + j; a chain and a request without drafts keep
    their rows and positions."""
    import numpy as np

    from vllm_vspec.hosts.vllm.tree.verify import accepted_paths_first

    tree0 = ([5, 1, 2, 3, 4], [tree.NO_NODE, 0, 0, 1, 2])        # rows 0-4, seq_len 10
    chain2 = ([7, 3, 3, 1], [tree.NO_NODE, 0, 1, 2])              # rows 6-9, seq_len 20
    metadata, logits = step([tree0, None, chain2], [[2, 0, 4, 0, 6], [6], [3, 5, 0, 0]])
    sample_tree(greedy_sampler, logits, metadata, GREEDY)        # path [0, 2, 4]; chain [0, 1]
    metadata.seq_lens = torch.tensor([10, 20])
    input_ids = torch.tensor([5, 1, 2, 3, 4, 9, 7, 3, 3, 1], dtype=torch.int32)
    tree_positions = torch.tensor([10, 11, 11, 12, 12, 30, 20, 21, 22, 23])
    runner = SimpleNamespace(
        query_start_loc=SimpleNamespace(np=np.array([0, 5, 6, 10])),
        input_batch=SimpleNamespace(num_reqs=3), device=torch.device("cpu"),
        input_ids=SimpleNamespace(gpu=input_ids.clone()), positions=tree_positions.clone())
    hidden = torch.arange(10.0).unsqueeze(1).expand(10, 3)
    got = accepted_paths_first(runner, metadata, hidden)
    order = [0, 2, 4, 1, 3, 5, 6, 7, 8, 9]
    assert runner.input_ids.gpu.tolist() == input_ids[order].tolist()
    assert torch.equal(got, hidden[order])
    assert runner.positions.tolist() == [10, 11, 12, 13, 14, 30, 20, 21, 22, 23]


def fake_runner(num_computed: list[int], query_lens: list[int], input_ids: list[int]):
    """The runner state tree_step reads, after the host's
    _prepare_inputs: linear positions and the slot mapping of a one-group
    cache whose slot is 100 * row + position."""
    import numpy as np

    from vllm_vspec.hosts.vllm.tree.attention import TreeCPUAttentionMetadataBuilder

    starts = np.concatenate([[0], np.cumsum(query_lens)])
    rows = np.repeat(np.arange(len(query_lens)), query_lens)
    positions = torch.tensor([num_computed[r] + i - starts[r] for i, r in enumerate(rows)])
    builder = TreeCPUAttentionMetadataBuilder.__new__(TreeCPUAttentionMetadataBuilder)
    builder.isa, builder._tree = "vec", None
    table = SimpleNamespace(slot_mapping=SimpleNamespace(cpu=torch.tensor(rows) * 100 + positions))
    batch = SimpleNamespace(
        num_reqs=len(query_lens), req_ids=[f"r{i}" for i in range(len(query_lens))],
        req_id_to_index={f"r{i}": i for i in range(len(query_lens))},
        num_computed_tokens_cpu=np.array(num_computed),
        block_table=SimpleNamespace(block_tables=[table]))
    return SimpleNamespace(
        input_batch=batch, query_start_loc=SimpleNamespace(np=starts), positions=positions,
        input_ids=SimpleNamespace(cpu=torch.tensor(input_ids, dtype=torch.int32)),
        attn_groups=[[SimpleNamespace(metadata_builders=[builder])]]), builder


def host_metadata(num_draft: list[int]):
    n = torch.tensor(num_draft)
    return SpecDecodeMetadata(
        draft_token_ids=torch.zeros(int(n.sum())), num_draft_tokens=num_draft,
        cu_num_draft_tokens=n.cumsum(0), cu_num_sampled_tokens=(n + 1).cumsum(0),
        target_logits_indices=torch.zeros(0), bonus_logits_indices=(n + 1).cumsum(0) - 1,
        logits_indices=torch.arange(int((n + 1).sum())))


def test_a_tree_step_places_nodes_at_their_depth_and_masks_only_real_trees():
    """Request r0 has a pending width-2 tree, r1 a linear draft (a chain), r2
    no drafts: r0's rows move to positions seq_len + depth, its mask goes to
    the builder, and the metadata pads r1's chain with NO_TOKEN nodes."""
    from vllm_vspec.hosts.vllm.tree.verify import tree_step

    runner, builder = fake_runner([10, 20, 30], [5, 3, 1], [5, 1, 2, 3, 4, 7, 8, 9, 6])
    pending = {"r0": (torch.tensor([5, 1, 2, 3, 4]), torch.tensor([tree.NO_NODE, 0, 0, 1, 2]))}
    scheduled = SimpleNamespace(scheduled_spec_decode_tokens={"r0": [1, 2, 3, 4], "r1": [8, 9]})
    got = tree_step(runner, scheduled, [5, 3, 1], host_metadata([4, 2, 0]), pending)
    assert runner.positions.tolist() == [10, 11, 11, 12, 12, 20, 21, 22, 30]
    assert builder._tree.rows == (0,)
    assert torch.equal(builder._tree.masks[0], tree.tree_mask(pending["r0"][1].unsqueeze(0))[0])
    assert got.rows == (0, 1)
    assert got.tokens.tolist() == [[5, 1, 2, 3, 4], [7, 8, 9, NO_TOKEN, NO_TOKEN]]
    assert got.parents.tolist() == [[-1, 0, 0, 1, 2], [-1, 0, 1, 0, 0]]
    assert got.seq_lens.tolist() == [10, 20]
    assert got.slots[0].tolist() == [[10, 11, 12, 13, 14], [120, 121, 122, -1, -1]]
    assert got.max_spec_len == 4


def test_scheduled_drafts_that_are_not_the_proposed_tree_stop_the_step():
    from vllm_vspec.hosts.vllm.tree.verify import tree_step

    runner, _ = fake_runner([10], [3], [5, 1, 9])
    pending = {"r0": (torch.tensor([5, 1, 2]), torch.tensor([tree.NO_NODE, 0, 0]))}
    scheduled = SimpleNamespace(scheduled_spec_decode_tokens={"r0": [1, 9]})
    with pytest.raises(RuntimeError, match="not the tree proposed"):
        tree_step(runner, scheduled, [3], host_metadata([2]), pending)


def test_the_commit_moves_each_accepted_path_to_contiguous_slots_in_target_layers_only():
    """After sampling, path [0, 2, 4] at seq_len 10 (slots 10-14) moves slot
    12 -> 11 and 14 -> 12 in every target layer (tree_commit's pairs,
    move_slots); the chain moves nothing; the drafter's layer is left."""
    from vllm_vspec.hosts.vllm.tree.attention import read_paged_kv
    from vllm_vspec.hosts.vllm.tree.verify import commit_trees, target_attention_layers

    tree0 = ([5, 1, 2, 3, 4], [tree.NO_NODE, 0, 0, 1, 2])
    chain1 = ([7, 3, 3, 1], [tree.NO_NODE, 0, 1, 2])
    metadata, logits = step([tree0, chain1], [[2, 0, 4, 0, 6], [3, 3, 1, 0]])
    sample_tree(greedy_sampler, logits, metadata, GREEDY)
    metadata.seq_lens = torch.tensor([10, 40])
    metadata.slots = (torch.tensor([[10, 11, 12, 13, 14], [40, 41, 42, 43, -1]]),)
    gen = torch.Generator().manual_seed(0)
    caches = {name: torch.randn(2, 2, 32, 128, generator=gen) for name in ("t0", "t1", "d0")}
    before = {name: read_paged_kv(c, torch.arange(2), 64) for name, c in caches.items()}
    runner = SimpleNamespace(
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(
            layer_names=["t0", "t1", "d0"])]),
        compilation_config=SimpleNamespace(static_forward_context={
            name: SimpleNamespace(kv_cache=c) for name, c in caches.items()}),
        drafter=SimpleNamespace(_draft_attn_layer_names={"d0"}))
    commit_trees(runner, metadata, target_attention_layers(runner))
    moved = list(range(64))
    moved[11], moved[12] = 12, 14
    for name in ("t0", "t1"):
        keys, values = read_paged_kv(caches[name], torch.arange(2), 64)
        assert torch.equal(keys, before[name][0][moved]), name
        assert torch.equal(values, before[name][1][moved]), name
    keys, values = read_paged_kv(caches["d0"], torch.arange(2), 64)
    assert torch.equal(keys, before["d0"][0]) and torch.equal(values, before["d0"][1])
