"""EAGLE-1 for Qwen2, the lossy acceptance rules and the entropy stop, in the
real vLLM engine (CPU) on the bundled models.

Spec:
- The bundled Qwen2 EAGLE-1 head (models/tiny-eagle, no q/k/v biases in the
  file) loads with zero biases, and loading it again gives the same weights
  (read beside the eagle entropy-stop engine).
- The entropy stop (eagle and draft_model) only shortens drafts: outputs stay
  exact, and fewer tokens are drafted than gamma asked for.
- relaxed_topk / margin outputs equal strict ones for the first
  `*_after_tokens` tokens; afterwards every non-argmax token is within the
  rule's bound (top-K rank / logit margin) and never a protected id. Read
  from vLLM's raw logprobs, which score every output token under the
  target's unmodified logits. Bounds and protected ids are calibrated from an
  unbounded run, so that each of them actually binds.

Strict eagle's exactness under a gamma changing every step is
tests/engine/test_exactness_matrix.py.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import (DRAFT, EAGLE, MAX_TOKENS, assert_same_tokens, close_llm, counter, greedy,
                      make_llm, runner_of)
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

pytestmark = pytest.mark.engine

K = 4
EAGLE_SPEC = {"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": K}
DRAFT_SPEC = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": K}
AFTER = 8       # strict prefix of the lossy rules


def spec_counts(llm, run) -> tuple[float, float, float]:
    """(draft tokens, drafts, accepted tokens) vLLM counted during `run()`."""
    names = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_drafts",
             "vllm:spec_decode_num_accepted_tokens")
    before = [counter(llm, n) for n in names]
    run()
    return tuple(counter(llm, n) - b for n, b in zip(names, before))


# --------------------------------------------------------------- the head
def test_bundled_head_file_has_no_qkv_biases():
    names = set(load_file(str(EAGLE / "model.safetensors")))
    assert not {n for n in names if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))}
    assert "fc.weight" in names and "layers.0.post_attention_layernorm.weight" in names


def load_head_outside_the_engine(llm):
    """A fresh Qwen2ForCausalLMEagle loaded from the bundled file, as
    load_weights leaves it (the engine's own copy is repacked for CPU GEMMs
    after loading, so its linear weights cannot be compared). Built with the
    engine's config but a fresh compilation config (its own layer registry)."""
    from vllm.config import set_current_vllm_config
    from vllm.config.utils import replace
    from vllm.utils.torch_utils import set_default_torch_dtype

    from vllm_vspec.hosts.vllm.models.qwen2_eagle import Qwen2ForCausalLMEagle

    config = runner_of(llm).vllm_config
    config = replace(config, compilation_config=replace(config.compilation_config))
    with set_current_vllm_config(config), set_default_torch_dtype(torch.float32):
        model = Qwen2ForCausalLMEagle(vllm_config=config)
    model.load_weights(load_file(str(EAGLE / "model.safetensors")).items())
    # embed_tokens and lm_head are absent from the file: the target's are used.
    return {n: p.detach() for n, p in model.named_parameters()
            if not n.startswith(("model.embed_tokens.", "lm_head."))}


def test_missing_biases_load_as_zero_and_loading_twice_gives_identical_weights(entropy_runs):
    drafter, first, second = entropy_runs("eagle").heads
    assert drafter == "Qwen2ForCausalLMEagle"
    bias = first["model.layers.0.self_attn.qkv_proj.bias"]
    assert torch.count_nonzero(bias) == 0, "absent q/k/v biases must load as zeros"
    differ = [n for n in first if not torch.equal(first[n], second[n])]
    assert not differ, f"the second load differs in {differ}"


# --------------------------------------------------------------- entropy stop
# tau = 1.4 cuts where the top-8 draft entropy exceeds 1.96 nats (of at most
# ln 8 = 2.08): about the median for the bundled draft on held-out prompts,
# so drafts get cut at every position but not always.
ENTROPY = {"policy": "online", "entropy_stop": True, "entropy_topk": 8,
           "entropy_threshold": 1.4}


SPECS = {"eagle": EAGLE_SPEC, "draft_model": DRAFT_SPEC}


@pytest.fixture(scope="module")
def entropy_runs(prompts, reference):
    """method -> one engine's run under the entropy stop (vspec's worker),
    started on first use, after the reference engine: outputs at batch 16
    and 1, vLLM's draft counts, and for eagle the head as the engine built
    it and loaded twice outside it (the head tests read those)."""
    from types import SimpleNamespace

    done: dict = {}

    def run(method: str):
        if method in done:
            return done[method]
        llm = make_llm(speculative_config=SPECS[method], vspec=ENTROPY,
                       worker_cls=CPU_WORKER_CLS, disable_log_stats=False)
        try:
            heads = None
            if method == "eagle":
                heads = (type(runner_of(llm).drafter.model).__name__,
                         load_head_outside_the_engine(llm), load_head_outside_the_engine(llm))
            got: list[list[int]] = []
            counts = spec_counts(llm, lambda: got.extend(greedy(llm, prompts, MAX_TOKENS)))
            batch1 = [greedy(llm, [p], MAX_TOKENS)[0] for p in prompts[:2]]
        finally:
            close_llm(llm)
        done[method] = SimpleNamespace(got=got, batch1=batch1, counts=counts, heads=heads)
        return done[method]
    return run


@pytest.mark.parametrize("method", list(SPECS))
def test_entropy_stop_shortens_drafts_and_keeps_outputs_exact(method, entropy_runs, reference):
    run = entropy_runs(method)
    tokens, drafts, accepted = run.counts
    assert_same_tokens(run.got, reference, f"{method} + entropy stop, batch 16")
    assert_same_tokens(run.batch1, reference[:2], f"{method} + entropy stop, batch 1")
    assert accepted > 0, "no draft token was ever accepted: the stop cut everything"
    assert tokens < K * drafts, (
        f"{tokens} draft tokens in {drafts} drafts: the stop never shortened one below {K}")


# --------------------------------------------------------------- lossy rules
def lossy_outputs(rule: dict, prompts: list[str], spec: dict = EAGLE_SPEC, target=None):
    """Greedy outputs of `spec` (eagle unless given; `target`: the engine's
    model, the bundled target unless given) under a lossy rule, with each
    token's raw logprob, its rank under the target, and the target's top
    logprob."""
    from vllm import SamplingParams

    # The cycle policy: what is drafted, and so what a rule can relax, does
    # not depend on step timings (a timed policy may sit at gamma 0).
    llm = make_llm(*([target] if target else []), speculative_config=spec,
                   worker_cls=CPU_WORKER_CLS,
                   additional_config={"vspec": {"policy": "cycle", "min_gamma": 0, **rule}})
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        close_llm(llm)
    result = []
    for o in outs:
        seq = o.outputs[0]
        rows = []
        for tok, lp in zip(seq.token_ids, seq.logprobs):
            top = max(v.logprob for v in lp.values())
            rows.append((tok, lp[tok].rank, top - lp[tok].logprob))
        result.append(rows)
    return result


def relaxed_tokens(outputs) -> list[tuple[int, int, float]]:
    """(token, rank, logit gap) of every output token that is not the target's argmax."""
    return [(t, rank, gap) for rows in outputs for t, rank, gap in rows if rank > 1]


@pytest.fixture(scope="module")
def unbounded(prompts, reference):
    """Calibration: with an unbounded margin every draft token is accepted
    after the strict prefix. Its non-argmax tokens give each rule a bound that
    binds (the median) and protected ids that would otherwise be relaxed."""
    outputs = lossy_outputs({"acceptance": "margin", "margin": 1e9,
                             "margin_after_tokens": AFTER}, prompts)
    relaxed = relaxed_tokens(outputs)
    assert relaxed, "every eagle draft was the target's argmax: nothing to relax"
    counts: dict[int, int] = {}
    for tok, _, _ in relaxed:
        counts[tok] = counts.get(tok, 0) + 1
    protected = sorted(counts, key=lambda t: (-counts[t], t))[:2]
    ranks = sorted(r for _, r, _ in relaxed)
    gaps = sorted(g for _, _, g in relaxed)
    return protected, ranks[len(ranks) // 2], gaps[len(gaps) // 2]


def check_lossy(outputs, reference, protected: set[int], within, label: str) -> None:
    for i, (rows, ref) in enumerate(zip(outputs, reference)):
        tokens = [t for t, _, _ in rows]
        assert tokens[:AFTER] == ref[:AFTER], (
            f"{label} request {i}: strict prefix differs: {tokens[:AFTER]} vs {ref[:AFTER]}")
        for j, (tok, rank, gap) in enumerate(rows):
            if rank == 1:
                continue
            assert j >= AFTER, f"{label} request {i}: relaxed token {tok} at {j} < {AFTER}"
            assert tok not in protected, f"{label} request {i}: protected {tok} relaxed at {j}"
            assert within(rank, gap), f"{label} request {i}: token {tok} rank {rank} gap {gap}"
    assert relaxed_tokens(outputs), f"{label}: nothing was relaxed; the test is vacuous"


def test_margin_rule_keeps_strict_prefix_bound_and_protected_ids(prompts, reference, unbounded):
    protected, _, margin = unbounded
    outputs = lossy_outputs({"acceptance": "margin", "margin": margin,
                             "margin_after_tokens": AFTER,
                             "protected_token_ids": protected}, prompts)
    check_lossy(outputs, reference, set(protected),
                lambda rank, gap: gap <= margin + 1e-4, f"margin {margin:.3f}")


def test_relaxed_topk_rule_keeps_strict_prefix_bound_and_protected_ids(prompts, reference,
                                                                       unbounded):
    protected, topk, _ = unbounded
    outputs = lossy_outputs({"acceptance": "relaxed_topk", "relaxed_topk": topk,
                             "relaxed_after_tokens": AFTER,
                             "protected_token_ids": protected}, prompts)
    check_lossy(outputs, reference, set(protected), lambda rank, gap: rank <= topk,
                f"relaxed_topk {topk}")
