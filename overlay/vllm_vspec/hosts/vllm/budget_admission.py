"""Per-request verify budgets in vLLM's scheduler (policy `budget`).

VSpecScheduler holds one BudgetAdmission when `policy = "budget"` and
calls it at four points of a step (synchronous scheduling only):

- `drafted(draft_token_ids)` (update_draft_token_ids): keeps each
  request's draft probabilities (ScoredDraftTokenIds.draft_probs, from
  vspec's proposers; a drafter without them, e.g. n-gram or vLLM's own
  worker, counts as probability 1.0 per slot, and the calibration then
  learns one acceptance rate per position).
- `admit(running)` (start of schedule(), before vLLM schedules): one
  DraftRow per running decode request, the budget policy's plan, and
  each request's pending drafts cut to the prefix its plan admitted
  (`request.spec_token_ids`), so vLLM schedules exactly that prefix: a
  request admitted 0 slots runs a target-only step, all of them admitted
  0 is a target-only step. Verifying a prefix of a draft is verifying a
  shorter draft, so strict acceptance stays exact. The plan's depth is
  the gamma the controller decides for the step (core/policies/budget.py),
  i.e. what every request drafts after it.
- `step_output(scheduler_output, model_runner_output, decided)`
  (update_from_output, before the controller observes the step): per
  scheduled request, the drafts vLLM actually verified (its token budget
  may cut a prefix further) and the accepted ones, reported to the policy
  for a decided step; the consumed drafts' probabilities are dropped.
- `close()` (shutdown): one log line with the cost model and the
  calibration's error.

`history`: None; a test (or a diagnosis) sets a list, and every step
appends a StepAdmission (drafted, admitted by the plan, verified, per
request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from vllm.logger import init_logger

from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.core.budget.policy import BudgetPlan, DraftRow

logger = init_logger(f"vllm.{__name__}")


@dataclass(frozen=True)
class StepAdmission:
    """One scheduled step under the budget policy, per request id."""

    drafted: dict[str, int]        # pending drafts before admission (running decode requests)
    admitted: dict[str, int]       # the plan's admitted prefix
    verified: dict[str, int]       # drafts the step verified (scheduled, not invalid)
    depth: int | None              # the plan's draft depth (None: no plan)
    reason: str | None
    gamma: int                     # what the step drafts (num_spec_tokens_to_schedule)
    decided: bool                  # the controller decided it (not a prefill step)


class BudgetAdmission:
    """See the module docstring; `policy` is the controller's BudgetPolicy."""

    def __init__(self, policy: Any, max_num_batched_tokens: int):
        self.policy = policy
        self.max_num_batched_tokens = max_num_batched_tokens
        self._probs: dict[str, list[float]] = {}      # request -> its pending drafts' q
        self._rows: dict[str, DraftRow] = {}          # the rows of the step being scheduled
        self._plan: BudgetPlan | None = None
        self._drafted: dict[str, int] = {}
        self._admitted: dict[str, int] = {}
        self.scored_steps = 0        # drafts handed over with probabilities
        self.unscored_steps = 0      # ... without (counted as 1.0)
        self.history: list[StepAdmission] | None = None

    @classmethod
    def of(cls, vllm_config: Any, cfg: VSpecConfig | None, controller: Any
           ) -> "BudgetAdmission | None":
        """The scheduler's admission under policy `budget`, else None."""
        if cfg is None or cfg.policy != "budget":
            return None
        if vllm_config.scheduler_config.async_scheduling:
            raise VSpecConfigError(
                "policy", cfg.policy, "'budget' only with synchronous scheduling (the "
                "scheduler admits drafts it holds; under async scheduling it schedules "
                "placeholders of drafts not yet made); use policy 'online' or turn async "
                "scheduling off (--no-async-scheduling)")
        return cls(controller.policy, vllm_config.scheduler_config.max_num_batched_tokens)

    # ------------------------------------------------------------ per step
    def drafted(self, draft_token_ids: Any) -> None:
        """The drafts the runner handed back (before vLLM stores them)."""
        probs = getattr(draft_token_ids, "draft_probs", None)
        if probs:
            self.scored_steps += 1
            self._probs.update(zip(draft_token_ids.req_ids, probs))
        else:
            self.unscored_steps += 1

    def admit(self, running: Iterable[Any]) -> BudgetPlan | None:
        """Plan the step about to be scheduled and cut each running decode
        request's drafts to its admitted prefix."""
        rows, requests = [], []
        for request in running:
            if request.is_prefill_chunk:
                continue
            spec = request.spec_token_ids
            q = self._probs.get(request.request_id, ())[:len(spec)]
            q = tuple(q) + (1.0,) * (len(spec) - len(q))
            rows.append(DraftRow(request.request_id, q))
            requests.append(request)
        self._rows = {row.request_id: row for row in rows}
        self._drafted = {row.request_id: len(row.probs) for row in rows}
        plan = self._plan = self.policy.plan(rows, self.max_num_batched_tokens)
        if plan is None:
            self._admitted = dict(self._drafted)
            return None
        self._admitted = {}
        for request, k in zip(requests, plan.admitted):
            self._admitted[request.request_id] = k
            if k < len(request.spec_token_ids):
                request.spec_token_ids = request.spec_token_ids[:k]
        return plan

    def step_output(self, scheduler_output: Any, model_runner_output: Any,
                    decided: bool) -> None:
        """The step's outcome: reported to the policy when the controller
        observes the step (`decided`); the consumed drafts are forgotten."""
        so, out = scheduler_output, model_runner_output
        spec = so.scheduled_spec_decode_tokens
        invalid = so.num_invalid_spec_tokens or {}
        sampled = out.sampled_token_ids or []
        index = out.req_id_to_index
        rows, verified, accepted = [], [], []
        for req_id in so.num_scheduled_tokens:
            d = max(len(spec.get(req_id, ())) - invalid.get(req_id, 0), 0)
            i = index.get(req_id)
            n_out = len(sampled[i]) if i is not None and i < len(sampled) else 0
            rows.append(self._rows.get(req_id) or DraftRow(req_id, ()))
            verified.append(d)
            accepted.append(max(n_out - 1, 0) if d else 0)
            self._probs.pop(req_id, None)
        for req_id in so.finished_req_ids:
            self._probs.pop(req_id, None)
        if decided and rows:
            self.policy.report(rows, verified, accepted)
        if self.history is not None:
            plan = self._plan
            self.history.append(StepAdmission(
                dict(self._drafted), dict(self._admitted),
                dict(zip(so.num_scheduled_tokens, verified)),
                None if plan is None else plan.depth, None if plan is None else plan.reason,
                int(so.num_spec_tokens_to_schedule or 0), decided))
        self._rows, self._plan = {}, None

    def close(self) -> None:
        """One log line: what the budget policy learned."""
        snap = self.policy.snapshot()
        logger.info("vspec budget: planned_steps=%d drafts_scored=%d drafts_unscored=%d "
                    "calibration=%s cost_model=%s", self.policy.planned_steps,
                    self.scored_steps, self.unscored_steps,
                    json.dumps(snap["calibration"]), json.dumps(snap["cost_model"]))


__all__ = ["BudgetAdmission", "StepAdmission"]
