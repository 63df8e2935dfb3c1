"""vLLM's CPU attention backend with draft-tree masks (docs/design/eagle-tree.md 4.1).

vLLM 0.32's CPU kernel is causal or not; it takes no mask. A draft tree needs
one: tree node i sees the committed prefix plus its own ancestors, not its
siblings nor the other branches (tree.tree_mask). These subclasses keep the
host backend for every row and recompute only the rows of requests that carry
a tree, with `scaled_dot_product_attention` over the keys and values read back
from the paged cache:

- `TreeQueries`: which requests of one attention-metadata build have tree
  queries, and each one's mask. The target's verify (the model runner) and
  the tree drafter set it on the builders before the host's build
  (`TreeCPUAttentionMetadataBuilder.set_tree`); it applies to that one build.
- `TreeCPUAttentionBackend`: the host's `CPU_ATTN` backend (same name, so
  every host check on the name still holds) with our builder and impl.
  Registered through vLLM's own registry (vllm_plugin.register_tree_attention,
  in every process): without a tree the classes run the host code
  only, so every engine on the CPU host uses them unchanged.
- `move_slots`: moves KV between slots of one layer's cache (the tree commit:
  the accepted path's KV to the request's contiguous slots). Only this module
  knows the CPU cache layout it needs.

The CPU cache of one layer is [num_blocks, num_kv_heads, block_size,
2 * head_size], viewed as key and value halves; per (block, head) the key is
stored transposed, [head_size, block_size], the value plainly, [block_size,
head_size] (ISAs vec and vec16, locked by
tests/unit/test_tree.py::test_cpu_kv_cache_keeps_keys_transposed_per_block_and_head).
Other ISAs (amx for bf16, neon, ...) have not been read: a tree on one of
them is refused with the ISA named.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

from vllm_vspec.kernels import tree

# The ISAs whose cache layout the reader and move_slots were checked against.
TREE_ISAS = ("vec", "vec16")


@dataclass(frozen=True)
class TreeQueries:
    """The tree queries of one attention-metadata build (one forward).

    rows   the batch rows (request indices of the build, the order of its
           query_start_loc and seq_lens) of the requests with a tree, each at
           most once.
    masks  one bool [q, T] per row: request row r's LAST q query rows are
           tree queries and its LAST T keys (positions seq_len - T ..
           seq_len - 1, including the keys this forward writes) are tree
           keys; masks[k][i, j] says whether tree query i may attend to tree
           key j. Every key before the tree keys (the committed prefix) is
           visible to every tree query; query rows before the tree queries
           keep the host's causal attention.

    The target's verify: q = T = N, the tree's rows of `tree.tree_mask`
    (`for_verify`). The tree drafter at depth d: q = W frontier queries over
    T = 1 + d * W tree keys (root and the nodes drafted so far)."""

    rows: tuple[int, ...]
    masks: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.masks) or len(set(self.rows)) != len(self.rows):
            raise ValueError(f"TreeQueries: rows {self.rows} must be distinct, one per mask "
                             f"({len(self.masks)} masks)")
        for row, mask in zip(self.rows, self.masks):
            if mask.dtype != torch.bool or mask.dim() != 2 or not all(mask.shape):
                raise ValueError(f"TreeQueries: the mask of row {row} must be bool [q, T] "
                                 f"with q, T >= 1, got {mask.dtype} {list(mask.shape)}")

    @classmethod
    def for_verify(cls, rows: list[int], parents: list[torch.Tensor]) -> TreeQueries:
        """The target's verify forward: request row rows[k] scores its whole
        tree (parents[k], int64 [N], topological, NO_NODE at the root) as its
        N query rows, at the N slots after its committed prefix."""
        return cls(tuple(rows), tuple(tree.tree_mask(p.reshape(1, -1))[0] for p in parents))


@dataclass(frozen=True)
class _TreeSpan:
    """One tree request of a build, resolved against the build's batch."""

    row: int
    query_end: int          # one past its last query row (query_start_loc[row + 1])
    seq_len: int            # keys it attends to, its own tree keys last
    mask: torch.Tensor      # bool [q, seq_len]: the prefix columns all True


@dataclass
class TreeCPUAttentionMetadata(CPUAttentionMetadata):
    """The host's metadata plus the build's resolved tree requests."""

    tree_spans: tuple[_TreeSpan, ...] = ()


class TreeCPUAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
    """The host builder; `set_tree` adds tree queries to its next build."""

    # extends CPUAttentionMetadataBuilder.__init__: no tree pending.
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._tree: TreeQueries | None = None

    def set_tree(self, queries: TreeQueries | None) -> None:
        """Tree queries for this builder's next `build` only (None: none).
        Refused on an ISA whose cache layout was not checked."""
        if queries is not None and self.isa not in TREE_ISAS:
            raise NotImplementedError(
                f"vspec tree attention: CPU attention ISA {self.isa!r} is not supported "
                f"(supported: {', '.join(TREE_ISAS)}; its KV cache layout was not checked)")
        self._tree = queries

    # extends CPUAttentionMetadataBuilder.build: attaches the pending tree
    # queries (consumed: a later build, e.g. the drafter's, never sees them).
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        queries, self._tree = self._tree, None
        if queries is None:
            return metadata
        if not metadata.causal:
            raise ValueError("vspec tree attention needs a causal (decoder) forward")
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        spans = []
        for row, mask in zip(queries.rows, queries.masks):
            q, t = mask.shape
            seq_len = seq_lens[row]
            if q > starts[row + 1] - starts[row] or t > seq_len:
                raise ValueError(f"vspec tree attention: row {row} has {starts[row + 1] - starts[row]} "
                                 f"query rows and {seq_len} keys, its tree mask is {q} x {t}")
            prefix = torch.ones(q, seq_len - t, dtype=torch.bool, device=mask.device)
            spans.append(_TreeSpan(row, starts[row + 1], seq_len, torch.cat([prefix, mask], 1)))
        return TreeCPUAttentionMetadata(
            **{f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)},
            tree_spans=tuple(spans))


def read_paged_kv(kv_cache: torch.Tensor, blocks: torch.Tensor, length: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's first `length` keys and values [length, kv_heads,
    head_size] from one layer's CPU cache, its blocks in order (`blocks`, a
    block-table row)."""
    keys, values = _halves(kv_cache)
    used = blocks[:(length + values.shape[2] - 1) // values.shape[2]].long()
    heads, head_size = values.shape[1], values.shape[3]
    k = keys[used].permute(0, 3, 1, 2).reshape(-1, heads, head_size)
    v = values[used].permute(0, 2, 1, 3).reshape(-1, heads, head_size)
    return k[:length], v[:length]


def move_slots(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy the KV of slots `src` to slots `dst` (int64 [M], flat slot
    indices block * block_size + offset) in one layer's CPU cache. All sources
    are read before any destination is written, so a destination may be
    another pair's source (a tree commit moves path node j from slot p + path[j]
    to p + j, and path[j + 1] may equal j)."""
    if src.numel() == 0:
        return
    keys, values = _halves(kv_cache)
    block_size = values.shape[2]
    src_block, src_off = src // block_size, src % block_size
    dst_block, dst_off = dst // block_size, dst % block_size
    moved_keys = keys[src_block, :, :, src_off]          # [M, kv_heads, head_size]
    moved_values = values[src_block, :, src_off]         # [M, kv_heads, head_size]
    keys[dst_block, :, :, dst_off] = moved_keys
    values[dst_block, :, dst_off] = moved_values


def _halves(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [blocks, kv_heads, head_size, block_size], values [blocks,
    kv_heads, block_size, head_size]): views into one layer's CPU cache."""
    num_blocks, heads, block_size, two_head_size = kv_cache.shape
    head_size = two_head_size // 2
    halves = kv_cache.view(num_blocks, heads, 2 * block_size, head_size)
    keys = halves[:, :, :block_size].view(num_blocks, heads, head_size, block_size)
    return keys, halves[:, :, block_size:]


class TreeCPUAttentionBackendImpl(CPUAttentionBackendImpl):
    """The host impl; rows of tree requests are recomputed under their mask."""

    # extends CPUAttentionBackendImpl.forward: the host kernel for the whole
    # batch (causal), then each tree request's tree rows again with its mask.
    # The KV of this forward is already in the cache (the host writes it in
    # do_kv_cache_update, before forward).
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                 output_scale, output_block_scale)
        spans = getattr(attn_metadata, "tree_spans", ())
        if not spans:
            return output
        self._check_tree_support()
        for span in spans:
            q = span.mask.shape[0]
            keys, values = read_paged_kv(kv_cache, attn_metadata.block_table[span.row],
                                         span.seq_len)
            rows = slice(span.query_end - q, span.query_end)
            attended = torch.nn.functional.scaled_dot_product_attention(
                query[rows].transpose(0, 1), keys.transpose(0, 1).to(query.dtype),
                values.transpose(0, 1).to(query.dtype), attn_mask=span.mask,
                scale=self.scale, enable_gqa=self.num_heads != self.num_kv_heads)
            output[rows] = attended.transpose(0, 1).to(output.dtype)
        return output

    def _check_tree_support(self) -> None:
        """The masked path reproduces plain softmax attention only."""
        unsupported = {"alibi_slopes": self.alibi_slopes is not None,
                       "sliding_window": self.sliding_window != -1,
                       "logits_soft_cap": bool(self.logits_soft_cap),
                       "sinks": self.sinks is not None,
                       "kv_cache_dtype": self.is_fp8_kv_cache}
        used = [name for name, on in unsupported.items() if on]
        if used:
            raise NotImplementedError(
                f"vspec tree attention: layers with {', '.join(used)} are not supported "
                "(plain softmax attention over an unquantized cache only)")


class TreeCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's CPU_ATTN backend with draft-tree masks (name unchanged)."""

    # extends CPUAttentionBackend.get_impl_cls: ours (host code without a tree).
    @staticmethod
    def get_impl_cls() -> type[TreeCPUAttentionBackendImpl]:
        return TreeCPUAttentionBackendImpl

    # extends CPUAttentionBackend.get_builder_cls: ours (host code without a tree).
    @staticmethod
    def get_builder_cls() -> type[TreeCPUAttentionMetadataBuilder]:
        return TreeCPUAttentionMetadataBuilder


def tree_builders(runner_attn_groups) -> list[TreeCPUAttentionMetadataBuilder]:
    """Every tree-capable metadata builder among a runner's (or drafter's)
    attention groups (a list of lists of AttentionGroup, or a flat list)."""
    groups = [g for entry in runner_attn_groups
              for g in (entry if isinstance(entry, list) else [entry])]
    return [b for g in groups for b in g.metadata_builders
            if isinstance(b, TreeCPUAttentionMetadataBuilder)]


__all__ = ["TREE_ISAS", "TreeCPUAttentionBackend",
           "TreeCPUAttentionBackendImpl", "TreeCPUAttentionMetadata",
           "TreeCPUAttentionMetadataBuilder", "TreeQueries", "move_slots",
           "read_paged_kv", "tree_builders"]
