"""The CPU tree attention backend (hosts/vllm/tree/attention.py), no engine.

Oracles: the host's own causal CPU kernel. A tree node's attention must equal
the kernel's attention of that node's query over the committed prefix
followed by the node's root path, laid out as a plain sequence; rows of
requests without a tree must be the kernel's, bit for bit. `move_slots` is
checked against a per-slot copy on the cache read back in the layout
test_tree.py locks.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_vspec.kernels import tree
from vllm_vspec.hosts.vllm.tree.attention import (
    TreeCPUAttentionBackendImpl,
    TreeCPUAttentionMetadataBuilder,
    TreeQueries,
    move_slots,
    read_paged_kv,
)

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 64, 32
SCALE = HEAD_SIZE ** -0.5


def host():
    from vllm import _custom_ops as host_ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return host_ops, _get_attn_isa(torch.float32, BLOCK, HEAD_SIZE)


def empty_cache(num_blocks: int) -> torch.Tensor:
    return torch.zeros(num_blocks, KV_HEADS, BLOCK, 2 * HEAD_SIZE)


def write(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor,
          values: torch.Tensor) -> None:
    """The host's cache write (what do_kv_cache_update runs)."""
    host_ops, isa = host()
    halves = cache.view(cache.shape[0], KV_HEADS, 2 * BLOCK, HEAD_SIZE).chunk(2, dim=2)
    host_ops.cpu_attn_reshape_and_cache(keys, values, *halves, slots, isa)


def slots_of(block_row: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return block_row[positions // BLOCK].long() * BLOCK + positions % BLOCK


def bare_builder(isa: str) -> TreeCPUAttentionMetadataBuilder:
    """The builder's state that `build` reads, without a vLLM config (its
    __init__ reads the model's layers)."""
    builder = TreeCPUAttentionMetadataBuilder.__new__(TreeCPUAttentionMetadataBuilder)
    builder.__dict__.update(
        num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_SIZE, dtype=torch.float32,
        window_size=-1, block_size=BLOCK, isa=isa, kv_cache_dtype="auto",
        is_cross_attention=False, is_encoder_only_attention=False, _tree=None)
    return builder


def impl() -> TreeCPUAttentionBackendImpl:
    from vllm.config import set_current_vllm_config

    # The host impl reads the model dtype and the context parallel size only.
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32),
                             parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    with set_current_vllm_config(config):
        return TreeCPUAttentionBackendImpl(
            num_heads=HEADS, head_size=HEAD_SIZE, scale=SCALE, num_kv_heads=KV_HEADS,
            alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto")


def layer():
    _, isa = host()
    return SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)


def common_metadata(query_lens: list[int], seq_lens: list[int], block_table: torch.Tensor):
    """The CommonAttentionMetadata fields the CPU builder reads."""
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return SimpleNamespace(
        num_reqs=len(query_lens), num_actual_tokens=int(starts[-1]),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_table_tensor=block_table,
        slot_mapping=torch.zeros(int(starts[-1]), dtype=torch.int64), causal=True)


def kernel_last_row(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The host kernel's output for one query [HEADS, HEAD_SIZE] at the last
    position of a plain sequence of `keys`/`values` (one request, own cache)."""
    host_ops, isa = host()
    length = keys.shape[0]
    blocks = (length + BLOCK - 1) // BLOCK
    cache = empty_cache(blocks)
    table = torch.arange(blocks, dtype=torch.int32).unsqueeze(0)
    write(cache, torch.arange(length), keys, values)
    halves = cache.view(blocks, KV_HEADS, 2 * BLOCK, HEAD_SIZE).chunk(2, dim=2)
    start = torch.tensor([0, 1], dtype=torch.int32)
    lens = torch.tensor([length], dtype=torch.int32)
    meta = host_ops.cpu_attn_get_scheduler_metadata(
        num_reqs=1, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_SIZE, seq_lens=lens,
        dtype=torch.float32, query_start_loc=start, causal=True, sliding_window_size=-1,
        isa=isa, enable_kv_split=False)
    out = torch.zeros(1, HEADS, HEAD_SIZE)
    host_ops.cpu_attention_with_kv_cache(
        query=query.unsqueeze(0), key_cache=halves[0], value_cache=halves[1], output=out,
        query_start_loc=start, seq_lens=lens, scale=SCALE, causal=True, alibi_slopes=None,
        sliding_window=-1, block_table=table, softcap=0.0, scheduler_metadata=meta, s_aux=None)
    return out[0]


def beam_parents(gamma: int, width: int, seed: int) -> torch.Tensor:
    """Parents of a beam-shaped tree: each depth's nodes hang from random
    nodes of the depth above (what a beam drafter returns)."""
    gen = torch.Generator().manual_seed(seed)
    parents = [tree.NO_NODE] + [0] * width
    for depth in range(2, gamma + 1):
        first = 1 + (depth - 2) * width
        parents += (first + torch.randint(0, width, (width,), generator=gen)).tolist()
    return torch.tensor(parents)


# (prefix length, tree (gamma, width) or None: a plain decode row of 3 queries)
CASES = [(37, (3, 2)), (5, None), (70, (2, 4)), (1, (4, 3))]


def test_tree_rows_attend_to_the_prefix_and_their_root_path_only():
    """Three tree requests (widths 2-4) and one plain request in one forward,
    scattered blocks, GQA: every tree node's output is the host kernel's
    over prefix + root path; the plain request's rows are the kernel's."""
    gen = torch.Generator().manual_seed(0)
    parents = {b: beam_parents(*shape, seed=b) for b, (_, shape) in enumerate(CASES) if shape}
    query_lens = [tree.num_nodes(*shape) if shape else 3 for _, shape in CASES]
    seq_lens = [p + q for (p, _), q in zip(CASES, query_lens)]
    num_blocks = sum((s + BLOCK - 1) // BLOCK for s in seq_lens)
    cache = empty_cache(num_blocks)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)   # scattered blocks
    width = max((s + BLOCK - 1) // BLOCK for s in seq_lens)
    table = torch.zeros(len(CASES), width, dtype=torch.int32)
    keys, values, used = [], [], 0
    for b, s in enumerate(seq_lens):
        n = (s + BLOCK - 1) // BLOCK
        table[b, :n] = order[used:used + n]
        used += n
        keys.append(torch.randn(s, KV_HEADS, HEAD_SIZE, generator=gen))
        values.append(torch.randn(s, KV_HEADS, HEAD_SIZE, generator=gen))
        write(cache, slots_of(table[b], torch.arange(s)), keys[b], values[b])
    query = torch.randn(sum(query_lens), HEADS, HEAD_SIZE, generator=gen)
    _, isa = host()
    builder = bare_builder(isa)
    builder.set_tree(TreeQueries.for_verify(list(parents), list(parents.values())))
    metadata = builder.build(0, common_metadata(query_lens, seq_lens, table))
    ours = impl().forward(layer(), query, None, None, cache, metadata, torch.zeros_like(query))

    plain = bare_builder(isa).build(0, common_metadata(query_lens, seq_lens, table))
    assert not hasattr(plain, "tree_spans")      # no tree: the host's metadata itself
    host_out = impl().forward(layer(), query, None, None, cache, plain, torch.zeros_like(query))
    start = 0
    for b, ((prefix, shape), q) in enumerate(zip(CASES, query_lens)):
        rows = range(start, start + q)
        start += q
        if shape is None:
            assert torch.equal(ours[rows.start:rows.stop], host_out[rows.start:rows.stop])
            continue
        for i, row in enumerate(rows):
            path = [prefix + j for j in reversed(ancestors(parents[b].tolist(), i))]
            keep = list(range(prefix)) + path
            want = kernel_last_row(query[row], keys[b][keep], values[b][keep])
            torch.testing.assert_close(ours[row], want, rtol=1e-5, atol=1e-5,
                                       msg=f"request {b} node {i} (path {path})")


def ancestors(parents_row: list[int], i: int) -> list[int]:
    """Node i and its ancestors, root last."""
    chain = [i]
    while parents_row[chain[-1]] != tree.NO_NODE:
        chain.append(parents_row[chain[-1]])
    return chain


def test_a_tree_is_consumed_by_one_build():
    _, isa = host()
    builder = bare_builder(isa)
    table = torch.zeros(1, 1, dtype=torch.int32)
    builder.set_tree(TreeQueries.for_verify([0], [torch.tensor([tree.NO_NODE, 0, 0])]))
    first = builder.build(0, common_metadata([3], [10], table))
    second = builder.build(0, common_metadata([3], [10], table))
    assert len(first.tree_spans) == 1 and first.tree_spans[0].mask.shape == (3, 10)
    assert not hasattr(second, "tree_spans")


def test_a_tree_on_an_unchecked_isa_is_refused_with_the_isa_named():
    with pytest.raises(NotImplementedError, match="'amx' is not supported"):
        bare_builder("amx").set_tree(TreeQueries.for_verify([0], [torch.tensor([tree.NO_NODE])]))


def test_tree_queries_refuse_repeated_rows_and_non_boolean_masks():
    with pytest.raises(ValueError, match="must be distinct"):
        TreeQueries((0, 0), (torch.ones(1, 1, dtype=torch.bool),) * 2)
    with pytest.raises(ValueError, match="must be bool"):
        TreeQueries((0,), (torch.ones(1, 1),))


def test_move_slots_moves_exactly_the_given_slots():
    """Chained moves (a destination that is another move's source, as a tree
    commit produces) read every source before writing; nothing else changes."""
    gen = torch.Generator().manual_seed(1)
    num_blocks = 4
    cache = torch.randn(num_blocks, KV_HEADS, BLOCK, 2 * HEAD_SIZE, generator=gen)
    every = torch.arange(num_blocks * BLOCK)
    # Read back per slot with the blocks in order: slot s is position s.
    before_k, before_v = read_paged_kv(cache, torch.arange(num_blocks), num_blocks * BLOCK)
    # Path [0, 2, 4] of a tree at p = 40: 42 -> 41, 44 -> 42; plus a move across blocks.
    src = torch.tensor([42, 44, 100])
    dst = torch.tensor([41, 42, 5])
    move_slots(cache, src, dst)
    after_k, after_v = read_paged_kv(cache, torch.arange(num_blocks), num_blocks * BLOCK)
    want_k, want_v = before_k.clone(), before_v.clone()
    want_k[dst], want_v[dst] = before_k[src], before_v[src]
    assert torch.equal(after_k, want_k) and torch.equal(after_v, want_v)
    untouched = torch.ones(len(every), dtype=torch.bool)
    untouched[dst] = False
    assert torch.equal(after_k[untouched], before_k[untouched])


def test_read_paged_kv_reads_what_the_host_wrote():
    gen = torch.Generator().manual_seed(2)
    cache = empty_cache(3)
    row = torch.tensor([2, 0, 1], dtype=torch.int32)
    keys, values = (torch.randn(70, KV_HEADS, HEAD_SIZE, generator=gen) for _ in range(2))
    write(cache, slots_of(row, torch.arange(70)), keys, values)
    got_k, got_v = read_paged_kv(cache, row, 70)
    assert torch.equal(got_k, keys) and torch.equal(got_v, values)


def test_the_plugin_makes_cpu_attn_ours_under_the_host_name():
    """What every vLLM process on the CPU host runs (the general plugin); the
    name stays CPU_ATTN, so host checks on the backend name still hold."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_vspec.hosts.vllm import plugin as vllm_plugin
    from vllm_vspec.hosts.vllm.tree.attention import TreeCPUAttentionBackend

    assert vllm_plugin.register_tree_attention in vllm_plugin.REGISTRATIONS
    vllm_plugin.register_tree_attention()
    backend = AttentionBackendEnum.CPU_ATTN.get_class()
    assert backend is TreeCPUAttentionBackend
    assert backend.get_name() == "CPU_ATTN"
