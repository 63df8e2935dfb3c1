"""`budget` policy: per-request verify budgets from draft confidence.

The controller's other policies give every request of a step one gamma.
Under `budget` the host verifies, per request, a PREFIX of its draft
chosen by core/budget (VerifyBudgetPolicy: survival ranking, the
`model` policy's pooled online step-cost model (core/step_cost.py),
calibration of the draft probabilities), and the controller's
gamma is the draft DEPTH of the step (what the next step can admit from).

The host (hosts/vllm/budget_admission.py) drives it in three calls a step,
in this order; the controller calls the other two:

1. `plan(rows, max_num_batched_tokens)`, before the host schedules the
   step: one DraftRow per decode request (its pending drafts' draft
   probabilities), the BudgetPlan back (admitted prefix per row, depth).
2. controller `decide(...)` -> `decide(batch, bucket, lo, hi, previous)`:
   the plan's depth, clamped to the controller's [lo, hi]; without a plan
   (no decode request had a row) the arm in force stays.
3. `report(rows, verified, accepted)`, once the step's output is in and
   before the controller observes it: per request of the step, its row,
   the drafts actually verified (the host may cut a prefix further by its
   token budget) and the accepted ones.
4. controller `observe(outcome)` -> `observe`: the report and the step's
   non-overlapping interval (`StepOutcome.interval_s`) go to
   VerifyBudgetPolicy.observe: the calibration learns the judged slots,
   the cost model the step's (batch size, verified drafts, draft passes,
   context, ms).

Every decided step is a cost sample, stable or not, whatever its batch
size: the cost model's features say what the step did, so a step
that mixes two depths is described exactly and need not be dropped, as
the batch-uniform policies must (their reward names one gamma). Prefill
steps are not decided (controller rule) and teach nothing.

Settings: config's `verify_budget_*` keys (BudgetSettings). Depth 0 is a
target-only step for the drafter; what it costs depends on gamma0_mode
(`sync` still runs one draft pass: BudgetSettings.gamma0_runs_drafter).

Host-agnostic core: no vLLM import.
"""

from __future__ import annotations

from typing import Sequence

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.arms import GammaArms
from vllm_vspec.core.budget.policy import BudgetPlan, BudgetSettings, DraftRow, VerifyBudgetPolicy


def budget_settings(config: VSpecConfig) -> BudgetSettings:
    """The core policy's settings from the vspec keys (the rest: defaults)."""
    return BudgetSettings(
        cost_window=config.model_cost_window,
        cold_start_steps=config.verify_budget_cold_start_steps,
        probe_interval=config.verify_budget_probe_interval,
        request_smoothing=config.verify_budget_request_smoothing,
        calibration_window=config.verify_budget_calibration_window,
        gamma0_runs_drafter=not config.drafter_skips_gamma0)


class BudgetPolicy:
    """See the module docstring. Linear drafts only (width 1: config
    validation refuses tree_width > 1 with this policy)."""

    def __init__(self, config: VSpecConfig, space=None):
        self.space = GammaArms() if space is None else space
        if self.space.max_width != 1:
            raise ValueError("policy 'budget' drafts linear drafts only (tree width 1)")
        self.core = VerifyBudgetPolicy(max(config.max_gamma or 1, 1), budget_settings(config))
        self._plan: BudgetPlan | None = None
        self._report: tuple[list[DraftRow], list[int], list[int]] | None = None
        self.planned_steps = 0

    # ---------------------------------------------------------------- host
    def plan(self, rows: Sequence[DraftRow], max_num_batched_tokens: int | None = None
             ) -> BudgetPlan | None:
        """The step's plan (None without rows: nothing to admit, the arm in
        force stays); kept for the controller's decide."""
        self._plan = self.core.plan(rows, max_num_batched_tokens) if rows else None
        self.planned_steps += self._plan is not None
        return self._plan

    def report(self, rows: Sequence[DraftRow], verified: Sequence[int],
               accepted: Sequence[int]) -> None:
        """What the step the controller observes next verified, per request."""
        if not len(rows) == len(verified) == len(accepted):
            raise ValueError(f"BudgetPolicy.report: {len(rows)} rows, {len(verified)} "
                             f"verified, {len(accepted)} accepted: need one of each per "
                             "request of the step")
        self._report = (list(rows), [int(v) for v in verified],
                        [min(int(a), int(v)) for a, v in zip(accepted, verified)])

    # ---------------------------------------------------------- controller
    def decide(self, batch, bucket: int, lo: int, hi: int, previous) -> tuple[int, str]:
        plan, self._plan = self._plan, None
        if plan is None:
            held = hi if previous is None else min(max(previous, lo), hi)
            return held, "no-plan"
        return min(max(plan.depth, lo), hi), plan.reason

    def observe(self, outcome) -> None:
        report, self._report = self._report, None
        if report is None or not report[0] or outcome.interval_s <= 0:
            return
        rows, verified, accepted = report
        step = BudgetPlan(tuple(verified), outcome.gamma, outcome.bucket, "observed",
                          0.0, None)
        self.core.observe(step, rows, accepted, outcome.interval_s * 1e3,
                          outcome.batch.mean_context_len)

    def snapshot(self) -> dict:
        """The pooled cost model's fit and the calibration's error report."""
        return self.core.snapshot()
