"""Speculative decoding on the bundled models in the real vLLM engine (CPU).

Spec: with greedy sampling, draft-model speculative decoding at fixed gamma
outputs exactly what target-only decoding outputs, at batch 1 and batch 16;
the target used as its own draft is accepted (almost) always; a freshly
initialised draft is (almost) never accepted.
"""

from __future__ import annotations

import pytest

from conftest import DRAFT, TARGET, assert_same_tokens, close_llm, draft_acceptance, greedy, make_llm

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("gamma", [1, 4])
def test_fixed_gamma_is_token_identical_at_batch_1_and_16(gamma, prompts, reference):
    llm = make_llm(speculative_config={"method": "draft_model", "model": str(DRAFT),
                                       "num_speculative_tokens": gamma})
    try:
        assert_same_tokens(greedy(llm, prompts), reference, f"gamma={gamma} batch 16")
        batch1 = [greedy(llm, [p])[0] for p in prompts[:4]]
        assert_same_tokens(batch1, reference[:4], f"gamma={gamma} batch 1")
    finally:
        close_llm(llm)


def test_target_as_its_own_draft_is_accepted_almost_always(prompts):
    rates = draft_acceptance(TARGET, prompts)
    assert min(rates) >= 0.95, f"per-position acceptance of target-as-draft: {rates}"


def test_random_draft_is_almost_never_accepted(prompts, random_draft):
    rates = draft_acceptance(random_draft, prompts)
    assert rates[0] <= 0.05, f"per-position acceptance of a random draft: {rates}"
