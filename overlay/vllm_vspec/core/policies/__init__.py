"""Gamma policies behind one small interface, chosen by `config.policy`.

A policy scores arms; the controller (controller.py) does the shared work
around it (feasible range, bucket, reward, stability, summary, trace).

    decide(batch, bucket, lo, hi, previous) -> (arm, reason)   # lo <= gamma <= hi
    observe(outcome: StepOutcome) -> None
    opening() -> arm | None          # optional: the arm in force before the
                                     # first decision (default max_gamma)

An arm is one of the policy's arm space (arms.py): a gamma at width 1 (the
default), a (gamma, width) tree otherwise; `space.arms(batch, lo, hi)` are
the step's feasible ones. `previous` is the controller's decision in force
before this one, as an arm (any bucket; None before the first): the
controller owns it, a policy keeps no copy. The step types come from the
leaf module steps.py, never from controller.py (which imports this
package); arms.py, like steps.py, imports neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm_vspec.core.arms import Arm
    from vllm_vspec.config import VSpecConfig
    from vllm_vspec.core.steps import BatchState, StepOutcome


class Policy(Protocol):
    def decide(self, batch: "BatchState", bucket: int, lo: int, hi: int,
               previous: "Arm | None") -> tuple["Arm", str]: ...

    def observe(self, outcome: "StepOutcome") -> None: ...


# config.policy -> "module:Class"; every name in config.POLICIES has an entry.
REGISTRY: dict[str, str] = {
    "online": "vllm_vspec.core.policies.online:OnlinePolicy",
    "profile": "vllm_vspec.core.policies.profile:ProfilePolicy",
    "fixed": "vllm_vspec.core.policies.fixed:FixedPolicy",
    "cycle": "vllm_vspec.core.policies.cycle:CyclePolicy",
    "budget": "vllm_vspec.core.policies.budget:BudgetPolicy",
    "model": "vllm_vspec.core.policies.model:ModelPolicy",
}


def make_policy(config: "VSpecConfig", space=None) -> Policy:
    """Build the policy named by config.policy (config already validated)
    over the arm space `space` (default: gammas at width 1)."""
    module, cls = REGISTRY[config.policy].split(":")
    return getattr(importlib.import_module(module), cls)(config, space=space)
