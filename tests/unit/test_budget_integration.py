"""Policy `budget` (issue 28) between the core and vLLM, without an engine.

Spec:
- config: `policy = "budget"` and its `verify_budget_*` keys validate with
  named errors; trees, sticky gamma 0 and async scheduling are refused.
- BudgetPolicy through GammaController: the step's gamma is the plan's
  draft depth clamped to the controller's range; without a plan the arm in
  force stays; the controller's observed steps feed the cost model and the
  calibration with what vLLM actually verified.
- BudgetAdmission (the scheduler's side): each running decode request's
  pending drafts are cut to the admitted prefix, rows carry the drafter's
  probabilities (1.0 where it gave none), prefill chunks get no row, the
  step's outcome is reported per request, consumed probabilities are
  dropped.
- draft probabilities: the drafted token is the argmax it was, its
  probability is the softmax's; they reach the scheduler as
  ScoredDraftTokenIds, cut to each request's draft length.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.core.budget.policy import BudgetPlan, DraftRow
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.steps import BatchState, StepFeedback

K = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(**keys) -> GammaController:
    return GammaController(VSpecConfig.from_dict({"policy": "budget", **keys}, K), K,
                           clock=Clock())


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("keys, key", [
    ({"tree_width": 2}, "tree_width"),
    ({"gamma0_mode": "sticky"}, "gamma0_mode"),
    ({"model_cost_window": 1}, "model_cost_window"),
    ({"verify_budget_request_smoothing": 0.0}, "verify_budget_request_smoothing"),
    ({"verify_budget_probe_interval": 0}, "verify_budget_probe_interval"),
    ({"verify_budget_calibration_window": "many"}, "verify_budget_calibration_window"),
])
def test_bad_budget_settings_name_their_key(keys, key):
    with pytest.raises(VSpecConfigError) as err:
        VSpecConfig.from_dict({"policy": "budget", **keys}, K)
    assert err.value.key == key and "is not allowed" in str(err.value)


def test_budget_keys_reach_the_core_settings():
    ctl = controller(model_cost_window=64, verify_budget_probe_interval=5,
                     verify_budget_cold_start_steps=3, verify_budget_request_smoothing=0.5,
                     verify_budget_calibration_window=100, gamma0_mode="lazy")
    s = ctl.policy.core.settings
    assert (s.cost_window, s.probe_interval, s.cold_start_steps, s.request_smoothing,
            s.calibration_window, s.gamma0_runs_drafter) == (64, 5, 3, 0.5, 100, False)
    assert ctl.policy.core.max_depth == K


def test_async_scheduling_is_refused_by_name():
    from vllm_vspec.hosts.vllm.budget_admission import BudgetAdmission

    cfg = VSpecConfig.from_dict({"policy": "budget"}, K).with_max_gamma(K)
    engine = SimpleNamespace(scheduler_config=SimpleNamespace(
        async_scheduling=True, max_num_batched_tokens=256))
    with pytest.raises(VSpecConfigError, match=r"vspec.policy='budget'.*synchronous"):
        BudgetAdmission.of(engine, cfg, controller())
    assert BudgetAdmission.of(engine, VSpecConfig().with_max_gamma(K), None) is None


# -------------------------------------------------------- controller side
def test_the_step_gamma_is_the_plans_depth_clamped_to_the_range():
    ctl = controller(min_gamma=1)
    policy = ctl.policy
    policy.core.plan = lambda rows, cap=None: BudgetPlan((0,) * len(rows), 0, 2, "budget",
                                                         2.0, 1.0)
    policy.plan([DraftRow("a", (0.5,)), DraftRow("b", ())], 256)
    decision = ctl.decide(BatchState(2, 256))
    assert (decision.gamma, decision.reason) == (1, "budget")     # depth 0 < min_gamma 1
    # No plan (no decode rows): the arm in force stays.
    policy.plan([], 256)
    assert ctl.decide(BatchState(2, 256)).gamma == 1
    assert ctl.decide(BatchState(2, 256)).reason == "no-plan"


def test_observed_steps_feed_the_cost_model_with_what_was_verified():
    ctl = controller()
    policy, clock = ctl.policy, ctl.clock
    rows = [DraftRow("a", (0.9, 0.8, 0.5, 0.2)), DraftRow("b", (0.3, 0.2, 0.1, 0.1))]
    seen = []
    observe = policy.core.observe
    policy.core.observe = lambda plan, r, acc, ms, ctx: (
        seen.append((plan.admitted, plan.depth, tuple(acc), round(ms, 3))),
        observe(plan, r, acc, ms, ctx))
    for step in range(3):
        plan = policy.plan(rows, 256)
        assert plan.reason == "cold-start" and len(plan.admitted) == 2
        decision = ctl.decide(BatchState(2, 256))
        clock.now += 0.010
        # vLLM verified less than admitted for "b" (its token budget).
        policy.report(rows, [plan.admitted[0], 0], [1, 5])
        ctl.observe(StepFeedback((plan.admitted[0],), (1,), 3))
        ctl.step_processed(busy=True)
        assert seen[-1][0] == (plan.admitted[0], 0)
        assert seen[-1][1] == decision.gamma
        assert seen[-1][2] == (min(1, plan.admitted[0]), 0)      # accepted <= verified
    assert [s[3] for s in seen[1:]] == [10.0, 10.0]
    assert policy.snapshot()["cost_model"]["samples"] == 3


def test_report_needs_one_entry_per_request():
    with pytest.raises(ValueError, match="one of each per request"):
        controller().policy.report([DraftRow("a", ())], [0, 1], [0])


# --------------------------------------------------------- scheduler side
def _request(req_id, spec, prefill=False):
    return SimpleNamespace(request_id=req_id, spec_token_ids=list(spec),
                           is_prefill_chunk=prefill)


def _admission(plan_fn):
    from vllm_vspec.hosts.vllm.budget_admission import BudgetAdmission

    ctl = controller()
    ctl.policy.core.plan = plan_fn
    admission = BudgetAdmission(ctl.policy, 256)
    admission.history = []
    return ctl, admission


def test_admission_cuts_each_request_to_its_admitted_prefix():
    from vllm_vspec.hosts.vllm.draft_probs import ScoredDraftTokenIds

    got_rows = []

    def plan(rows, cap=None):
        got_rows.extend(rows)
        return BudgetPlan((2, 0, 3), 1, 4, "budget", 0.0, None)

    ctl, admission = _admission(plan)
    admission.drafted(ScoredDraftTokenIds(["a", "b"], [[5, 6, 7], [8, 9, 10]],
                                          [[0.9, 0.5, 0.25], [0.1, 0.1, 0.1]]))
    running = [_request("a", [5, 6, 7]), _request("b", [8, 9, 10]),
               _request("c", [1, 2, 3, 4]), _request("p", [], prefill=True)]
    admission.admit(running)
    # "c" came without probabilities (1.0 each); "p" is a prefill chunk: no row.
    assert got_rows == [DraftRow("a", (0.9, 0.5, 0.25)), DraftRow("b", (0.1, 0.1, 0.1)),
                        DraftRow("c", (1.0, 1.0, 1.0, 1.0))]
    assert [r.spec_token_ids for r in running] == [[5, 6], [], [1, 2, 3], []]
    assert ctl.decide(BatchState(3, 256)).gamma == 1

    so = SimpleNamespace(num_scheduled_tokens={"a": 3, "b": 1, "c": 4},
                         scheduled_spec_decode_tokens={"a": [5, 6], "c": [1, 2, 3]},
                         num_invalid_spec_tokens={"c": 1}, finished_req_ids={"b"},
                         num_spec_tokens_to_schedule=1)
    out = SimpleNamespace(sampled_token_ids=[[6, 11], [12], [13]],
                          req_id_to_index={"a": 0, "b": 1, "c": 2})
    reported = []
    ctl.policy.report = lambda rows, v, a: reported.append((rows, v, a))
    admission.step_output(so, out, decided=True)
    rows, verified, accepted = reported[0]
    assert [r.request_id for r in rows] == ["a", "b", "c"]
    assert verified == [2, 0, 2] and accepted == [1, 0, 0]
    step = admission.history[-1]
    assert step.drafted == {"a": 3, "b": 3, "c": 4}
    assert step.admitted == {"a": 2, "b": 0, "c": 3}
    assert step.verified == {"a": 2, "b": 0, "c": 2}
    assert (step.depth, step.gamma, step.decided) == (1, 1, True)
    assert admission._probs == {}           # consumed or finished
    # An undecided (prefill) step is not reported.
    admission.admit([])
    admission.step_output(so, out, decided=False)
    assert len(reported) == 1
    admission.close()                        # the summary line: no error


def test_no_plan_admits_everything():
    ctl, admission = _admission(lambda rows, cap=None: None)
    running = [_request("a", [1, 2])]
    ctl.policy.plan = lambda rows, cap=None: None
    assert admission.admit(running) is None
    assert running[0].spec_token_ids == [1, 2]


# ------------------------------------------------------ draft probabilities
def test_top_probability_is_the_softmax_of_the_argmax():
    from vllm_vspec.hosts.draft_observers import top_probability

    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 0.0], [5.0, -1.0, 4.9]])
    ids, q = top_probability(logits)
    assert ids.tolist() == logits.argmax(-1).tolist()
    want = torch.softmax(logits, -1).max(-1).values
    assert torch.allclose(q, want)


# The proposer's recording of each drafted token's probability (the
# DraftProbs observer): tests/unit/test_draft_observers.py.


def test_the_runner_hands_probabilities_cut_to_each_draft():
    from vllm.v1.outputs import DraftTokenIds

    from vllm_vspec.hosts.vllm.draft_probs import ScoredDrafts, ScoredDraftTokenIds

    recorder = SimpleNamespace(take=lambda: torch.tensor([[.5, .25, .125], [.75, .5, .5]]))
    # "b" cut by a stop (the entropy cut runs before this part).
    out = ScoredDrafts(recorder).handover(DraftTokenIds(["a", "b"], [[1, 2, 3], [4]]))
    assert isinstance(out, ScoredDraftTokenIds) and isinstance(out, DraftTokenIds)
    assert out.draft_token_ids == [[1, 2, 3], [4]]
    assert out.draft_probs == [[0.5, 0.25, 0.125], [0.75]]
