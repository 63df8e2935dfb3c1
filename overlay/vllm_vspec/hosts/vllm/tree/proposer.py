"""Tree drafting for vspec's EAGLE proposer (docs/design/eagle-tree.md 4.4).

`TreeDrafting.propose_tree(gamma, width, **propose kwargs)` drafts a
(gamma, width) beam per request (tree.py: the layout, the beam rule and
`grow_tree`, which this drives) and returns the draft list (tokens [B,
gamma * W], depth-major, beam-rank order) and the parents [B, 1 + gamma * W].
The EAGLE proposer (proposers.VSpecEagleProposer) owns one as `tree`.

- First pass: the host's own propose, with num_speculative_tokens 1, on
  the same inputs as a linear step (the rows of the verify forward the
  runner hands over). While it runs, the proposer's
  `set_inputs_first_pass` hands over the row each request samples from
  (`first_pass_inputs`: its position p, the root row, whose input is the
  root token), and the drafting keeps that row's hidden state and draft
  logits, as an observer of the proposer's greedy sample (`sampled`), from
  which depth 1 is drafted.
- Depth d + 1 (d = 1 .. gamma - 1): one drafter forward of B * W queries,
  the W depth-d nodes of each request: input token the node's, hidden state
  the output at its parent (EAGLE-1 feeds the state its LM head read), RoPE
  position p + d, KV slot of position p + i (i the node index, so every node
  has its own slot and width 1 uses the linear drafter's p + d), and the
  tree mask over the request's tree keys (root and nodes 1 .. d * W, slots
  p .. p + d * W; everything before p is the committed prefix) set on the
  drafter's tree attention builders (tree_attention.TreeQueries). Width 1 is
  a chain, whose mask is causal: it runs the host kernel with no tree
  queries, and drafts what the linear drafter drafts (tested).
- The drafter KV written for tree nodes is scratch: the next first pass
  rewrites every position the target accepted.

`propose_next_as_tree(W)` turns the proposer's next `propose` (the host
runner's call, with the inputs it prepares) into `propose_tree` and
`take_tree` returns what it drafted: how tree/eagle_drafter.EagleTreeDrafter
joins the runner's tree steps.

`check_tree_drafting` names what tree drafting cannot do (section 4.4.5);
propose_tree runs it for width > 1, and the runner runs it at start-up when
`tree_width` > 1 (section 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

from vllm_vspec.kernels import tree
from vllm_vspec.hosts.draft_observers import DraftObserver
from vllm_vspec.hosts.vllm.drafter_batch import drafter_batch, run_pass
from vllm_vspec.hosts.vllm.tree.attention import TreeQueries, tree_builders
from vllm_vspec.config import VSpecConfigError, tree_refusal
from vllm_vspec.kernels.draft_head import DraftHead


@dataclass
class _FirstPass:
    """What the host's first pass of a tree step leaves for the tree passes."""

    positions: torch.Tensor | None = None            # [B] int64: p, the root row's position
    cad: CommonAttentionMetadata | None = None       # the first pass's metadata
    hidden: torch.Tensor | None = None               # [B, H] output at the root row
    logits: torch.Tensor | None = None               # [B, V'] draft logits there
    ids: torch.Tensor | None = None                  # token id of each logits column (None: j)


def tree_drafting_refusal(proposer) -> str | None:
    """Why `proposer` cannot draft trees wider than 1, or None: the
    config.TREE_REFUSALS its own options meet."""
    spec = proposer.speculative_config
    if getattr(proposer, "tree", None) is None:
        return f"only with speculative method eagle (this engine drafts with {spec.method})"
    return tree_refusal(
        method=spec.method, parallel_drafting=proposer.parallel_drafting,
        multimodal=proposer.supports_mm_inputs, mrope=proposer.uses_mrope,
        partial_logits=proposer.use_local_argmax_reduction or proposer.use_heterogeneous_vocab,
        entropy_stop=proposer.entropy is not None, traces=proposer.traces is not None,
        async_scheduling=proposer.vllm_config.scheduler_config.async_scheduling)


def check_tree_drafting(proposer, width: int) -> None:
    """Raise VSpecConfigError("tree_width", width, ...) when `proposer`
    cannot draft trees of `width`."""
    reason = None if width == 1 else tree_drafting_refusal(proposer)
    if reason is not None:
        raise VSpecConfigError("tree_width", width, reason)


class TreeDrafting(DraftObserver):
    """Tree steps of an EAGLE proposer (module docstring). As an observer of
    the proposer's greedy sample it reads the logits only during a tree
    step's first pass, which it keeps."""

    def __init__(self, proposer: Any) -> None:
        self.proposer = proposer
        self._first_pass: _FirstPass | None = None
        self._next_width: int | None = None      # set by propose_next_as_tree
        self._tree: tree.DraftTree | None = None  # what that propose drafted

    def propose_next_as_tree(self, width: int) -> None:
        """Make the proposer's next `propose` call (the host runner's, with
        the inputs it prepares) draft a tree of `width` instead; `take_tree`
        returns it."""
        self._next_width, self._tree = width, None

    def take_tree(self) -> tree.DraftTree | None:
        """The tree the last `propose_next_as_tree` call drafted (root
        included), once; None if no propose ran since."""
        drafted, self._tree, self._next_width = self._tree, None, None
        return drafted

    def take_width(self) -> int | None:
        """The width propose_next_as_tree asked the next propose call for
        (None: a linear step), once."""
        width, self._next_width = self._next_width, None
        return width

    def propose_as_tree(self, width: int, kwargs: dict) -> torch.Tensor:
        """The propose call propose_next_as_tree asked for: the host gets the
        tree's draft list (node i > 0 is entry i - 1). `kwargs`: the runner's
        propose arguments."""
        kwargs = dict(kwargs)
        gamma = kwargs.pop("num_speculative_tokens")
        tokens, parents = self.propose_tree(gamma, width, **kwargs)
        root = kwargs["next_token_ids"].to(tokens.dtype).reshape(-1, 1)
        self._tree = tree.DraftTree(torch.cat([root, tokens], 1), parents, gamma, width)
        return tokens

    def propose_tree(self, num_speculative_tokens: int, width: int, **kwargs
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft a (gamma = num_speculative_tokens, width) tree per request
        from `propose`'s keyword arguments (the runner's, unchanged). Returns
        (tokens int64 [B, gamma * width], parents int64 [B, 1 + gamma *
        width]) in tree.py's layout; the root (node 0) is the request's
        next token (`next_token_ids`)."""
        p = self.proposer
        gamma = num_speculative_tokens
        self._check_tree_step(gamma, width, kwargs)
        first = _FirstPass()
        self._first_pass = first
        try:
            # The host's first pass; its one draft token is depth 1's best.
            p.host_propose(num_speculative_tokens=min(gamma, 1), **kwargs)
        finally:
            self._first_pass = None
        batch = kwargs["next_token_ids"].shape[0]
        if gamma == 0:
            return (torch.empty(batch, 0, dtype=torch.int64, device=p.device),
                    torch.full((batch, 1), tree.NO_NODE, dtype=torch.int64, device=p.device))
        nodes = tree.num_nodes(gamma, width)
        # node_hidden[:, i]: the drafter's output at node i (its children's input).
        node_hidden = first.hidden.new_empty(batch, nodes, first.hidden.shape[-1])
        node_hidden[:, 0] = first.hidden
        every = torch.arange(batch, device=p.device).unsqueeze(1)

        def depth_logits(drafted: tree.DraftTree, frontier: torch.Tensor) -> torch.Tensor:
            parent = drafted.parents.gather(1, frontier)
            tokens = DraftHead.to_full_ids(drafted.tokens.gather(1, frontier), first.ids)
            out, logits = self._tree_pass(first, tokens, node_hidden[every, parent],
                                          drafted.parents, drafted.gamma, width)
            node_hidden[every, frontier] = out
            return logits

        root = kwargs["next_token_ids"].to(torch.int64)
        drafted = tree.grow_tree(root, first.logits, depth_logits, gamma, width)
        return DraftHead.to_full_ids(drafted.tokens[:, 1:], first.ids), drafted.parents

    def _check_tree_step(self, gamma: int, width: int, kwargs: dict) -> None:
        """The runner's side of the contract: a feasible shape, a greedy batch."""
        p = self.proposer
        check_tree_drafting(p, width)
        k = p.speculative_config.num_speculative_tokens
        if gamma < 0 or width < 1 or gamma * width > k:
            # K sizes the drafter's buffers and the lookahead KV slots.
            raise ValueError(f"tree (gamma={gamma}, width={width}) is not allowed: "
                             f"gamma >= 0, width >= 1, gamma * width <= "
                             f"num_speculative_tokens={k}")
        batch = kwargs["next_token_ids"].shape[0]
        if batch * width > p.max_num_tokens:
            raise ValueError(f"tree width {width} at batch {batch} exceeds the drafter's "
                             f"{p.max_num_tokens} tokens per pass")
        if p._enable_probabilistic_draft_probs and not kwargs["sampling_metadata"].all_greedy:
            raise ValueError("tree drafting is greedy (top-width draft logits): a batch "
                             "with a sampled request drafts linearly (docs/design/eagle-tree.md 4.2)")
        if width > 1 and not tree_builders(p.draft_attn_groups):
            raise RuntimeError("tree drafting needs vspec's tree attention backend "
                               "(tree/attention.py) on the drafter's layers")

    def first_pass_inputs(self, rows: torch.Tensor, cad: CommonAttentionMetadata) -> None:
        """From the proposer's set_inputs_first_pass (`rows`: each request's
        sampled row): in a tree step, keeps their positions and the step's
        metadata."""
        first = self._first_pass
        if first is not None:
            first.cad = cad
            first.positions = self.proposer.positions[rows].to(torch.int64)

    @property
    def reads_logits(self) -> bool:
        return self._first_pass is not None

    # The proposer's greedy sample in a tree step's first pass: the root
    # row's hidden state and draft logits.
    def sampled(self, hidden: torch.Tensor, logits: torch.Tensor,
                ids: torch.Tensor | None) -> None:
        first = self._first_pass
        if first is not None:
            first.hidden, first.logits, first.ids = hidden, logits, ids

    def _tree_pass(self, first: _FirstPass, tokens: torch.Tensor, hidden: torch.Tensor,
                   parents: torch.Tensor, depth: int, width: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter forward over the W depth-`depth` nodes of each request:
        tokens [B, W] (full-vocabulary ids), hidden [B, W, H] (their
        parents' outputs), parents [B, 1 + depth * W] (the tree so far).
        Returns (output hidden [B, W, H], draft logits [B, W, V'])."""
        p = self.proposer
        batch = tokens.shape[0]
        n = batch * width
        block_table = first.cad.block_table_tensor[:batch]
        layout = pass_layout(first.positions, block_table, p.block_size,
                             p.max_model_len, depth, width)
        p.input_ids[:n] = tokens.reshape(n).to(torch.int32)
        p.positions[:n] = layout.positions.reshape(n)
        p.hidden_states[:n] = hidden.reshape(n, -1)
        cad = drafter_batch(first.cad, query_lens=torch.full((batch,), width, dtype=torch.int32),
                            seq_lens=layout.seq_lens, block_table=block_table,
                            slots=layout.slots, prefilling=False)
        # A chain's mask is causal: width 1 runs the host kernel as it is.
        builders = tree_builders(p.draft_attn_groups) if width > 1 else []
        queries = layout.queries(parents) if builders else None
        for builder in builders:
            builder.set_tree(queries)
        try:
            last, _ = run_pass(p, cad, n, layout.slots, draft_index=depth)
        finally:
            for builder in builders:
                builder.set_tree(None)
        out = last[:n]
        logits, _ = p._draft_logits(out)
        return out.reshape(batch, width, -1), logits.reshape(batch, width, -1)


@dataclass(frozen=True)
class PassLayout:
    """Where the depth-d nodes of one tree pass go (section 4.4, step 3).

    positions  int64 [B, W]: RoPE position p + d (0 past max_model_len).
    slots      int64 [B * W]: KV slot of position p + i, i the node index
               (PADDING_SLOT_ID past max_model_len: no write).
    tree_keys  int64 [B]: the request's tree keys, root and nodes 1 .. d * W
               at positions p .. p + d * W, cut at max_model_len.
    seq_lens   int32 [B], on the host: p + tree_keys, every key the pass reads.
    depth, width: the pass."""

    positions: torch.Tensor
    slots: torch.Tensor
    tree_keys: torch.Tensor
    seq_lens: torch.Tensor
    depth: int
    width: int

    def queries(self, parents: torch.Tensor) -> TreeQueries:
        """The tree queries of the pass: per request, the depth-d rows of
        tree.tree_mask (parents [B, 1 + d * W]) over its tree keys. The root
        (key 0) is every node's ancestor, so no row is empty."""
        masks = tree.tree_mask(parents)[:, depth_nodes(self.depth, self.width)]
        return TreeQueries(tuple(range(masks.shape[0])), tuple(
            m[:, :t] for m, t in zip(masks, self.tree_keys.tolist())))


def depth_nodes(depth: int, width: int) -> torch.Tensor:
    """int64 [W]: the node indices of depth `depth` (tree.py's layout)."""
    return 1 + (depth - 1) * width + torch.arange(width)


def pass_layout(positions: torch.Tensor, block_table: torch.Tensor, block_size: int,
                max_model_len: int, depth: int, width: int) -> PassLayout:
    """The layout of the pass over depth-`depth` nodes for requests whose
    root row sits at `positions` (p, int64 [B]), with `block_table` [B,
    blocks] (the KV manager's, as the host's linear step reads it). Past
    max_model_len the target never verifies a node (the host cuts the draft
    list there): such a node writes no KV and takes position 0, as the
    host's first linear step past it does, and no key past max_model_len is
    read."""
    p = positions.unsqueeze(1)
    batch = p.shape[0]
    rope = (p + depth).expand(batch, width)
    rope = torch.where(rope < max_model_len, rope, 0)
    at = p + depth_nodes(depth, width).to(p.device)
    in_range = at.clamp(max=max_model_len - 1)
    slots = (block_table.gather(1, in_range // block_size).long() * block_size
             + in_range % block_size)
    slots = torch.where(at < max_model_len, slots, PADDING_SLOT_ID).reshape(batch * width)
    tree_keys = (max_model_len - positions).clamp(max=1 + depth * width)
    return PassLayout(rope, slots, tree_keys, (positions + tree_keys).to(torch.int32).cpu(),
                      depth, width)
