"""EAGLE tree drafting (hosts/vllm/tree/proposer.py, docs/design/eagle-tree.md 4.4).

Spec:
- Width 1 drafts exactly what the linear drafter drafts: on the same engine
  and the same inputs (the runner's arguments of real decode steps), the
  tree drafter's tokens equal the host `propose`'s and its parents are the
  chain.
- Width >= 2: every depth's candidates equal a brute-force beam: the host's
  linear drafter, forced along each frontier node's root path (one chain
  per node, causal attention, linear KV slots), gives the logits after that
  node, and `tree.grow_tree` on those logits gives the same tokens and
  parents as the tree drafter (one forward of B * W queries per depth under
  the tree mask).
- The check is not vacuous: some tree keeps a branch that is not the best
  one's child alive below depth 1.
- gamma 0 drafts nothing and returns the root alone.
- The engine with EAGLE trees chosen by the scheduler is exact against
  target-only: tests/engine/test_tree_engine.py.
- The layout of a tree pass (no engine): at width 1 its RoPE positions, KV
  slots and sequence lengths below max_model_len are the host's linear
  step's (vLLM's own `eagle_step_update_slot_mapping_and_metadata`); at any
  width node i of a
  request writes the slot of position p + i (p: its root row), its queries'
  masks are tree.tree_mask's rows over the tree keys, and nothing at or past
  max_model_len is written or read.
- What tree drafting cannot do stops it with the key `tree_width` named
  (section 4.4.5), width 1 never.

The engine tests drive the drafter directly through the engine's proposer
object (conftest.runner_of), in the steps the engine runs anyway: the
runner's propose arguments are copied and replayed before the real call.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from conftest import EAGLE, close_llm, greedy, make_llm, runner_of
from vllm_vspec.kernels import tree
from vllm_vspec.hosts.vllm.proposers import VSpecEagleProposer
from vllm_vspec.hosts.vllm.tree.proposer import check_tree_drafting, pass_layout
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
from vllm_vspec.config import VSpecConfigError

K = 8                                 # num_speculative_tokens: gamma * width <= K
LINEAR_GAMMA = 4
TREES = [(4, 2), (2, 4), (3, 2)]      # (gamma, width) checked against brute force
STEPS = 4                             # drafter steps checked (the first is after prefill)
BATCH = 4
TOKENS = 24                           # per request


# ------------------------------------------------------------ refusals
def stub(**changes) -> SimpleNamespace:
    """A tree-capable proposer's attributes (it has `tree`), without an engine."""
    fields = dict(speculative_config=SimpleNamespace(method="eagle"), parallel_drafting=False,
                  supports_mm_inputs=False, uses_mrope=False, use_local_argmax_reduction=False,
                  use_heterogeneous_vocab=False, tree=object(), entropy=None, traces=None,
                  vllm_config=SimpleNamespace(
                      scheduler_config=SimpleNamespace(async_scheduling=False)))
    fields.update(changes)
    return SimpleNamespace(**fields)


REFUSED = {
    "eagle3": (dict(speculative_config=SimpleNamespace(method="eagle3")), "EAGLE-1"),
    "mtp": (dict(speculative_config=SimpleNamespace(method="mtp")), "EAGLE-1"),
    "parallel drafting": (dict(parallel_drafting=True), "parallel drafting"),
    "multimodal": (dict(supports_mm_inputs=True), "multimodal"),
    "M-RoPE": (dict(uses_mrope=True), "M-RoPE"),
    "local argmax": (dict(use_local_argmax_reduction=True), "local argmax"),
    "heterogeneous vocab": (dict(use_heterogeneous_vocab=True), "heterogeneous"),
    "entropy stop": (dict(entropy=object()), "entropy_stop"),
    "traces": (dict(traces=object()), "traces"),
    "async scheduling": (dict(vllm_config=SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=True))), "async"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_tree_drafting_cannot_do_is_refused_naming_tree_width(case):
    changes, reason = REFUSED[case]
    with pytest.raises(VSpecConfigError) as err:
        check_tree_drafting(stub(**changes), 2)
    assert err.value.key == "tree_width" and err.value.value == 2
    assert reason in err.value.allowed, err.value.allowed


def test_the_draft_model_method_is_refused_and_width_one_never():
    draft_model = SimpleNamespace(speculative_config=SimpleNamespace(method="draft_model"))
    with pytest.raises(VSpecConfigError, match="only with speculative method eagle"):
        check_tree_drafting(draft_model, 3)
    check_tree_drafting(draft_model, 1)
    check_tree_drafting(stub(uses_mrope=True, traces=object()), 1)
    check_tree_drafting(stub(), 4)


# ------------------------------------------------------------ pass layout
BLOCK, LIMIT = 4, 32                  # block size and max_model_len of the layout tests


def block_table(batch: int) -> torch.Tensor:
    """A scattered block table: request b's blocks in a shuffled order."""
    blocks = LIMIT // BLOCK
    gen = torch.Generator().manual_seed(7)
    return torch.randperm(batch * blocks, generator=gen).reshape(batch, blocks).to(torch.int32)


def test_width_one_layout_is_the_host_linear_step():
    from vllm.platforms import current_platform
    from vllm.v1.spec_decode.utils import eagle_step_update_slot_mapping_and_metadata

    current_platform.register_triton_kernel_overrides()  # the host's CPU kernel
    roots = torch.tensor([0, 5, 13, 27, 29, 31])          # the last ones reach LIMIT
    table = block_table(len(roots))
    position, seq_lens = roots.clone(), (roots + 1).to(torch.int32)
    for depth in range(1, 6):
        slots = torch.empty(len(roots), dtype=torch.int64)
        eagle_step_update_slot_mapping_and_metadata(position.clone(), table, seq_lens, BLOCK,
                                                    LIMIT, position, slots)
        layout = pass_layout(roots, table, BLOCK, LIMIT, depth, 1)
        inside = roots + depth < LIMIT
        assert layout.positions[inside, 0].tolist() == position[inside].tolist(), depth
        assert layout.slots[inside].tolist() == slots[inside].tolist(), depth
        assert layout.seq_lens[inside].tolist() == seq_lens[inside].tolist(), depth
        # Past max_model_len (never verified) no KV is written. The host
        # pads only its first step there: it then counts positions up from
        # 0 again and writes their slots, which the layout does not copy.
        assert (layout.slots[~inside] == -1).all() and (layout.positions[~inside] == 0).all()
        assert (layout.seq_lens <= LIMIT).all()


def test_tree_nodes_write_their_own_slots_and_read_only_their_ancestors():
    width, depth = 3, 2
    roots = torch.tensor([2, 9, 26, 30])
    table = block_table(len(roots))
    # Depth-2 nodes hang from depth-1 nodes 2, 1, 2 (not in rank order).
    parents = torch.tensor([tree.NO_NODE, 0, 0, 0, 2, 1, 2]).expand(len(roots), -1)
    layout = pass_layout(roots, table, BLOCK, LIMIT, depth, width)
    queries = layout.queries(parents)
    want_mask = tree.tree_mask(parents[:1])[0, 4:7]
    for b, p in enumerate(roots.tolist()):
        at = [p + i for i in (4, 5, 6)]
        want = [int(table[b, a // BLOCK]) * BLOCK + a % BLOCK if a < LIMIT else -1
                for a in at]
        assert layout.slots[b * width:(b + 1) * width].tolist() == want, b
        assert layout.positions[b].tolist() == [p + depth if p + depth < LIMIT else 0] * width
        keys = min(1 + depth * width, LIMIT - p)
        assert layout.seq_lens[b] == p + keys <= LIMIT
        assert queries.rows[b] == b
        assert torch.equal(queries.masks[b], want_mask[:, :keys]), (b, queries.masks[b])
        assert bool(queries.masks[b][:, 0].all()), "the root is every node's ancestor"


# ------------------------------------------------------------ the engine
def fresh(kwargs: dict) -> dict:
    """A copy of the runner's propose arguments but num_speculative_tokens,
    which a propose call may use up: the linear loop updates the metadata's
    sequence lengths in place."""
    cad = kwargs["common_attn_metadata"]
    upper = cad.seq_lens_cpu_upper_bound
    kept = {k: v for k, v in kwargs.items() if k != "num_speculative_tokens"}
    return {**kept, "common_attn_metadata": dataclasses.replace(
        cad, seq_lens=cad.seq_lens.clone(),
        seq_lens_cpu_upper_bound=None if upper is None else upper.clone())}


def forced_chain_logits(drafter, kwargs: dict, path: torch.Tensor) -> torch.Tensor:
    """The draft logits after the last node of `path` (tokens [B, d], one
    root path per request, root excluded): the host's linear drafter run for
    d + 1 tokens with its greedy choice replaced by the path's tokens."""
    depth = path.shape[1]
    seen: list[torch.Tensor] = []

    def forced(hidden: torch.Tensor) -> torch.Tensor:
        seen.append(drafter._draft_logits(hidden)[0])
        j = len(seen) - 1
        return path[:, j] if j < depth else seen[-1].argmax(-1)

    drafter._greedy_sample = forced   # the instance's, for this call only
    try:
        type(drafter).propose(drafter, num_speculative_tokens=depth + 1, **fresh(kwargs))
    finally:
        del drafter._greedy_sample
    assert len(seen) == depth + 1
    return seen[depth]


def brute_force_tree(drafter, kwargs: dict, gamma: int, width: int) -> tree.DraftTree:
    """tree.grow_tree on logits from one forced linear chain per frontier node."""
    root = kwargs["next_token_ids"].to(torch.int64)
    batch = root.shape[0]

    def chain_logits(drafted: tree.DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        out = []
        for k in range(width):
            # Root path of frontier node k per request, depth 1 first.
            node, path = frontier[:, k], []
            while True:
                path.append(drafted.tokens[torch.arange(batch), node])
                node = drafted.parents[torch.arange(batch), node]
                if bool((node == 0).all()):
                    break
            out.append(forced_chain_logits(drafter, kwargs, torch.stack(path[::-1], 1)))
        return torch.stack(out, 1)

    root_logits = forced_chain_logits(drafter, kwargs, root.new_empty(batch, 0))
    return tree.grow_tree(root, root_logits, chain_logits, gamma, width)


@pytest.fixture(scope="module")
def engine():
    """EAGLE with vspec's worker; gamma cycles 1..4 (cycle policy)."""
    llm = make_llm(speculative_config={"method": "eagle", "model": str(EAGLE),
                                       "num_speculative_tokens": K},
                   vspec={"policy": "cycle", "min_gamma": 1, "max_gamma": 4},
                   worker_cls=CPU_WORKER_CLS)
    yield llm
    close_llm(llm)


@pytest.fixture(scope="module")
def drafted(engine, prompts):
    """Per checked drafter step: the linear drafts, the width-1 tree, each
    tree of TREES with its brute-force reference, and a gamma-0 tree (the
    checks replay copies of the runner's arguments before its real call in a
    linear EAGLE run)."""
    drafter = runner_of(engine).drafter
    assert isinstance(drafter, VSpecEagleProposer), type(drafter)
    steps: list[dict] = []

    def check_then_propose(**kwargs):
        if len(steps) < STEPS:
            step = {"linear": type(drafter).propose(
                drafter, num_speculative_tokens=LINEAR_GAMMA, **fresh(kwargs)),
                "width1": drafter.tree.propose_tree(LINEAR_GAMMA, 1, **fresh(kwargs)),
                "gamma0": drafter.tree.propose_tree(0, 2, **fresh(kwargs))}
            for gamma, width in TREES:
                step[gamma, width] = (drafter.tree.propose_tree(gamma, width, **fresh(kwargs)),
                                      brute_force_tree(drafter, kwargs, gamma, width))
            steps.append(step)
        return type(drafter).propose(drafter, **kwargs)

    drafter.propose = check_then_propose   # the instance's, for this run only
    try:
        greedy(engine, prompts[:BATCH], max_tokens=TOKENS)
    finally:
        del drafter.propose
    assert len(steps) == STEPS, f"only {len(steps)} drafter steps ran"
    return steps


@pytest.mark.engine
def test_width_one_drafts_what_the_linear_drafter_drafts(drafted):
    steps = drafted
    chain = torch.arange(-1, LINEAR_GAMMA).expand(BATCH, -1)
    for i, step in enumerate(steps):
        tokens, parents = step["width1"]
        assert torch.equal(tokens, step["linear"].to(torch.int64)), (
            f"step {i}: width-1 tree {tokens.tolist()} vs linear {step['linear'].tolist()}")
        assert torch.equal(parents, chain), f"step {i}: parents {parents.tolist()}"


@pytest.mark.engine
@pytest.mark.parametrize("shape", TREES, ids=[f"gamma{g}-width{w}" for g, w in TREES])
def test_tree_equals_the_brute_force_beam_over_root_paths(drafted, shape):
    gamma, width = shape
    steps = drafted
    for i, step in enumerate(steps):
        (tokens, parents), want = step[shape]
        assert tokens.shape == (BATCH, gamma * width)
        for depth in range(1, gamma + 1):
            nodes = slice(1 + (depth - 1) * width, 1 + depth * width)
            got = (tokens[:, nodes.start - 1:nodes.stop - 1], parents[:, nodes])
            ref = (want.tokens[:, nodes], want.parents[:, nodes])
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), (
                f"step {i}, depth {depth}: tree tokens {got[0].tolist()} parents "
                f"{got[1].tolist()}; brute force tokens {ref[0].tolist()} parents "
                f"{ref[1].tolist()}")


@pytest.mark.engine
def test_some_tree_keeps_a_branch_other_than_the_best_alive(drafted):
    # A depth >= 2 node whose parent is not its depth's best node: the beam
    # is more than the best chain plus siblings, so the masks really mattered.
    for gamma, width in TREES:
        for step in drafted:
            _, parents = step[gamma, width][0]
            node = torch.arange(1 + width, 1 + gamma * width)   # depth >= 2
            best_of_parent_depth = 1 + ((node - 1) // width - 1) * width
            if bool((parents[:, 1 + width:] != best_of_parent_depth).any()):
                return
    pytest.fail("every tree was the best chain plus siblings: the check is vacuous")


@pytest.mark.engine
def test_gamma_zero_drafts_nothing_and_keeps_the_root(drafted):
    for step in drafted:
        tokens, parents = step["gamma0"]
        assert tokens.shape == (BATCH, 0)
        assert parents.tolist() == [[tree.NO_NODE]] * BATCH
