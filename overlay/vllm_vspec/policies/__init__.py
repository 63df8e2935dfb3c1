"""Gamma policies behind one small interface, chosen by `config.policy`.

A policy scores gammas; the controller (controller.py) does the shared work
around it (feasible range, bucket, reward, stability, summary, trace).

    decide(batch, bucket, lo, hi, previous) -> (gamma, reason)   # lo <= gamma <= hi
    observe(outcome: StepOutcome) -> None

`previous` is the controller's decision in force before this one (any
bucket; None before the first): the controller owns it, a policy keeps no
copy. The step types come from the leaf module steps.py, never from
controller.py (which imports this package).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm_vspec.config import VSpecConfig
    from vllm_vspec.steps import BatchState, StepOutcome


class Policy(Protocol):
    def decide(self, batch: "BatchState", bucket: int, lo: int, hi: int,
               previous: int | None) -> tuple[int, str]: ...

    def observe(self, outcome: "StepOutcome") -> None: ...


# config.policy -> "module:Class"; every name in config.POLICIES has an entry.
REGISTRY: dict[str, str] = {
    "online": "vllm_vspec.policies.online:OnlinePolicy",
    "profile": "vllm_vspec.policies.profile:ProfilePolicy",
    "fixed": "vllm_vspec.policies.fixed:FixedPolicy",
    "cycle": "vllm_vspec.policies.cycle:CyclePolicy",
}


def make_policy(config: "VSpecConfig") -> Policy:
    """Build the policy named by config.policy (config already validated)."""
    module, cls = REGISTRY[config.policy].split(":")
    return getattr(importlib.import_module(module), cls)(config)
