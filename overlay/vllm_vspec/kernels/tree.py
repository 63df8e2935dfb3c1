"""Fixed-width EAGLE draft trees: shape, drafting rule, tree mask, strict
greedy acceptance and the inputs of the `vspec::tree_commit` op.

Plain torch, no vLLM import (like kernels/acceptance.py): the maths the
engine's tree steps run (hosts/vllm/tree/: the drafter, verify and commit;
docs/design/eagle-tree.md says which host methods call what), tested against brute
force in tests/unit/test_tree.py.

The tree (one per request and step), with gamma = depth and width = W:
- It is a **beam of W per depth**. Depth 0 is the root: the last committed
  token (the bonus/recovered token of the previous step, not yet in the KV
  cache). Depth d+1 holds the W best children of depth d's W nodes, where a
  child is (parent, token) with the token among its parent's top W draft
  logits, and "best" is the cumulative draft log-probability along the root
  path (`expand_beam`). Ties go to the earlier parent, then to the lower
  token id: the order is total, so the tree is a function of the logits.
- Flattened depth-major, each depth in beam-rank order (best first):
  node 0 is the root, nodes 1 + (d-1)W .. dW are depth d. So N = 1 + gamma*W
  nodes, and a node's parent always has a smaller index (topological order,
  the layout `vspec::tree_commit` expects).
- Width 1 is exactly the linear EAGLE chain: one parent per depth, and its
  top-1 child by logit is `argmax` (both take the first maximal index).
Acceptance is strict greedy by default (`greedy_accept`, lossless); the
opt-in lossy rules of acceptance.py apply per node at draft position
depth - 1 (`rule_matches`, then `accept_paths`).
Node i is verified at RoPE position seq_len + depth(i) but its KV goes to the
slot of position seq_len + i; acceptance then moves the accepted path's KV to
the slots of positions seq_len + 0..L-1 (`vspec::tree_commit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from vllm_vspec.kernels.acceptance import NO_TOKEN, AcceptanceRule, accept_mask

NO_NODE = -1   # parent of the root; padding in paths (token rows use NO_TOKEN)


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees, one per request, same shape for all.

    tokens  int64 [B, N]: node tokens, tokens[:, 0] is the root token.
    parents int64 [B, N]: parent node index, parents[:, 0] == NO_NODE.
    gamma, width: the shape (N == 1 + gamma * width)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    gamma: int
    width: int

    @property
    def num_nodes(self) -> int:
        return num_nodes(self.gamma, self.width)


def num_nodes(gamma: int, width: int) -> int:
    """Nodes of a (gamma, width) tree, root included: what the target verifies."""
    return 1 + gamma * width


def expand_beam(scores: torch.Tensor, logits: torch.Tensor, width: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One depth of the beam: the `width` best children of P frontier nodes.

    scores [B, P]: cumulative draft log-probability of each frontier node
    (0 for the root). logits [B, P, V]: the draft's logits after each
    frontier node. Returns (parent_rank [B, width] in 0..P-1, token
    [B, width], score [B, width]), best first.

    Candidates are each parent's top `width` tokens by logit. The first
    parent's top token always wins rank 0: frontier rank 0 is then the
    linear drafter's chain at every depth, so a tree holds the linear draft
    of the same depth and strict acceptance never commits fewer tokens than
    the linear draft would (a pure beam can drop that chain once two other
    branches score higher). The other `width - 1` are the candidates with
    the highest cumulative log-probability. Both sorts are stable and
    descending, so ties go to the earlier parent, then to the lower token
    id, and with P = width = 1 the token is exactly `logits.argmax(-1)` (the
    linear drafter's choice). Choosing by logit inside a parent (not by
    log-probability) keeps that equality exact: log_softmax subtracts a
    constant that can round two different logits to the same value."""
    vocab = logits.shape[-1]
    if not 1 <= width <= vocab:
        raise ValueError(f"width={width} is not allowed: an integer in [1, {vocab}] "
                         f"(the draft vocabulary size)")
    batch, parents = scores.shape
    child_tokens = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :width]
    child_logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, child_tokens)
    # Flattened parent-major, child rank minor: the stable sort below breaks
    # ties in exactly that order.
    cumulative = (scores.float().unsqueeze(-1) + child_logprobs).reshape(batch, parents * width)
    # Candidate 0 (first parent, its top token) is the chain: rank it first.
    ranking = cumulative.clone()
    ranking[:, 0] = float("inf")
    chosen = torch.sort(ranking, dim=-1, descending=True, stable=True).indices[:, :width]
    return (chosen // width, child_tokens.reshape(batch, -1).gather(1, chosen),
            cumulative.gather(1, chosen))


# logits_fn(tree_so_far, frontier) -> logits [B, P, V]: the draft's logits
# after each frontier node (node indices [B, P] into tree_so_far).
LogitsFn = Callable[[DraftTree, torch.Tensor], torch.Tensor]


def grow_tree(root_tokens: torch.Tensor, root_logits: torch.Tensor, logits_fn: LogitsFn,
              gamma: int, width: int) -> DraftTree:
    """Draft a (gamma, width) tree per request: root_tokens [B], root_logits
    [B, V] (the draft's logits after the root, from the first pass), then
    gamma - 1 calls of `logits_fn`, one per depth, each on the W frontier
    nodes (in the engine: one drafter forward of B * W queries under the tree
    mask). The reference of what the tree drafter must produce."""
    if gamma < 1:
        raise ValueError(f"gamma={gamma} is not allowed: a tree has depth >= 1")
    batch = root_tokens.shape[0]
    tokens = root_tokens.to(torch.int64).reshape(batch, 1)
    parents = torch.full((batch, 1), NO_NODE, dtype=torch.int64)
    frontier = torch.zeros((batch, 1), dtype=torch.int64)
    scores = torch.zeros((batch, 1))
    logits = root_logits.unsqueeze(1)
    for depth in range(1, gamma + 1):
        rank, new_tokens, scores = expand_beam(scores, logits, width)
        tokens = torch.cat([tokens, new_tokens], dim=1)
        parents = torch.cat([parents, frontier.gather(1, rank)], dim=1)
        first = 1 + (depth - 1) * width
        frontier = torch.arange(first, first + width).expand(batch, width)
        if depth < gamma:
            logits = logits_fn(DraftTree(tokens, parents, depth, width), frontier)
    return DraftTree(tokens, parents, gamma, width)


def tree_mask(parents: torch.Tensor) -> torch.Tensor:
    """Bool [B, N, N]: mask[b, i, j] iff node j is node i or one of its
    ancestors, i.e. what node i may attend to inside the tree (it also sees
    the whole committed prefix). Any tree in topological order (parents[b, i]
    < i, NO_NODE at the root); padding nodes may hang anywhere."""
    batch, n = parents.shape
    up = parents.clamp(min=0)   # the root is its own parent: walking up stops there
    node = torch.arange(n).expand(batch, n).clone()
    mask = torch.zeros(batch, n, n, dtype=torch.bool)
    # Every ancestor is at most n - 1 steps up; each round marks one more.
    for _ in range(n):
        mask.scatter_(2, node.unsqueeze(-1), True)
        node = up.gather(1, node)
    return mask


@dataclass(frozen=True)
class Acceptance:
    """Strict greedy acceptance of a batch of trees.

    path     int64 [B, D]: accepted nodes root first (path[:, 0] == 0),
             padded with NO_NODE; D = 1 + the deepest depth.
    length   int64 [B]: L, nodes on the path, root included (>= 1).
    output   int64 [B, D]: the tokens this step emits, in order: the accepted
             draft tokens, then the target's token after the last accepted
             node (bonus or recovered); NO_TOKEN after. L tokens per row, the
             layout of vLLM's rejection-sampler output."""

    path: torch.Tensor
    length: torch.Tensor
    output: torch.Tensor


def greedy_accept(tokens: torch.Tensor, parents: torch.Tensor,
                  target_tokens: torch.Tensor) -> Acceptance:
    """Strict greedy acceptance: the longest root path whose every draft token
    equals the target's argmax at its parent. Lossless: the emitted tokens are
    what target-only greedy decoding would produce.

    tokens, parents [B, N] as in DraftTree (any topological tree);
    target_tokens [B, N]: the target's argmax after each node. When siblings
    carry distinct tokens (every beam tree does) at most one child of a node
    can match, so the path is unique; otherwise the lowest-index deepest node
    wins."""
    return accept_paths(tokens == target_tokens.gather(1, parents.clamp(min=0)),
                        tokens, parents, target_tokens)


def rule_matches(rule: AcceptanceRule, target_logits: torch.Tensor, tokens: torch.Tensor,
                 parents: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
    """Bool [B, N]: whether `rule` (acceptance.py) accepts each node's token
    against the target's logits at its parent. target_logits [B, N, V]: after
    each node; generated [B]: tokens each request had generated before this
    step. A node at depth d is the rule's draft position d - 1, so every
    linear rule (strict prefix, margin from a position, protected ids) means
    the same per root path. The root's entry is unused."""
    batch, n, vocab = target_logits.shape
    parent_logits = target_logits.gather(
        1, parents.clamp(min=0).unsqueeze(-1).expand(batch, n, vocab))
    position = (tree_mask(parents).sum(-1) - 2).clamp(min=0)
    return accept_mask(rule, parent_logits.reshape(batch * n, vocab), tokens.reshape(-1),
                       position.reshape(-1),
                       generated.to(torch.int64).repeat_interleave(n)).reshape(batch, n)


def accept_paths(matches: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                 target_tokens: torch.Tensor) -> Acceptance:
    """The longest root path of nodes that all match (matches [B, N], from
    strict equality or `rule_matches`; the root's entry is ignored), lowest
    index on equal depths; the emitted token after it is the target's argmax
    there (bonus or recovered), as on the linear path."""
    batch, n = tokens.shape
    mask = tree_mask(parents)
    depth = mask.sum(-1) - 1
    # A node is accepted iff it and all its ancestors (root excepted) match.
    matches = matches.clone()
    matches[:, 0] = True
    accepted = ~(mask & ~matches.unsqueeze(1)).any(-1)
    # Deepest accepted node, lowest index on ties (argmax takes the first).
    key = torch.where(accepted, depth, -1) * n + (n - 1 - torch.arange(n))
    last = key.argmax(-1)
    length = depth.gather(1, last.unsqueeze(1)).squeeze(1) + 1
    on_path = mask[torch.arange(batch), last]
    width = int(depth.max()) + 1
    # Scatter each path node to its depth; off-path nodes go to a spare column.
    path = torch.full((batch, width + 1), NO_NODE, dtype=torch.int64)
    path.scatter_(1, torch.where(on_path, depth, width), torch.arange(n).expand(batch, n))
    path = path[:, :width]
    output = torch.full((batch, width), NO_TOKEN, dtype=torch.int64)
    steps = torch.arange(width).expand(batch, width)
    drafts = tokens.gather(1, path[:, 1:].clamp(min=0))
    output[:, :-1] = torch.where(steps[:, 1:] < length.unsqueeze(1), drafts, NO_TOKEN)
    bonus = target_tokens.gather(1, last.unsqueeze(1)).squeeze(1)
    output.scatter_(1, (length - 1).unsqueeze(1), bonus.unsqueeze(1).to(output.dtype))
    return Acceptance(path, length, output)


def tree_commit_args(acceptance: Acceptance, target_tokens: torch.Tensor,
                     slot_mapping: torch.Tensor, seq_lens: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The arguments of `torch.ops.vspec.tree_commit` (csrc/ops.h) for an
    acceptance: (path int32 [B, D], target_tokens int32 [B, N], slots int64
    [B, N], seq_lens int32 [B]). slot_mapping: the verify forward's slots,
    request-major, N per request (node i of request b at b * N + i);
    seq_lens [B]: tokens in the KV cache before the root (the root's
    position). The op returns seq_lens + L, the bonus token and the KV moves
    (src, dst) that make the accepted path contiguous."""
    batch, n = target_tokens.shape
    return (acceptance.path.to(torch.int32), target_tokens.to(torch.int32),
            slot_mapping.to(torch.int64).reshape(batch, n), seq_lens.to(torch.int32))


__all__ = ["Acceptance", "DraftTree", "NO_NODE", "accept_paths",
           "expand_beam", "greedy_accept", "grow_tree", "num_nodes",
           "rule_matches", "tree_commit_args", "tree_mask"]
