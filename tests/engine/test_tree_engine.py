"""Draft trees in the real engine (CPU, float32, greedy): docs/design/eagle-tree.md
steps 3 and 5. The engine runs `tree_width = 4` with the cycle policy, so
the scheduler hands the runner a different (gamma, width) arm every step,
gamma 1..4 x width 1..4 within gamma * width <= K, and prefix caching on.

Two tree drafters:
- `OracleTrees`, a test double that knows every prompt's target-only
  continuation and plants it in a beam-shaped tree of the scheduler's
  shape: at each depth the true token sits at a random beam rank, hanging
  from the true node above; the other nodes are decoys (distinct tokens per
  depth, none the true token) hanging from random nodes of the depth above;
  from a random depth on nothing true is planted. So every step exercises
  acceptance through any rank, partial and full acceptance, and the KV moves
  of the tree commit. Every 7th step it declines, so vLLM's linear EAGLE
  drafter drafts from the accepted path of a tree step.
- the engine's own `EagleTreeDrafter` (the EAGLE head's beam).

Oracles:
- the outputs equal target-only decoding token for token: planted trees,
  EAGLE trees, EAGLE trees on prefix-cached prompts, EAGLE trees across
  preemptions (a second engine with a tiny KV cache);
- every planted step commits exactly what the double planted: the true nodes
  down to the break, plus one token (the engine's accepted lengths, observed
  as each request's growth between two proposals);
- a batch with a sampled request drafts no tree (the scheduler's arms are
  width 1 while it runs) and its greedy requests stay exact;
- a lossy rule (margin, relaxed_topk) on EAGLE trees relaxes only what it
  allows: with every id protected the output is target-only's;
- a width the host cannot run stops start-up naming `tree_width`.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from conftest import (DRAFT, EAGLE, assert_same_tokens, close_llm, counter, load_prompts, make_llm,
                      run_preempted, runner_of)
from vllm_vspec.kernels import tree
from vllm_vspec.kernels.acceptance import AcceptanceRule
from vllm_vspec.hosts.vllm.tree.eagle_drafter import EagleTreeDrafter
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
from vllm_vspec.config import VSpecConfig

pytestmark = pytest.mark.engine

K = 16                   # gamma * width <= K: up to gamma 4 at width 4
DECLINE_EVERY = 7         # every 7th step drafts linearly (host EAGLE) after a tree step
MAX_TOKENS = 64
PREEMPTING_KV_BYTES = 5 << 20   # far less KV than 8 requests x (prompt + 64 + K) need
SPEC = {"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": K}
VSPEC = {"policy": "cycle", "min_gamma": 1, "max_gamma": 4, "tree_width": 4}


class OracleTrees:
    """A tree drafter test double: plants each request's target-only
    continuation in a tree, and checks the engine committed exactly that."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.continuations = continuations
        self.vocab = vocab
        self.calls = 0
        self.pairs: set[tuple[int, int]] = set()
        self.planted: dict[str, tuple[int, int]] = {}   # req_id -> (committed, expected growth)
        self.observed = 0
        self.mismatches: list[str] = []
        self.side_paths = 0      # planted paths through a beam rank > 0 (they move KV)
        self.declined = 0

    def propose_tree(self, runner, gamma: int, width: int, *, sampled_token_ids,
                     **_) -> tree.DraftTree | None:
        self.calls += 1
        batch = runner.input_batch
        rows = batch.num_reqs
        sampled = (sampled_token_ids.tolist() if torch.is_tensor(sampled_token_ids)
                   else sampled_token_ids)
        committed = []
        for row in range(rows):
            # This step's tokens are not in the batch yet (the drafter runs
            # before the host's bookkeeping): add the sampled ones.
            tokens = batch.token_ids_cpu[row, :batch.num_tokens_no_spec[row]].tolist()
            if not runner.discard_request_mask.np[row]:
                tokens += [t for t in sampled[row] if t >= 0]
            committed.append(tokens)
            self._observe(batch.req_ids[row], len(tokens))
        if self.calls % DECLINE_EVERY == 0:
            # A linear step: the host's EAGLE drafter drafts after a tree step.
            self.declined += 1
            return None
        self.pairs.add((gamma, width))
        n = tree.num_nodes(gamma, width)
        tokens = torch.zeros(rows, n, dtype=torch.int64)
        parents = torch.zeros(rows, n, dtype=torch.int64)
        for row in range(rows):
            req_id = batch.req_ids[row]
            prompt_len = int(batch.num_prompt_tokens[row])
            out = committed[row][prompt_len:]
            truth = self.continuations[tuple(committed[row][:prompt_len])][
                len(out):len(out) + gamma]
            rng = random.Random(f"{row}/{len(out)}/{self.calls}")   # str seeds are stable
            tokens[row], parents[row], planted, side = self._plant(
                committed[row][-1], truth, gamma, width, rng)
            self.planted[req_id] = (len(committed[row]), planted + 1)
            self.side_paths += side
        return tree.DraftTree(tokens, parents, gamma, width)

    def _observe(self, req_id: str, committed: int) -> None:
        if req_id not in self.planted:
            return
        before, expected = self.planted.pop(req_id)
        self.observed += 1
        if committed - before != expected:
            self.mismatches.append(f"request {req_id} at {before} committed tokens: "
                                   f"grew by {committed - before}, planted {expected}")

    def _plant(self, root: int, truth: list[int], gamma: int, width: int, rng: random.Random):
        tokens, parents = [root], [tree.NO_NODE]
        stop = rng.randint(1, gamma + 1)      # first depth with nothing true (gamma + 1: none)
        true_node, planted, side = 0, 0, False
        for depth in range(1, gamma + 1):
            first_above = 1 + (depth - 2) * width if depth > 1 else 0
            above = [first_above + r for r in range(width)] if depth > 1 else [0]
            true_token = truth[depth - 1] if depth - 1 < len(truth) else None
            decoys = [t for t in rng.sample(range(self.vocab), width + 1) if t != true_token]
            rank = rng.randrange(width)
            plant = true_node is not None and depth < stop and true_token is not None
            next_true = None
            for r in range(width):
                if plant and r == rank:
                    tokens.append(true_token)
                    parents.append(true_node)
                    next_true = len(tokens) - 1
                else:
                    tokens.append(decoys[r])
                    parents.append(rng.choice(above))
            if plant:
                planted += 1
                side = side or rank > 0
            true_node = next_true
        return torch.tensor(tokens), torch.tensor(parents), planted, side


@pytest.fixture(scope="module")
def token_prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    from conftest import TARGET

    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    texts = load_prompts("code", 4) + load_prompts("prose", 4)
    return [tokenizer(t).input_ids for t in texts]


def generate(llm, token_prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in token_prompts], params,
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def target_only(token_prompts) -> list[list[int]]:
    llm = make_llm()
    try:
        return generate(llm, token_prompts)
    finally:
        close_llm(llm)


class RecordingTreeDrafter(EagleTreeDrafter):
    """The engine's EAGLE tree drafter, noting the (gamma, width) of every
    tree it drafts."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def propose_tree(self, runner, gamma, width, **propose_args):
        drafted = super().propose_tree(runner, gamma, width, **propose_args)
        if drafted is not None:
            self.shapes.append((drafted.gamma, drafted.width))
        return drafted


@pytest.mark.parametrize("vspec, spec, why", [
    ({"tree_width": 2}, {"method": "draft_model", "model": str(DRAFT),
                         "num_speculative_tokens": 4}, "method eagle"),
    ({"tree_width": 9}, SPEC, "[1, 8]"),
], ids=["draft-model", "wider-than-8"])
def test_a_tree_width_the_engine_cannot_run_stops_start_up_naming_it(vspec, spec, why):
    # Before any other engine of the module starts (one in-process engine at a time).
    # Refused while vLLM builds the engine config (vspec's platform hook).
    from vllm_vspec.hosts.vllm.platform import VSpecStartupError

    with pytest.raises(VSpecStartupError) as err:
        make_llm(speculative_config=spec, vspec=vspec, worker_cls=CPU_WORKER_CLS)
    assert err.value.key == "tree_width" and why in str(err.value), str(err.value)


def test_eagle_trees_across_preemptions_are_exact(token_prompts, target_only):
    # Its own engine, before the module's one starts (one in-process engine
    # at a time): a KV cache smaller than the batch needs.
    llm = make_llm(speculative_config=SPEC, vspec=VSPEC, worker_cls=CPU_WORKER_CLS,
                   kv_cache_memory_bytes=PREEMPTING_KV_BYTES, max_model_len=256,
                   disable_log_stats=False)
    got = run_preempted(llm, lambda: generate(llm, token_prompts))
    assert_same_tokens(got, target_only, "EAGLE trees across preemptions")


@pytest.fixture(scope="module")
def tree_engine(target_only):
    """One engine for the module (started after the target-only one closed).
    Blocks of 32 tokens (the CPU backend's smallest): vLLM caches whole
    blocks (stock EAGLE also drops the last matched one; vspec keeps it,
    hosts/vllm/prefix_tail.py), so the CPU default of 128 would leave these
    74-156 token prompts few cache hits."""
    llm = make_llm(speculative_config=SPEC, vspec=VSPEC, worker_cls=CPU_WORKER_CLS,
                   enable_prefix_caching=True, block_size=32, disable_log_stats=False)
    yield llm
    close_llm(llm)


@pytest.fixture(scope="module")
def planted_run(tree_engine, token_prompts, target_only):
    """One generation with OracleTrees as the tree drafter: (outputs, oracle)."""
    runner = runner_of(tree_engine)
    engine_drafter = runner.tree.drafter
    oracle = OracleTrees({tuple(p): out for p, out in zip(token_prompts, target_only)},
                         runner.input_batch.vocab_size)
    runner.tree.drafter = oracle
    try:
        return generate(tree_engine, token_prompts), oracle
    finally:
        runner.tree.drafter = engine_drafter


def test_the_engine_drafts_with_the_eagle_tree_drafter(tree_engine):
    assert isinstance(runner_of(tree_engine).tree.drafter, EagleTreeDrafter)


def test_planted_trees_of_widths_1_to_4_and_gamma_1_to_4_are_exact(planted_run, target_only):
    got, oracle = planted_run
    assert_same_tokens(got, target_only, "planted trees")
    assert oracle.declined > 0
    want = {(g, w) for g in range(1, 5) for w in range(1, 5)}
    assert want <= oracle.pairs, f"(gamma, width) pairs never drafted: {sorted(want - oracle.pairs)}"


def test_every_tree_step_commits_exactly_the_planted_path(planted_run):
    _, oracle = planted_run
    assert oracle.observed > 0
    assert not oracle.mismatches, "\n".join(oracle.mismatches)
    assert oracle.side_paths > 0, "no accepted path went through a beam rank > 0"


@pytest.fixture(scope="module")
def eagle_tree_run(planted_run, tree_engine, token_prompts):
    """The engine's own EAGLE trees on the prompts the planted run already
    cached: (outputs, shapes drafted, prefix-cache hits during the run)."""
    runner = runner_of(tree_engine)
    engine_drafter, runner.tree.drafter = runner.tree.drafter, RecordingTreeDrafter()
    hits = counter(tree_engine, "vllm:prefix_cache_hits")
    try:
        got = generate(tree_engine, token_prompts)
        return got, runner.tree.drafter.shapes, counter(
            tree_engine, "vllm:prefix_cache_hits") - hits
    finally:
        runner.tree.drafter = engine_drafter


def test_eagle_trees_with_width_and_gamma_changing_every_step_are_exact(eagle_tree_run,
                                                                         target_only):
    got, shapes, _ = eagle_tree_run
    assert_same_tokens(got, target_only, "EAGLE trees, cycling (gamma, width)")
    want = {(g, w) for g in range(1, 5) for w in range(2, 5)}
    assert want <= set(shapes), f"tree shapes never drafted: {sorted(want - set(shapes))}"


def test_eagle_trees_on_prefix_cached_prompts_are_exact(eagle_tree_run, target_only):
    got, _, hits = eagle_tree_run
    assert hits > 0, "no prefix-cache hit happened (the planted run cached these prompts)"
    assert_same_tokens(got, target_only, "EAGLE trees on prefix-cache hits")


def test_a_sampled_request_keeps_its_batch_linear_and_greedy_exact(
        eagle_tree_run, tree_engine, token_prompts, target_only):
    from vllm import SamplingParams, TokensPrompt

    runner = runner_of(tree_engine)
    engine_drafter, runner.tree.drafter = runner.tree.drafter, RecordingTreeDrafter()
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS // 2, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, seed=0, max_tokens=MAX_TOKENS // 2, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in token_prompts[:3]]
    try:
        outs = tree_engine.generate(prompts, [greedy, sampled, greedy], use_tqdm=False)
        shapes = runner.tree.drafter.shapes
    finally:
        runner.tree.drafter = engine_drafter
    got = [list(outs[i].outputs[0].token_ids) for i in (0, 2)]
    want = [target_only[i][:MAX_TOKENS // 2] for i in (0, 2)]
    assert_same_tokens(got, want, "greedy requests beside a sampled one")
    assert not shapes, f"trees drafted beside a sampled request: {shapes}"


# ---------------------------------------------------------- lossy rules on trees
AFTER = 8                 # the lossy rules' strict prefix, in output tokens
LOSSY_PROMPTS, LOSSY_TOKENS = 4, 32
LOSSY_RULES = {
    "margin": ({"acceptance": "margin", "margin": 2.0, "margin_after_tokens": AFTER},
               lambda rank, gap: gap <= 2.0),
    "relaxed_topk": ({"acceptance": "relaxed_topk", "relaxed_topk": 3,
                      "relaxed_after_tokens": AFTER},
                     lambda rank, gap: rank <= 3),
}


class RelaxedNodes:
    """Wraps tree_verify.sample_tree: per tree step, it also samples the same
    logits strictly, and notes every accepted node that is not the target's
    argmax at its parent, as (token, rank, logit gap) on the raw logits
    row, and every path shorter than strict greedy's."""

    def __init__(self, sample_tree) -> None:
        self.inner = sample_tree
        self.tree_steps = 0
        self.relaxed: list[tuple[int, int, float]] = []
        self.shorter = 0

    def __call__(self, sampler, logits, metadata, sampling_metadata, *rule_args):
        strict = copy.copy(metadata)
        self.inner(sampler, logits, strict, sampling_metadata)
        output = self.inner(sampler, logits, metadata, sampling_metadata, *rule_args)
        self.tree_steps += 1
        acceptance = metadata.acceptance
        self.shorter += int((acceptance.length < strict.acceptance.length).sum())
        rows = list(metadata.rows)
        # A tree's nodes are its logits rows, in order, ending at its bonus row.
        firsts = (metadata.bonus_logits_indices[rows].long()
                  - torch.tensor(metadata.num_draft_tokens)[rows])
        for k, first in enumerate(firsts.tolist()):
            path = acceptance.path[k, :int(acceptance.length[k])].tolist()
            for parent, node in zip(path, path[1:]):
                row = logits[first + parent]
                token = int(metadata.tokens[k, node])
                rank = int((row > row[token]).sum()) + 1
                if rank > 1:
                    self.relaxed.append((token, rank, float(row.max() - row[token])))
        return output


def lossy_run(tree_engine, token_prompts, keys: dict, monkeypatch):
    """The module engine under the lossy rule `keys` (VSpecConfig keys, the
    rule a runner starts with from them, beside the module's tree_width 4):
    (outputs, RelaxedNodes, tree shapes drafted). Restores the strict rule."""
    from vllm import SamplingParams, TokensPrompt

    from vllm_vspec.hosts.vllm.tree import verify as tree_verify

    runner = runner_of(tree_engine)
    sampler = runner.rejection_sampler
    strict_rule = sampler.rule
    sampler.rule = AcceptanceRule.from_config(VSpecConfig.from_dict({**VSPEC, **keys}, K))
    assert not sampler.rule.lossless
    spy = RelaxedNodes(tree_verify.sample_tree)
    monkeypatch.setattr(tree_verify, "sample_tree", spy)
    engine_drafter, runner.tree.drafter = runner.tree.drafter, RecordingTreeDrafter()
    params = SamplingParams(temperature=0.0, max_tokens=LOSSY_TOKENS, ignore_eos=True)
    try:
        outs = tree_engine.generate(
            [TokensPrompt(prompt_token_ids=p) for p in token_prompts[:LOSSY_PROMPTS]], params,
            use_tqdm=False)
        shapes = runner.tree.drafter.shapes
    finally:
        sampler.rule, runner.tree.drafter = strict_rule, engine_drafter
        monkeypatch.undo()
    return [list(o.outputs[0].token_ids) for o in outs], spy, shapes


@pytest.mark.parametrize("name", sorted(LOSSY_RULES))
def test_a_lossy_rule_on_eagle_trees_relaxes_only_what_it_allows(
        name, tree_engine, token_prompts, target_only, monkeypatch):
    keys, within = LOSSY_RULES[name]
    want = [out[:LOSSY_TOKENS] for out in target_only[:LOSSY_PROMPTS]]
    # Every id protected: the rule may relax nothing, so the output is exact.
    vocab = runner_of(tree_engine).input_batch.vocab_size
    got, spy, shapes = lossy_run(tree_engine, token_prompts,
                                 {**keys, "protected_token_ids": list(range(vocab))},
                                 monkeypatch)
    assert_same_tokens(got, want, f"{name}, every id protected, EAGLE trees")
    assert shapes and spy.tree_steps > 0, "no tree was drafted"
    assert not spy.relaxed and not spy.shorter
    # Unprotected: trees accept nodes strict rejects, each within the rule,
    # never a shorter path; the strict prefix stays exact.
    got, spy, shapes = lossy_run(tree_engine, token_prompts, keys, monkeypatch)
    assert shapes, "no tree was drafted"
    assert spy.relaxed, f"{name}: no tree node was relaxed; the test is vacuous"
    outside = [node for node in spy.relaxed if not within(node[1], node[2])]
    assert not outside, f"{name}: relaxed (token, rank, gap) outside the rule: {outside}"
    assert not spy.shorter, f"{name}: {spy.shorter} tree paths shorter than strict greedy's"
    assert_same_tokens([g[:AFTER] for g in got], [w[:AFTER] for w in want],
                       f"{name}: the strict prefix")
    assert got != want
