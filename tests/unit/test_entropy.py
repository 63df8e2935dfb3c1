"""Entropy stop maths (vllm_vspec.kernels.entropy) against a plain-Python reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_vspec.config import VSpecConfig
from vllm_vspec.kernels.entropy import EntropyStop, stop_lengths, topk_entropy


def ref_topk_entropy(row: list[float], k: int) -> float:
    top = sorted(row, reverse=True)[:k]
    finite = [v for v in top if v != float("-inf")]
    z = sum(math.exp(v - finite[0]) for v in finite)
    ps = [math.exp(v - finite[0]) / z for v in finite]
    return -sum(p * math.log(p) for p in ps if p > 0)


def ref_stop_length(entropies: list[float], threshold: float, scale: float) -> int:
    for j, h in enumerate(entropies):
        if scale * h > threshold ** 2:
            return j
    return len(entropies)


def eighths(lo: int, hi: int):
    # Multiples of 1/8: exact in float32, so the comparison has no rounding.
    return st.integers(lo, hi).map(lambda i: i / 8)


logit_rows = st.integers(2, 12).flatmap(lambda v: st.lists(
    st.lists(st.one_of(st.floats(-8, 8, width=32), st.just(float("-inf"))),
             min_size=v, max_size=v).filter(lambda r: max(r) > float("-inf")),
    min_size=1, max_size=6))


@settings(max_examples=150, deadline=None)
@given(logit_rows, st.integers(2, 16))
def test_topk_entropy_matches_reference(rows, k):
    got = topk_entropy(torch.tensor(rows), k).tolist()
    want = [ref_topk_entropy(r, k) for r in rows]
    assert got == pytest.approx(want, abs=1e-4), f"rows={rows} k={k}"


def test_uniform_topk_entropy_is_log_k_and_one_hot_is_zero():
    logits = torch.tensor([[0.0] * 10, [50.0] + [-50.0] * 9])
    assert topk_entropy(logits, 4).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(eighths(0, 24), min_size=1, max_size=6), min_size=1, max_size=5)
       .filter(lambda rows: len({len(r) for r in rows}) == 1),
       eighths(0, 16), eighths(1, 32))
def test_stop_lengths_cut_at_the_first_position_over_threshold(rows, threshold, scale):
    got = stop_lengths(torch.tensor(rows), threshold, scale).tolist()
    want = [ref_stop_length(r, threshold, scale) for r in rows]
    assert got == want, f"rows={rows} tau={threshold} s={scale}"


def test_stop_settings_come_from_vspec_config():
    cfg = VSpecConfig.from_dict({"entropy_stop": True, "entropy_topk": 4,
                                 "entropy_threshold": 0.7, "entropy_scale": 2.0})
    assert EntropyStop.from_config(cfg) == EntropyStop(topk=4, threshold=0.7, scale=2.0)
