"""Target-side draft trees in the V1 model runner: verify and commit
(docs/design/eagle-tree.md 4.3).

A tree drafter (`TreeDrafter`: the EAGLE tree drafter, or a test double)
returns, per request, a tree whose depth-major layout (tree.py) flattens into
the host's ordinary draft list: node i > 0 is list entry i - 1. The host
schedules that list like any draft, so the runner only changes what a draft
list *means*. `TreeVerify` is that change, a part the runner holds (`tree`)
and calls from the host methods it extends (model_runner.py):

- hand over: a tree step's drafts reach the scheduler as TreeDraftTokenIds,
  which say the width the runner drafted them with (the scheduler reports
  the verified trees' depths from it).
- propose (`propose_draft_token_ids`): asks the tree drafter for the
  step's (gamma, width), which the scheduler chose width 1 where the batch
  rules a tree out (`request_allows_tree`), and keeps each request's
  parents until its verify.
- verify inputs (`_prepare_inputs`): node i keeps the slot of position
  seq_len + i (host code) but is placed at RoPE position seq_len + depth(i);
  the tree attention builders get each tree's mask (tree/attention.py).
  Requests with a linear draft in the same step are chains (width 1).
- sample (`sample_tree`): strict greedy acceptance per tree
  (tree.greedy_accept), or the engine's lossy rule per node (tree.rule_matches,
  then tree.accept_paths), in the rejection sampler's output layout; requests
  without drafts are sampled by the host's sampler exactly as its rejection
  sampler samples them.
- commit: `vspec::tree_commit` (ops.py) gives the KV moves that make each
  accepted path contiguous; `tree_attention.move_slots` applies them to every
  target layer. After the moves the cache holds what a linear step accepting
  the same tokens holds, so the scheduler's bookkeeping (num_computed_tokens
  -= rejected, prefix-cache hashing, preemption) is unchanged host code.

Trees are lossless for pure-greedy batches only (design 4.2): temperature 0,
no logprobs, penalties, bad words, allowed-token masks, logit bias or pending
min_tokens (their logits depend on the tokens before each position, which in
a tree are a node's ancestors). Elsewhere the scheduler's width is 1 and
the step is linear. A lossy rule (`relaxed_topk`, `margin`) judges every root
path as it would judge that path drafted linearly: a node at depth d is the
chain's draft position d - 1. The synchronous CPU host only (no async
scheduling, M-RoPE).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.sample.sampler import _SAMPLING_EPS
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_vspec.kernels import ops, tree
from vllm_vspec.kernels.acceptance import NO_TOKEN, AcceptanceRule
from vllm_vspec.hosts.vllm.rejection_sampler import tokens_generated
from vllm_vspec.hosts.vllm.tree.attention import TreeQueries, move_slots, tree_builders


class TreeDrafter(Protocol):
    """What the runner asks for a tree step."""

    def propose_tree(self, runner: Any, gamma: int, width: int, **propose_args: Any
                     ) -> tree.DraftTree | None:
        """Trees of depth `gamma` and width `width` (the scheduler's arm for
        the step; gamma * width <= the engine's num_speculative_tokens) for
        the runner's batch rows 0..B-1 (input_batch order), or None to draft
        linearly this step.
        `propose_args` are the host's propose_draft_token_ids arguments, by
        name (scheduler_output, sampled_token_ids, sampling_metadata,
        hidden_states, sample_hidden_states, aux_hidden_states,
        spec_decode_metadata, common_attn_metadata, slot_mappings); a tree
        step's spec_decode_metadata is a TreeSpecDecodeMetadata whose
        `acceptance` holds the paths just accepted."""


@dataclass
class TreeSpecDecodeMetadata(SpecDecodeMetadata):
    """The host's spec-decode metadata plus the step's trees. Every request
    with drafts is a tree (a linear draft is a chain); rows are in batch
    order and padded to the largest tree with NO_TOKEN nodes hanging from
    the root.

    rows       batch rows with drafts, [R]
    tokens     int64 [R, N]: node tokens, the root first
    parents    int64 [R, N]
    seq_lens   int64 [R]: the root's position (tokens in the KV cache before it)
    slots      per KV cache group, int64 [R, N]: the slot node i was written to
    acceptance tree.Acceptance of the step, set by `sample_tree`"""

    rows: tuple[int, ...] = ()
    tokens: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    slots: tuple[torch.Tensor, ...] = ()
    acceptance: tree.Acceptance | None = None


@dataclass
class TreeDraftTokenIds(DraftTokenIds):
    """The drafts of a tree step as the runner hands them to the scheduler,
    with the tree width it drafted them with (VSpecScheduler: the step that
    verifies them reports their depths). Other steps hand plain
    DraftTokenIds: linear drafts, width 1."""

    width: int = 1


def request_allows_tree(params, num_output_tokens: int) -> bool:
    """Whether one request's drafts may be a tree without changing its
    output: greedy, no logprobs, and none of the logits processing the host
    applies per linear draft position (penalties, bad words, allowed ids, a
    logit bias, structured output, a min_tokens not yet reached). The
    scheduler asks it per request to choose the step's width
    (BatchState.tree_allowed); the runner drafts the width it is handed."""
    return (params is not None and params.temperature < _SAMPLING_EPS
            and params.logprobs is None and not params.logit_bias
            and not params.bad_words and not params.allowed_token_ids
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
            and params.repetition_penalty == 1.0 and params.structured_outputs is None
            and num_output_tokens >= params.min_tokens)


# The host's propose_draft_token_ids arguments, in its order (TreeDrafter.propose_tree).
PROPOSE_ARGS = ("scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states",
                "sample_hidden_states", "aux_hidden_states", "spec_decode_metadata",
                "common_attn_metadata", "slot_mappings")


class TreeVerify:
    """Draft trees in vspec's V1 model runner: its `tree` part when the
    engine drafts trees (tree_width > 1, CPU host). Each method says the
    runner method that calls it (model_runner.py states their order)."""

    def __init__(self, drafter: TreeDrafter) -> None:
        self.drafter = drafter
        # req_id -> (tokens [N], parents [N]) of the trees handed to the scheduler.
        self.pending: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.width = 1     # the width of the last proposal (1: linear)
        self._target_layers: set[str] | None = None

    def drafter_hidden_states(self, runner: Any, metadata: Any,
                              hidden_states: torch.Tensor) -> torch.Tensor:
        """propose_draft_token_ids, first: after a tree step the drafter
        reads the verify forward as if it had been linear (accepted_paths_first)."""
        if isinstance(metadata, TreeSpecDecodeMetadata):
            return accepted_paths_first(runner, metadata, hidden_states)
        return hidden_states

    def propose(self, runner: Any, host_args: tuple, kwargs: dict) -> torch.Tensor | None:
        """propose_draft_token_ids, then: a tree step's draft list, each
        request's tree flattened (node i > 0 is entry i - 1), or None to
        draft linearly. `host_args` are the host method's arguments, in its
        order, with the hidden states drafter_hidden_states gave."""
        self.pending, self.width = {}, 1
        scheduler_output = host_args[0]
        gamma = scheduler_output.num_spec_tokens_to_schedule
        if not gamma:
            return None
        # VSpecScheduler's arm for the step (1 from any other scheduler).
        width = getattr(scheduler_output, "vspec_tree_width", 1)
        req_ids = runner.input_batch.req_ids[:runner.input_batch.num_reqs]
        drafted = self.drafter.propose_tree(
            runner, gamma, width, **dict(zip(PROPOSE_ARGS, host_args)), **kwargs)
        if drafted is None:
            return None
        k = runner.speculative_config.num_speculative_tokens
        if drafted.num_nodes - 1 > k or drafted.tokens.shape[0] != len(req_ids):
            raise ValueError(
                f"tree drafter: a (gamma={drafted.gamma}, width={drafted.width}) tree for "
                f"{drafted.tokens.shape[0]} rows; allowed: gamma * width <= "
                f"num_speculative_tokens={k}, one tree per batch row ({len(req_ids)})")
        tokens, parents = drafted.tokens.cpu(), drafted.parents.cpu()
        self.pending = {r: (tokens[i], parents[i]) for i, r in enumerate(req_ids)}
        self.width = drafted.width
        # A tensor, as the host drafters return (copied to its [B, K] host buffer).
        return tokens[:, 1:].to(runner.device)

    def handover(self, out: DraftTokenIds | None) -> DraftTokenIds | None:
        """take_draft_token_ids: a tree step's drafts say the width they
        were drafted with."""
        if out is None or self.width == 1:
            return out
        return TreeDraftTokenIds(out.req_ids, out.draft_token_ids, self.width)

    def verify_inputs(self, runner: Any, scheduler_output: Any, num_scheduled_tokens: Any,
                      metadata: Any) -> Any:
        """_prepare_inputs: on a step that verifies trees, tree positions,
        the tree attention masks and TreeSpecDecodeMetadata (tree_step);
        else the host's metadata."""
        trees, self.pending = self.pending, {}
        if metadata is None or not trees or not any(
                r in trees for r in scheduler_output.scheduled_spec_decode_tokens):
            return metadata
        return tree_step(runner, scheduler_output, num_scheduled_tokens, metadata, trees)

    def sample(self, runner: Any, logits: torch.Tensor,
               metadata: TreeSpecDecodeMetadata) -> Any:
        """_sample, for a tree step: sample_tree (with the rejection
        sampler's rule), then the commit (KV moves) before anything reads
        the cache again."""
        # vspec's runner always has a VSpecRejectionSampler; any other host
        # sampler verifies strictly.
        rule = getattr(runner.rejection_sampler, "rule", None)
        generated = None if rule is None or rule.lossless else tokens_generated(
            runner.input_batch, metadata.rows)
        output = sample_tree(runner.sampler, logits, metadata,
                             runner.input_batch.sampling_metadata, rule, generated)
        if self._target_layers is None:   # the KV cache exists by the first tree step
            self._target_layers = target_attention_layers(runner)
        commit_trees(runner, metadata, self._target_layers)
        return output


def accepted_paths_first(runner: Any, metadata: TreeSpecDecodeMetadata,
                         hidden_states: torch.Tensor) -> torch.Tensor:
    """After a tree step, hand the drafter the verify forward as if it had
    been linear: each tree request's rows reordered to its accepted path
    first (path node j at row j, the rest after it), at the linear
    positions seq_len + j. The path's KV now sits at the slots of those
    positions (the commit moved it), and the slot mapping already reads
    row j -> slot of seq_len + j, so the host's first draft pass writes
    the drafter's KV where the path is and samples from row L - 1, the
    last accepted node (the host's padded first pass picks row
    num_draft - rejected). Rows past the path are scratch, as rejected
    rows are on the linear path. Returns the reordered hidden states;
    input ids and positions are rewritten in the runner's buffers (the
    target forward that read them is done)."""
    total = int(runner.query_start_loc.np[runner.input_batch.num_reqs])
    order = torch.arange(total)
    starts = runner.query_start_loc.np
    acceptance = metadata.acceptance
    for k, row in enumerate(metadata.rows):
        n = int((metadata.tokens[k] != NO_TOKEN).sum())
        length = int(acceptance.length[k])
        path = acceptance.path[k, :length]
        rest = torch.ones(n, dtype=torch.bool)
        rest[path] = False
        start = int(starts[row])
        order[start:start + n] = start + torch.cat([path, torch.nonzero(rest).flatten()])
        runner.positions[start:start + n] = metadata.seq_lens[k] + torch.arange(n)
    runner.input_ids.gpu[:total] = runner.input_ids.gpu[:total][order.to(runner.device)]
    reordered = hidden_states.clone()
    reordered[:total] = hidden_states[:total][order.to(hidden_states.device)]
    return reordered


def tree_step(runner: Any, scheduler_output: Any, num_scheduled_tokens: Any, metadata: Any,
              trees: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> TreeSpecDecodeMetadata:
    """The verify inputs of a step with trees (after the host's
    _prepare_inputs): each tree's nodes at RoPE position seq_len + depth,
    its mask for the tree attention builders, the step's trees as
    TreeSpecDecodeMetadata (a linear draft is a chain)."""
    batch = runner.input_batch
    drafts = scheduler_output.scheduled_spec_decode_tokens
    rows = sorted(batch.req_id_to_index[r] for r in drafts if drafts[r])
    starts = runner.query_start_loc.np
    computed = batch.num_computed_tokens_cpu
    per_row = []
    for row in rows:
        req_id = batch.req_ids[row]
        draft = drafts[req_id]
        n = 1 + len(draft)
        if num_scheduled_tokens[row] != n:
            raise RuntimeError(f"tree verify: request {req_id} has {len(draft)} drafts "
                               f"but {num_scheduled_tokens[row]} scheduled tokens")
        root = int(runner.input_ids.cpu[starts[row]])
        if req_id in trees:
            # The scheduler may cut the list (token budget, max_model_len):
            # a prefix of the depth-major layout is still a topological tree.
            tokens, parents = trees[req_id][0][:n], trees[req_id][1][:n]
            if tokens[1:].tolist() != list(draft):
                raise RuntimeError(f"tree verify: request {req_id} was scheduled drafts "
                                   "that are not the tree proposed for it")
        else:
            tokens = torch.tensor([root, *draft])
            parents = torch.arange(-1, n - 1)
        per_row.append((row, tokens, parents))
    width = max(len(t) for _, t, _ in per_row)
    tokens = torch.full((len(rows), width), NO_TOKEN, dtype=torch.int64)
    parents = torch.zeros((len(rows), width), dtype=torch.int64)
    masks, tree_rows = [], []
    for k, (row, t, p) in enumerate(per_row):
        n = len(t)
        tokens[k, :n], parents[k, :n] = t, p
        if torch.equal(p, torch.arange(-1, n - 1)):
            continue  # a chain: host positions and causal attention are already right
        depth = tree.tree_mask(p.unsqueeze(0))[0].sum(-1) - 1
        runner.positions[starts[row]:starts[row] + n] = int(computed[row]) + depth
        tree_rows.append(row)
        masks.append(p)
    if tree_rows:
        queries = TreeQueries.for_verify(tree_rows, masks)
        builders = tree_builders(runner.attn_groups)
        if not builders:
            raise NotImplementedError("vspec draft trees: this host's attention backend "
                                      "has no tree masks (CPU_ATTN only)")
        for builder in builders:
            builder.set_tree(queries)
    query_rows = torch.tensor([starts[row] for row in rows]).unsqueeze(1) + torch.arange(width)
    valid = tokens != NO_TOKEN
    slots = tuple(torch.where(valid, table.slot_mapping.cpu[query_rows.clamp(
        max=int(starts[batch.num_reqs]) - 1)].long(), -1)
        for table in batch.block_table.block_tables)
    return TreeSpecDecodeMetadata(
        **{f.name: getattr(metadata, f.name) for f in dataclasses.fields(SpecDecodeMetadata)},
        rows=tuple(rows), tokens=tokens, parents=parents,
        seq_lens=torch.tensor([int(computed[row]) for row in rows]), slots=slots)


def commit_trees(runner: Any, metadata: TreeSpecDecodeMetadata, target_layers: set[str]) -> None:
    """Make each accepted path's KV contiguous in the `target_layers`
    (vspec::tree_commit's moves, applied by move_slots)."""
    acceptance = metadata.acceptance
    context = runner.compilation_config.static_forward_context
    for group, slots in zip(runner.kv_cache_config.kv_cache_groups, metadata.slots):
        target = torch.full_like(metadata.tokens, NO_TOKEN, dtype=torch.int32)
        _, _, src, dst = ops.load().tree_commit(*tree.tree_commit_args(
            acceptance, target, slots.flatten(), metadata.seq_lens))
        moves = src >= 0
        if not moves.any():
            continue
        src, dst = src[moves], dst[moves]
        for name in group.layer_names:
            if name in target_layers:
                move_slots(context[name].kv_cache, src, dst)


def target_attention_layers(runner: Any) -> set[str]:
    """The target's attention layers (the drafter's KV at tree nodes is
    the drafter's business: it rewrites the accepted positions), once the
    KV cache exists."""
    drafter_layers = getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", ())
    return {name for group in runner.kv_cache_config.kv_cache_groups
            for name in group.layer_names} - set(drafter_layers)


def sample_tree(sampler, logits: torch.Tensor, metadata: TreeSpecDecodeMetadata,
                sampling_metadata, rule: AcceptanceRule | None = None,
                generated: torch.Tensor | None = None) -> Any:
    """The rejection sampler's output for a tree step: [B, max_spec_len + 1]
    int32, each row the request's committed tokens then -1. Requests without
    drafts get the host sampler's token for their one row (what vLLM's
    rejection sampler emits for them, its bonus token). Tree rows get
    tree.greedy_accept against the target's argmax at every node when `rule`
    is None or strict; with a lossy rule, its per-node decision on the
    parent's logits row (tree.rule_matches, `generated` [R]: per tree row, the
    count `tokens_generated` gives; None counts every request as fresh, so
    the strict prefix keeps acceptance strict) on the deepest root path that
    passes (tree.accept_paths). Either way the token after the path is the
    target's argmax at its last node. Sets `metadata.acceptance`."""
    from vllm.v1.outputs import SamplerOutput

    if sampling_metadata.max_num_logprobs is not None:
        raise NotImplementedError("vspec draft trees: logprobs are not supported")
    temperature = sampling_metadata.temperature
    rows = list(metadata.rows)
    if not sampling_metadata.all_greedy and (temperature[rows] >= _SAMPLING_EPS).any():
        raise RuntimeError("vspec draft trees: a request with drafts is not greedy")
    bonus = sampler(logits=logits[metadata.bonus_logits_indices],
                    sampling_metadata=sampling_metadata,
                    predict_bonus_token=True).sampled_token_ids.flatten()
    batch = bonus.shape[0]
    out = torch.full((batch, metadata.max_spec_len + 1), -1, dtype=torch.int32,
                     device=logits.device)
    out[:, 0] = bonus.to(torch.int32)
    # Each tree's nodes are its logits rows, in order, ending at its bonus row.
    first = metadata.bonus_logits_indices[rows].long() - torch.tensor(
        metadata.num_draft_tokens, device=logits.device)[rows]
    node_rows = (first.unsqueeze(1) + torch.arange(metadata.tokens.shape[1], device=logits.device))
    valid = metadata.tokens != NO_TOKEN
    argmax = logits.argmax(dim=-1)
    node_rows = node_rows.clamp(max=logits.shape[0] - 1)
    target = torch.where(valid, argmax[node_rows], NO_TOKEN)
    if rule is None or rule.lossless:
        acceptance = tree.greedy_accept(metadata.tokens, metadata.parents, target)
    else:
        if generated is None:
            generated = torch.zeros(len(rows), dtype=torch.int64)
        # NO_TOKEN nodes are negative ids: accept_mask never accepts them.
        matches = tree.rule_matches(rule, logits[node_rows], metadata.tokens, metadata.parents,
                                    generated)
        acceptance = tree.accept_paths(matches, metadata.tokens, metadata.parents, target)
    metadata.acceptance = acceptance
    emitted = acceptance.output.shape[1]
    out[rows, :emitted] = acceptance.output.to(torch.int32)
    return SamplerOutput(sampled_token_ids=out, logprobs_tensors=None)


__all__ = ["PROPOSE_ARGS", "TreeDraftTokenIds", "TreeDrafter", "TreeSpecDecodeMetadata",
           "TreeVerify", "accepted_paths_first", "commit_trees", "request_allows_tree",
           "sample_tree", "target_attention_layers", "tree_step"]
