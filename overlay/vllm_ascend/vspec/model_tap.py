"""A transparent wrapper around the NPU proposer's draft model (not yet run on NPU).

vLLM-Ascend's merged draft loop calls `self.model(...)` and
`self.model.compute_logits(h)` on the draft model, so vspec's one tap
(draft_head_tap.DraftLogitsTap: the draft head, then the observers) wraps
the model and overrides `compute_logits`; everything else reaches the model
unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import nn


class ModelTap(nn.Module):
    """Wraps `model`; attributes not defined here resolve on it, and calling
    the tap calls the model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner = model

    def install(self, proposer: Any) -> "ModelTap":
        """Put this tap in place of `proposer.model` (which it wraps)."""
        proposer.model = self
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)
