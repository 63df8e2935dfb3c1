"""vllm_vspec.kernels.tree (fixed-width EAGLE trees) against brute force.

Each function is checked on random inputs (hypothesis) against a per-row
Python reference written from the definitions in tree.py's docstrings; small
integer logits make ties frequent, so the tie rules are exercised too. Width 1
is checked against the linear path (argmax drafting, acceptance.py's strict
rule), and the acceptance feeds the real `vspec::tree_commit` op.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_vspec.kernels import ops, tree
from vllm_vspec.kernels.acceptance import AcceptanceRule, accept_mask

SETTINGS = settings(max_examples=60, deadline=None)



# References the tests check the engine's pieces against (not shipped: the
# engine builds its masks with tree.tree_mask and needs no depth table).
def node_depths(gamma: int, width: int) -> torch.Tensor:
    """int64 [N]: depth of each node of the depth-major layout."""
    return torch.cat([torch.zeros(1, dtype=torch.int64),
                      torch.arange(1, gamma + 1).repeat_interleave(width)])


def attention_mask(parents: torch.Tensor, prefix_lens: torch.Tensor) -> list[torch.Tensor]:
    """Per request b, bool [N, prefix_lens[b] + N]: the tree nodes' queries
    against the request's keys (committed prefix, then the N nodes at
    slots seq_len + i). What the tree attention backend applies."""
    inside = tree.tree_mask(parents)
    return [torch.cat([torch.ones(inside.shape[1], int(p), dtype=torch.bool), m], dim=1)
            for m, p in zip(inside, prefix_lens.tolist())]

def small_logits(draw, shape) -> torch.Tensor:
    """Float logits with small integer values: many exact ties."""
    count = 1
    for s in shape:
        count *= s
    values = draw(st.lists(st.integers(-2, 2), min_size=count, max_size=count))
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


# ------------------------------------------------------------ references
def ref_expand(scores, logits, width):
    """Per row: every parent's top-`width` tokens by (logit desc, token asc),
    then the `width` best (cumulative desc, parent asc, child rank asc)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    ranks, tokens, new_scores = [], [], []
    for b in range(scores.shape[0]):
        candidates = []
        for p in range(scores.shape[1]):
            row = logits[b, p].tolist()
            best = sorted(range(len(row)), key=lambda t: (-row[t], t))[:width]
            for c, t in enumerate(best):
                # float32 sum, as the implementation adds: ties must be the same ties.
                s = (scores[b, p] + logprobs[b, p, t]).item()
                candidates.append((-s, p, c, t))
        # The first parent's top token (the linear chain) first, then the
        # best of the rest by cumulative log-probability.
        chain = next(c for c in candidates if c[1] == 0 and c[2] == 0)
        chosen = [chain] + sorted(c for c in candidates if c is not chain)[:width - 1]
        ranks.append([p for _, p, _, _ in chosen])
        tokens.append([t for _, _, _, t in chosen])
        new_scores.append([-s for s, _, _, _ in chosen])
    return ranks, tokens, new_scores


def ref_ancestors(parents_row, i):
    """Node i and its ancestors, root last."""
    chain = [i]
    while parents_row[chain[-1]] != tree.NO_NODE:
        chain.append(parents_row[chain[-1]])
    return chain


def ref_accept(tokens_row, parents_row, target_row):
    """(path, output): the deepest node whose root path matches everywhere
    (lowest index on ties), found by checking every node."""
    best = 0
    for i in range(len(tokens_row)):
        chain = ref_ancestors(parents_row, i)
        ok = all(tokens_row[j] == target_row[parents_row[j]] for j in chain[:-1])
        if ok and len(chain) > len(ref_ancestors(parents_row, best)):
            best = i
    path = ref_ancestors(parents_row, best)[::-1]
    output = [tokens_row[j] for j in path[1:]] + [target_row[best]]
    return path, output


@st.composite
def random_trees(draw, max_nodes=9, vocab=3):
    """(tokens, parents, target_tokens) for B random topological trees of the
    same node count, tokens from a small vocabulary so that matches happen."""
    batch = draw(st.integers(1, 3))
    n = draw(st.integers(1, max_nodes))
    parents = [[tree.NO_NODE] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
               for _ in range(batch)]
    ints = st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)
    tokens = [draw(ints) for _ in range(batch)]
    target = [draw(ints) for _ in range(batch)]
    return torch.tensor(tokens), torch.tensor(parents), torch.tensor(target)


@st.composite
def bigram_drafts(draw, max_vocab: int, max_gamma: int, max_width: int):
    """(table, roots, gamma, width): a toy drafter's bigram logits [V, V],
    1-3 root tokens and a tree shape."""
    vocab = draw(st.integers(2, max_vocab))
    gamma = draw(st.integers(1, max_gamma))
    width = draw(st.integers(1, min(vocab, max_width)))
    table = small_logits(draw, (vocab, vocab))
    roots = torch.tensor(draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3)))
    return table, roots, gamma, width


def bigram_fn(table):
    """A toy drafter: the logits after a node depend on its token only."""
    def logits_fn(draft, frontier):
        return table[draft.tokens.gather(1, frontier)]
    return logits_fn


# ------------------------------------------------------------ shape
def test_layout_is_depth_major_with_width_nodes_per_depth():
    assert tree.num_nodes(3, 2) == 7
    assert node_depths(3, 2).tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert node_depths(2, 1).tolist() == [0, 1, 2]


# ------------------------------------------------------------ drafting
@SETTINGS
@given(data=st.data())
def test_expand_beam_matches_brute_force(data):
    batch, parents = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    vocab = data.draw(st.integers(2, 6))
    width = data.draw(st.integers(1, min(vocab, 4)))
    scores = small_logits(data.draw, (batch, parents)) * 0.5
    logits = small_logits(data.draw, (batch, parents, vocab))
    rank, token, score = tree.expand_beam(scores, logits, width)
    want_rank, want_token, want_score = ref_expand(scores, logits, width)
    assert rank.tolist() == want_rank, (logits.tolist(), scores.tolist())
    assert token.tolist() == want_token, (logits.tolist(), scores.tolist())
    assert score.tolist() == want_score


def test_expand_beam_refuses_a_width_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"width=5 is not allowed: an integer in \[1, 4\]"):
        tree.expand_beam(torch.zeros(1, 1), torch.zeros(1, 1, 4), 5)


@SETTINGS
@given(case=bigram_drafts(max_vocab=5, max_gamma=4, max_width=3))
def test_grown_tree_is_the_brute_force_beam(case):
    table, roots, gamma, width = case
    got = tree.grow_tree(roots, table[roots], bigram_fn(table), gamma, width)
    assert got.tokens.shape == got.parents.shape == (len(roots), tree.num_nodes(gamma, width))
    for b, root in enumerate(roots.tolist()):
        # Brute force: carry (node index, score) beams depth by depth.
        tokens, parents = [root], [tree.NO_NODE]
        frontier, scores = [0], [0.0]
        for depth in range(1, gamma + 1):
            rows = table[torch.tensor([tokens[i] for i in frontier])].unsqueeze(0)
            ranks, new, scores = ref_expand(torch.tensor([scores]), rows, width)
            ranks, new, scores = ranks[0], new[0], scores[0]
            parents += [frontier[r] for r in ranks]
            tokens += new
            frontier = list(range(1 + (depth - 1) * width, 1 + depth * width))
        assert got.tokens[b].tolist() == tokens, table.tolist()
        assert got.parents[b].tolist() == parents, table.tolist()


@SETTINGS
@given(data=st.data())
def test_width_one_drafts_the_linear_argmax_chain(data):
    vocab = data.draw(st.integers(2, 8))
    gamma = data.draw(st.integers(1, 5))
    table = small_logits(data.draw, (vocab, vocab))
    root = data.draw(st.integers(0, vocab - 1))
    chain = [root]
    for _ in range(gamma):
        chain.append(int(table[chain[-1]].argmax()))
    got = tree.grow_tree(torch.tensor([root]), table[[root]], bigram_fn(table), gamma, 1)
    assert got.tokens[0].tolist() == chain
    assert got.parents[0].tolist() == [tree.NO_NODE] + list(range(gamma))


@SETTINGS
@given(case=bigram_drafts(max_vocab=6, max_gamma=5, max_width=4))
def test_rank_0_of_every_depth_is_the_linear_chain(case):
    # So a tree holds the linear draft of its depth: strict acceptance on a
    # tree never commits fewer tokens than on the linear draft.
    table, roots, gamma, width = case
    linear = tree.grow_tree(roots, table[roots], bigram_fn(table), gamma, 1)
    got = tree.grow_tree(roots, table[roots], bigram_fn(table), gamma, width)
    rank0 = [0] + [1 + d * width for d in range(gamma)]
    assert torch.equal(got.tokens[:, rank0], linear.tokens), table.tolist()
    assert got.parents[:, rank0[1:]].tolist() == [rank0[:-1]] * len(roots)


def test_a_pure_beam_would_drop_the_chain_here_and_the_tree_keeps_it():
    # Root logits favour token 0 a little over 1; after 0 the drafter is
    # unsure (flat), after 1 it is sure of 2 and 3: the two best depth-2
    # candidates by cumulative log-probability both hang from token 1.
    table = torch.tensor([[0.1, 0.0, 0.0, 0.0],      # after token 0: nearly flat
                          [-9.0, -9.0, 5.0, 5.0],    # after token 1: 2 or 3
                          [0.0, 0.0, 0.0, 0.0],
                          [0.0, 0.0, 0.0, 0.0]])
    root_logits = torch.tensor([[2.0, 1.9, -9.0, -9.0]])
    got = tree.grow_tree(torch.tensor([3]), root_logits, bigram_fn(table), 2, 2)
    # depth 1: tokens 0 (rank 0) and 1; depth 2 rank 0: the chain 0 -> 0.
    assert got.tokens[0, 1:3].tolist() == [0, 1]
    assert (got.tokens[0, 3].item(), got.parents[0, 3].item()) == (0, 1)
    assert got.parents[0, 4].item() == 2          # the best of the rest hangs from token 1


# ------------------------------------------------------------ mask
@SETTINGS
@given(case=random_trees())
def test_tree_mask_is_ancestor_or_self(case):
    _, parents, _ = case
    mask = tree.tree_mask(parents)
    for b, row in enumerate(parents.tolist()):
        for i in range(len(row)):
            want = set(ref_ancestors(row, i))
            got = set(torch.nonzero(mask[b, i]).flatten().tolist())
            assert got == want, (row, i)


def test_attention_mask_sees_the_whole_prefix_and_the_ancestors_only():
    parents = torch.tensor([[tree.NO_NODE, 0, 0, 1, 2]])   # width 2, gamma 2
    (mask,) = attention_mask(parents, torch.tensor([3]))
    assert mask.shape == (5, 8)
    assert mask[:, :3].all()
    assert mask[:, 3:].int().tolist() == [[1, 0, 0, 0, 0],
                                          [1, 1, 0, 0, 0],
                                          [1, 0, 1, 0, 0],
                                          [1, 1, 0, 1, 0],
                                          [1, 0, 1, 0, 1]]


@settings(max_examples=20, deadline=None)
@given(case=random_trees(), prefix=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_tree_attention_of_a_node_is_causal_attention_over_its_root_path(case, prefix, seed):
    """The mask's meaning: with it, node i's attention output is the last row
    of plain causal attention over the prefix followed by i's root path."""
    _, parents, _ = case
    n = parents.shape[1]
    gen = torch.Generator().manual_seed(seed)
    for b, (mask, row) in enumerate(zip(attention_mask(parents, torch.full((len(parents),),
                                                                              prefix)),
                                        parents.tolist())):
        q, k, v = (torch.randn(prefix + n, 2, 8, generator=gen, dtype=torch.float64)
                   for _ in range(3))
        tree_rows = torch.nn.functional.scaled_dot_product_attention(
            q[prefix:].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
        for i in range(n):
            keep = list(range(prefix)) + [prefix + j for j in ref_ancestors(row, i)[::-1]]
            linear = torch.nn.functional.scaled_dot_product_attention(
                q[keep].transpose(0, 1), k[keep].transpose(0, 1), v[keep].transpose(0, 1),
                is_causal=True)
            assert torch.allclose(tree_rows[:, i], linear[:, -1], rtol=0, atol=1e-12), (row, i)


# ------------------------------------------------------------ acceptance
@SETTINGS
@given(case=random_trees())
def test_greedy_accept_matches_brute_force(case):
    tokens, parents, target = case
    got = tree.greedy_accept(tokens, parents, target)
    for b in range(tokens.shape[0]):
        path, output = ref_accept(tokens[b].tolist(), parents[b].tolist(), target[b].tolist())
        n = len(path)
        assert got.length[b].item() == n, (tokens[b], parents[b], target[b])
        assert got.path[b, :n].tolist() == path and (got.path[b, n:] == tree.NO_NODE).all()
        assert got.output[b, :n].tolist() == output and (got.output[b, n:] == tree.NO_NODE).all()


def test_all_rejected_emits_the_targets_token_after_the_root():
    parents = torch.tensor([[tree.NO_NODE, 0, 0, 1, 2]])
    tokens = torch.tensor([[7, 1, 2, 3, 4]])
    target = torch.tensor([[9, 5, 5, 5, 5]])    # 9 after the root: no child is 9
    got = tree.greedy_accept(tokens, parents, target)
    assert got.length.tolist() == [1]
    assert got.path.tolist() == [[0, -1, -1]]
    assert got.output.tolist() == [[9, -1, -1]]


def test_full_path_accepted_emits_every_depth_and_the_bonus():
    parents = torch.tensor([[tree.NO_NODE, 0, 0, 1, 2]])
    tokens = torch.tensor([[7, 1, 2, 3, 4]])
    # Target argmax: 2 after the root (the second child), 4 after node 2, 6 after node 4.
    target = torch.tensor([[2, 0, 4, 0, 6]])
    got = tree.greedy_accept(tokens, parents, target)
    assert got.length.tolist() == [3]
    assert got.path.tolist() == [[0, 2, 4]]
    assert got.output.tolist() == [[2, 4, 6]]


@SETTINGS
@given(data=st.data())
def test_width_one_accepts_like_the_linear_strict_rule(data):
    batch, gamma = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5))
    vocab = data.draw(st.integers(2, 4))
    logits = small_logits(data.draw, (batch, gamma + 1, vocab))
    drafts = torch.tensor(data.draw(st.lists(
        st.lists(st.integers(0, vocab - 1), min_size=gamma, max_size=gamma),
        min_size=batch, max_size=batch)))
    roots = torch.zeros(batch, 1, dtype=torch.int64)
    parents = torch.cat([torch.tensor([tree.NO_NODE]), torch.arange(gamma)]).expand(batch, -1)
    got = tree.greedy_accept(torch.cat([roots, drafts], 1), parents, logits.argmax(-1))
    # Linear: acceptance.py's strict rule per draft row, cut at the first rejection.
    rows = accept_mask(AcceptanceRule(), logits[:, :gamma].reshape(-1, vocab), drafts.reshape(-1),
                       torch.arange(gamma).repeat(batch), torch.zeros(batch * gamma))
    accepted = rows.reshape(batch, gamma).int().cumprod(1).sum(1)
    for b in range(batch):
        a = int(accepted[b])
        want = drafts[b, :a].tolist() + [int(logits[b, a].argmax())]
        assert got.output[b, :a + 1].tolist() == want, (logits[b], drafts[b])
        assert got.length[b].item() == a + 1


RULES = [AcceptanceRule(),
         AcceptanceRule("relaxed_topk", topk=2, after_tokens=1, protected_token_ids=(0,)),
         AcceptanceRule("margin", margin=1.0, from_position=1, after_tokens=0)]


@SETTINGS
@given(case=random_trees(), data=st.data(), rule=st.sampled_from(RULES))
def test_rule_matches_applies_the_linear_rule_at_each_nodes_depth(case, data, rule):
    tokens, parents, _ = case
    batch, n = tokens.shape
    logits = small_logits(data.draw, (batch, n, 3))
    generated = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=batch,
                                                max_size=batch)))
    got = tree.rule_matches(rule, logits, tokens, parents, generated)
    for b in range(batch):
        for i in range(1, n):
            # Node i is the linear draft at position depth - 1, verified by its parent's row.
            position = len(ref_ancestors(parents[b].tolist(), i)) - 2
            want = accept_mask(rule, logits[b, parents[b, i]].unsqueeze(0), tokens[b, i:i + 1],
                               torch.tensor([position]), generated[b:b + 1])
            assert got[b, i].item() == want.item(), (rule, b, i)


@SETTINGS
@given(case=random_trees(), data=st.data())
def test_strict_rule_gives_greedy_accept_and_relaxed_paths_are_never_shorter(case, data):
    tokens, parents, _ = case
    batch, n = tokens.shape
    logits = small_logits(data.draw, (batch, n, 3))
    generated = torch.zeros(batch, dtype=torch.int64)
    strict = tree.greedy_accept(tokens, parents, logits.argmax(-1))
    via_rule = tree.accept_paths(tree.rule_matches(RULES[0], logits, tokens, parents, generated),
                                 tokens, parents, logits.argmax(-1))
    assert torch.equal(via_rule.output, strict.output)
    for rule in RULES[1:]:
        lossy = tree.accept_paths(tree.rule_matches(rule, logits, tokens, parents, generated),
                                  tokens, parents, logits.argmax(-1))
        assert (lossy.length >= strict.length).all(), (rule, lossy.length, strict.length)


# ------------------------------------------------------------ tree commit
@SETTINGS
@given(case=random_trees(), data=st.data())
def test_tree_commit_makes_the_accepted_path_contiguous(case, data):
    tokens, parents, target = case
    batch, n = tokens.shape
    seq_lens = torch.tensor(data.draw(st.lists(st.integers(0, 20), min_size=batch,
                                               max_size=batch)))
    # Request b's node i sits at the slot of position seq_lens[b] + i of its own block range.
    slots = (torch.arange(batch) * 100 + seq_lens).unsqueeze(1) + torch.arange(n)
    # A one-value "KV cache": each verified node's slot holds its token.
    kv = torch.full((batch * 100,), -1, dtype=torch.int64)
    kv[slots.flatten()] = tokens.flatten()
    accepted = tree.greedy_accept(tokens, parents, target)
    args = tree.tree_commit_args(accepted, target, slots.flatten(), seq_lens)
    new_lens, next_token, src, dst = ops.load().tree_commit(*args)
    moves = src >= 0
    kv[dst[moves]] = kv[src[moves]].clone()
    for b in range(batch):
        length = int(accepted.length[b])
        assert new_lens[b].item() == seq_lens[b].item() + length
        assert next_token[b].item() == accepted.output[b, length - 1].item()
        path_tokens = tokens[b, accepted.path[b, :length]].tolist()
        assert kv[slots[b, :length]].tolist() == path_tokens, (accepted.path[b], src[b], dst[b])


# ------------------------------------------------------------ host fact
@pytest.mark.parametrize("block_size", [16, 32])
def test_cpu_kv_cache_keeps_keys_transposed_per_block_and_head(block_size):
    """The layout docs/design/eagle-tree.md's tree attention reads back: vLLM's CPU
    cache [blocks, kv_heads, block_size, 2 * head_size] holds, per block and
    head, the key as [head_size, block_size] and the value as [block_size,
    head_size] (ISAs vec16 and vec, float32). If vLLM changes it, the tree
    backend's reader must change with it."""
    from vllm import _custom_ops as host_ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    blocks, heads, head_size = 3, 2, 64
    isa = _get_attn_isa(torch.float32, block_size, head_size)
    assert isa in ("vec", "vec16")
    cache = torch.zeros(blocks, heads, block_size, 2 * head_size)
    key_cache, value_cache = cache.view(blocks, heads, 2 * block_size, -1).chunk(2, dim=2)
    slots = torch.tensor([0, 5, block_size + 3, 3 * block_size - 1])
    key, value = torch.randn(4, heads, head_size), torch.randn(4, heads, head_size)
    host_ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    block, offset = slots // block_size, slots % block_size
    keys = key_cache.reshape(blocks, heads, head_size, block_size)
    assert torch.equal(keys[block, :, :, offset], key)
    assert torch.equal(value_cache[block, :, offset], value)


def test_masked_attention_over_the_read_cache_equals_the_host_kernel_on_a_chain():
    """The tree backend's plan (docs/design/eagle-tree.md 4.1) on a width-1 tree, where
    the host's causal CPU kernel is the oracle: keys and values read back from
    the paged cache plus SDPA under `attention_mask` (GQA included) give
    the kernel's output for every query row. The reader is the tree
    backend's (tree_attention.read_paged_kv)."""
    from vllm import _custom_ops as host_ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_vspec.hosts.vllm.tree.attention import read_paged_kv

    block_size, heads, kv_heads, head_size, num_blocks = 32, 4, 2, 64, 8
    prefixes, gamma = [37, 5], 3
    n = tree.num_nodes(gamma, 1)
    isa = _get_attn_isa(torch.float32, block_size, head_size)
    gen = torch.Generator().manual_seed(0)
    cache = torch.zeros(num_blocks, kv_heads, block_size, 2 * head_size)
    key_cache, value_cache = cache.view(num_blocks, kv_heads, 2 * block_size, -1).chunk(2, dim=2)
    block_table = torch.tensor([[5, 2, 7], [1, 6, 0]], dtype=torch.int32)   # scattered blocks
    seq_lens = torch.tensor([p + n for p in prefixes], dtype=torch.int32)
    for b, length in enumerate(seq_lens.tolist()):
        pos = torch.arange(length)
        slots = block_table[b, pos // block_size].long() * block_size + pos % block_size
        host_ops.cpu_attn_reshape_and_cache(
            torch.randn(length, kv_heads, head_size, generator=gen),
            torch.randn(length, kv_heads, head_size, generator=gen),
            key_cache, value_cache, slots, isa)
    query = torch.randn(2 * n, heads, head_size, generator=gen)
    query_start_loc = torch.tensor([0, n, 2 * n], dtype=torch.int32)
    scale = head_size ** -0.5
    metadata = host_ops.cpu_attn_get_scheduler_metadata(
        num_reqs=2, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_size,
        seq_lens=seq_lens, dtype=torch.float32, query_start_loc=query_start_loc, causal=True,
        sliding_window_size=-1, isa=isa, enable_kv_split=False)
    kernel = torch.zeros_like(query)
    host_ops.cpu_attention_with_kv_cache(
        query=query, key_cache=key_cache, value_cache=value_cache, output=kernel,
        query_start_loc=query_start_loc, seq_lens=seq_lens, scale=scale, causal=True,
        alibi_slopes=None, sliding_window=-1, block_table=block_table, softcap=0.0,
        scheduler_metadata=metadata, s_aux=None)
    chain = torch.cat([torch.tensor([tree.NO_NODE]), torch.arange(gamma)]).expand(2, n)
    masks = attention_mask(chain, torch.tensor(prefixes))
    for b, length in enumerate(seq_lens.tolist()):
        keys, values = read_paged_kv(cache, block_table[b], length)
        ours = torch.nn.functional.scaled_dot_product_attention(
            query[b * n:(b + 1) * n].transpose(0, 1), keys.transpose(0, 1),
            values.transpose(0, 1), attn_mask=masks[b], scale=scale, enable_gqa=True)
        torch.testing.assert_close(ours.transpose(0, 1), kernel[b * n:(b + 1) * n],
                                   rtol=1e-5, atol=1e-5)
