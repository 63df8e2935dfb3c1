"""The step's gamma as the NPU proposer sees it.

The vspec scheduler writes `scheduler_output.num_spec_tokens_to_schedule`
every step (vLLM 0.32 declares that field; on vLLM 0.23, the Ascend pin's
host, it is a plain attribute on the SchedulerOutput dataclass and reaches the
workers through pickle). A scheduler output without it (stock scheduler,
dummy runs) means "the configured maximum".
"""

from __future__ import annotations

from typing import Any

from vllm_vspec.config import MAX_VERIFY_WIDTH, VSpecConfigError


def step_gamma(scheduler_output: Any, max_gamma: int) -> int:
    """Validated gamma for this step: 0 <= gamma <= max_gamma and
    1 + gamma <= MAX_VERIFY_WIDTH (FIA verifies at most 16 tokens a request)."""
    gamma = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
    return valid_gamma(max_gamma if gamma is None else gamma, max_gamma)


def valid_gamma(gamma: Any, max_gamma: int) -> int:
    """`gamma` if 0 <= gamma <= max_gamma and 1 + gamma <= MAX_VERIFY_WIDTH;
    VSpecConfigError naming the value otherwise."""
    top = min(max_gamma, MAX_VERIFY_WIDTH - 1)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 0 <= gamma <= top:
        raise VSpecConfigError(
            "num_spec_tokens_to_schedule", gamma,
            f"an integer in [0, {top}] (num_speculative_tokens={max_gamma}, "
            f"1 + gamma <= {MAX_VERIFY_WIDTH})")
    return gamma
