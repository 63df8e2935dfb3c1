"""Acceptance rules (vllm_vspec.kernels.acceptance) against a plain-Python reference.

The reference states each rule as the design does, one draft token at a time,
with lists and floats only; the vectorised torch code must agree with it on
random logits, including ties and -inf (masked) entries.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_vspec.kernels.acceptance import (AcceptanceRule, accept_mask, apply_to_greedy_rows,
                                   draft_positions, promote_accepted)
from vllm_vspec.config import VSpecConfig

NEG_INF = float("-inf")


# ------------------------------------------------------------ the reference
def ref_accept(rule: AcceptanceRule, row: list[float], draft: int, position: int,
               generated: int) -> bool:
    if draft < 0:
        return False
    best = max(row)
    argmax = row.index(best)  # first maximum, as torch.argmax
    if draft == argmax:
        return True
    if rule.name == "strict":
        return False
    if generated + position < rule.after_tokens:
        return False  # the strict prefix: output token number generated + position
    if draft in rule.protected_token_ids or row[draft] == NEG_INF:
        return False
    if rule.name == "relaxed_topk":
        return sum(v > row[draft] for v in row) < rule.topk
    if rule.name == "margin":
        return position >= rule.from_position and best - row[draft] <= rule.margin
    raise AssertionError(rule.name)


# ------------------------------------------------------------ strategies
@st.composite
def step_inputs(draw):
    """One verification step: per-request draft lengths, target logits rows
    (small integers so ties are common, some -inf), draft ids (some -1),
    and per-request generated counts."""
    vocab = draw(st.integers(2, 9))
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5).filter(any))
    n = sum(lengths)
    value = st.one_of(st.integers(-3, 3).map(float), st.just(NEG_INF))
    rows = draw(st.lists(st.lists(value, min_size=vocab, max_size=vocab).filter(
        lambda r: max(r) > NEG_INF), min_size=n, max_size=n))
    drafts = draw(st.lists(st.integers(-1, vocab - 1), min_size=n, max_size=n))
    generated = draw(st.lists(st.integers(0, 12), min_size=len(lengths),
                              max_size=len(lengths)))
    return lengths, rows, drafts, generated


rules = st.one_of(
    st.just(AcceptanceRule()),
    st.builds(lambda k, a, p: AcceptanceRule("relaxed_topk", topk=k, after_tokens=a,
                                             protected_token_ids=p),
              st.integers(1, 4), st.integers(0, 8),
              st.lists(st.integers(0, 8), max_size=3).map(tuple)),
    st.builds(lambda m, f, a, p: AcceptanceRule("margin", margin=m, from_position=f,
                                                after_tokens=a, protected_token_ids=p),
              st.sampled_from([0.0, 0.5, 1.0, 2.0, 100.0]), st.integers(0, 3),
              st.integers(0, 8), st.lists(st.integers(0, 8), max_size=3).map(tuple)),
)


def _tensors(lengths, rows, drafts):
    cu = torch.tensor(lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    logits = torch.tensor(rows, dtype=torch.float32).reshape(len(rows), -1)
    return cu, logits, torch.tensor(drafts, dtype=torch.int32)


def _per_row(lengths, generated):
    """Reference (request, position, generated) of each flattened row."""
    out = []
    for req, n in enumerate(lengths):
        out += [(req, pos, generated[req]) for pos in range(n)]
    return out


# ------------------------------------------------------------ tests
@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_draft_positions_match_request_major_layout(lengths):
    cu = torch.tensor(lengths).cumsum(0)
    req, pos = draft_positions(cu, sum(lengths))
    expected = [(r, p) for r, p, _ in _per_row(lengths, [0] * len(lengths))]
    assert list(zip(req.tolist(), pos.tolist())) == expected


@settings(max_examples=200, deadline=None)
@given(step_inputs(), rules)
def test_accept_mask_matches_reference(inputs, rule):
    lengths, rows, drafts, generated = inputs
    cu, logits, draft_ids = _tensors(lengths, rows, drafts)
    req, pos = draft_positions(cu, len(rows))
    got = accept_mask(rule, logits, draft_ids, pos, torch.tensor(generated)[req]).tolist()
    want = [ref_accept(rule, rows[i], drafts[i], p, g)
            for i, (_, p, g) in enumerate(_per_row(lengths, generated))]
    assert got == want, f"rule={rule} rows={rows} drafts={drafts} got={got} want={want}"


@settings(max_examples=150, deadline=None)
@given(step_inputs(), rules)
def test_greedy_verifier_on_promoted_logits_commits_the_rules_prefix(inputs, rule):
    """What the host's greedy kernel does with promoted logits (accept while
    draft == argmax, then emit the argmax) equals applying the rule
    directly: accepted prefix, then the target's own argmax."""
    lengths, rows, drafts, generated = inputs
    cu, logits, draft_ids = _tensors(lengths, rows, drafts)
    req, pos = draft_positions(cu, len(rows))
    accept = accept_mask(rule, logits, draft_ids, pos, torch.tensor(generated)[req])
    argmax = promote_accepted(logits.clone(), draft_ids, accept).argmax(-1).tolist()
    start = 0
    for r, n in enumerate(lengths):
        got, want = [], []
        for i in range(start, start + n):
            got.append(argmax[i])
            if got[-1] != drafts[i]:
                break
        for i in range(start, start + n):
            if ref_accept(rule, rows[i], drafts[i], i - start, generated[r]):
                want.append(drafts[i])
            else:
                want.append(rows[i].index(max(rows[i])))
                break
        assert got == want, f"request {r}: verifier {got} != rule {want}"
        start += n


@settings(max_examples=200, deadline=None)
@given(step_inputs(), rules)
def test_promote_touches_only_accepted_draft_entries(inputs, rule):
    lengths, rows, drafts, generated = inputs
    cu, logits, draft_ids = _tensors(lengths, rows, drafts)
    req, pos = draft_positions(cu, len(rows))
    accept = accept_mask(rule, logits, draft_ids, pos, torch.tensor(generated)[req])
    promoted = promote_accepted(logits.clone(), draft_ids, accept)
    changed = (promoted != logits).nonzero().tolist()
    for i, j in changed:
        assert accept[i] and j == drafts[i], f"row {i} column {j} changed"
    for i in accept.nonzero().flatten().tolist():
        assert promoted[i].argmax().item() == drafts[i]


@settings(max_examples=200, deadline=None)
@given(step_inputs(), rules)
def test_lossy_rules_accept_everything_strict_accepts(inputs, rule):
    lengths, rows, drafts, generated = inputs
    cu, logits, draft_ids = _tensors(lengths, rows, drafts)
    req, pos = draft_positions(cu, len(rows))
    gen = torch.tensor(generated)[req]
    strict = accept_mask(AcceptanceRule(), logits, draft_ids, pos, gen)
    lossy = accept_mask(rule, logits, draft_ids, pos, gen)
    assert not (strict & ~lossy).any()


def test_protected_token_needs_exact_match():
    logits = torch.tensor([[5.0, 4.9, 0.0]])
    rule = AcceptanceRule("margin", margin=1.0, protected_token_ids=(1,))
    got = accept_mask(rule, logits, torch.tensor([1]), torch.tensor([0]), torch.tensor([99]))
    assert got.tolist() == [False]


def test_masked_token_never_accepted_even_in_a_short_vocab_topk():
    # Only two finite logits: the 3rd-largest is -inf, yet -inf never passes.
    logits = torch.tensor([[1.0, NEG_INF, 0.0, NEG_INF]])
    rule = AcceptanceRule("relaxed_topk", topk=3)
    got = accept_mask(rule, logits, torch.tensor([1]), torch.tensor([0]), torch.tensor([0]))
    assert got.tolist() == [False]


def test_strict_prefix_counts_generated_plus_position():
    logits = torch.tensor([[2.0, 1.0]] * 3)
    rule = AcceptanceRule("relaxed_topk", topk=2, after_tokens=5)
    # A request that has generated 3 tokens drafts output tokens 3, 4, 5.
    got = accept_mask(rule, logits, torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2]),
                      torch.tensor([3, 3, 3]))
    assert got.tolist() == [False, False, True]


@pytest.mark.parametrize("raw, expected", [
    ({}, AcceptanceRule()),
    ({"acceptance": "relaxed_topk", "relaxed_topk": 3, "relaxed_after_tokens": 7,
      "protected_token_ids": [0, 2], "margin": 9.0},
     AcceptanceRule("relaxed_topk", topk=3, after_tokens=7, protected_token_ids=(0, 2))),
    ({"acceptance": "margin", "margin": 1.5, "margin_from_position": 2,
      "margin_after_tokens": 4, "relaxed_topk": 5},
     AcceptanceRule("margin", margin=1.5, from_position=2, after_tokens=4)),
])
def test_rule_is_built_from_the_selected_rules_knobs_only(raw, expected):
    assert AcceptanceRule.from_config(VSpecConfig.from_dict(raw)) == expected


def test_promoted_logit_is_one_ulp_above_the_row_maximum():
    logits = torch.tensor([[3.0, 1.0, 2.0]])
    out = promote_accepted(logits.clone(), torch.tensor([2]), torch.tensor([True]))
    assert out[0].tolist()[:2] == [3.0, 1.0]
    assert out[0, 2] == torch.nextafter(torch.tensor(3.0), torch.tensor(math.inf))


# ------------------------------------------- the one application in a host
# Two requests, one draft each: token 1, the second best of [2.0, 1.0, 0.0].
_TWO_ROWS = dict(draft_token_ids=torch.tensor([1, 1]), cu_num_draft_tokens=torch.tensor([1, 2]))
_TOP2 = AcceptanceRule("relaxed_topk", topk=2, after_tokens=0)


def _promoted(rule, generated, temperature) -> list[bool]:
    logits = torch.tensor([[2.0, 1.0, 0.0]] * 2)
    out = apply_to_greedy_rows(rule, logits, generated=generated, temperature=temperature,
                               **_TWO_ROWS)
    return (out.argmax(dim=-1) == 1).tolist()


def test_the_rule_is_applied_to_greedy_rows_only():
    assert _promoted(_TOP2, None, None) == [True, True]  # all greedy
    assert _promoted(_TOP2, None, torch.tensor([0.0, 0.7])) == [True, False]


def test_a_row_is_greedy_only_at_temperature_zero_as_the_hosts_verifier_says():
    # vLLM's and vLLM-Ascend's rejection samplers verify a row greedily iff
    # its temperature == 0; a tiny positive one is sampled, so never promoted.
    assert _promoted(_TOP2, None, torch.tensor([1e-6, 0.0])) == [False, True]


def test_without_generated_counts_every_request_is_fresh_so_the_prefix_stays_strict():
    rule = AcceptanceRule("relaxed_topk", topk=2, after_tokens=4)
    assert _promoted(rule, None, None) == [False, False]
    assert _promoted(rule, torch.tensor([4, 3]), None) == [True, False]
