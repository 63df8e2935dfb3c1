"""GammaController: what all policies share (ranges, buckets, rewards,
stable-step attribution, FIFO matching of decisions, summary, trace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.steps import BatchState, StepFeedback, bucket_of, feasible_max_gamma
from vllm_vspec.core.trace import TraceError, read_trace

BUDGET = 8192


class Clock:
    """The controller's clock, set by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(clock: Clock | None = None, **config) -> GammaController:
    return GammaController(VSpecConfig(**config), 4, clock=clock or Clock())


def fixed(gamma: int, clock: Clock | None = None, **over) -> GammaController:
    return controller(clock, policy="fixed", fixed_gamma=gamma, min_gamma=0, **over)


def feedback(committed: int = 10, num_reqs: int = 2, drafted: int = 0) -> StepFeedback:
    return StepFeedback(drafted=(drafted,) * num_reqs, accepted=(0,) * num_reqs,
                        committed=committed)


def run_step(ctl: GammaController, start: float, end: float, committed: int = 10,
             num_reqs: int = 2) -> int:
    """One step scheduled at `start` and processed at `end` (on ctl.clock)."""
    ctl.clock.now = start
    gamma = ctl.decide(BatchState(num_reqs, BUDGET)).gamma
    ctl.clock.now = end
    ctl.observe(feedback(committed, num_reqs))
    return gamma


@pytest.mark.parametrize("num_reqs, bucket", [(0, 1), (1, 1), (2, 2), (3, 4), (16, 16),
                                              (17, 32), (128, 128)])
def test_bucket_is_next_power_of_two(num_reqs, bucket):
    assert bucket_of(num_reqs) == bucket


def test_feasible_gamma_respects_token_budget():
    # 10 requests, 35 tokens: 10 * (g + 1) <= 35 holds up to g = 2.
    assert feasible_max_gamma(BatchState(10, 35), max_gamma=4) == 2
    assert feasible_max_gamma(BatchState(1, 8192), max_gamma=4) == 4
    assert feasible_max_gamma(BatchState(40, 35), max_gamma=4) < 0


def test_max_gamma_defaults_to_num_speculative_tokens():
    ctl = GammaController(VSpecConfig(policy="fixed"), 3)
    assert ctl.config.max_gamma == 3
    assert ctl.decide(BatchState(1, BUDGET)).gamma == 3


def test_before_the_first_decision_the_fixed_policy_is_in_force():
    # A prefill step keeps the gamma in force; before any decision that was
    # max_gamma, so under fixed gamma 0 the first decode step verified 1 + K.
    assert fixed(0).gamma == 0
    assert fixed(2).gamma == 2
    assert controller(policy="online", min_gamma=0).gamma == 4   # its sweep starts there


def test_the_gamma_in_force_is_the_last_decision():
    ctl = controller(policy="cycle", min_gamma=0)   # decides 4, 0, 3, 1, 2, ...
    assert ctl.gamma == 4                           # before any decision: max_gamma
    decided = [ctl.decide(BatchState(2, BUDGET)).gamma for _ in range(3)]
    assert decided == [4, 0, 3] and ctl.gamma == 3


def step(ctl: GammaController, scheduled, live=None, prefill: bool = False):
    """decide_step for a step of `scheduled` requests (all live unless told)."""
    return ctl.decide_step(scheduled, set(scheduled) if live is None else live, prefill,
                           lambda: BatchState(len(scheduled), BUDGET))


def test_every_step_gets_the_controllers_decision_prefill_steps_keep_the_arm_in_force():
    ctl = controller(policy="cycle", min_gamma=0)   # decides 4, 0, 3, ...
    kept = step(ctl, ["a"], prefill=True)            # before any decision: the opening arm
    assert (kept.gamma, kept.reason, kept.decided) == (4, "prefill", False)
    assert [step(ctl, ["a"]).gamma for _ in range(2)] == [4, 0]
    kept = step(ctl, ["a", "b"], prefill=True)
    assert (kept.gamma, kept.bucket, kept.decided) == (0, 2, False) and ctl.gamma == 0
    assert step(ctl, ["a", "b"]).gamma == 3          # the policy goes on where it was
    assert step(ctl, []) is None                     # nothing scheduled, nothing held
    # With reward_prefill_steps every step is decided.
    ctl = controller(policy="cycle", min_gamma=0, reward_prefill_steps=True)
    assert [(d.gamma, d.decided) for d in (step(ctl, ["a"], prefill=True),
                                           step(ctl, ["a"]))] == [(4, True), (0, True)]


def test_sticky_gamma_0_holds_until_every_request_of_its_cohort_has_finished():
    ctl = controller(policy="cycle", min_gamma=0, gamma0_mode="sticky")   # 4, 0, 3, ...
    assert step(ctl, ["a"]).gamma == 4
    assert step(ctl, ["a", "b"]).gamma == 0          # decided: a and b's draft KV lags
    held = step(ctl, ["a", "b", "c"], prefill=True)  # c joins the cohort
    assert (held.gamma, held.reason, held.decided) == (0, "sticky", False)
    assert step(ctl, ["b", "c"], live={"b", "c"}).reason == "sticky"
    assert step(ctl, [], live={"c"}).reason == "sticky"   # held even with nothing scheduled
    # The cohort has finished: a new prefill is decided (it must not skip
    # the drafter), and the policy goes on where it was.
    d = step(ctl, ["d"], live={"d"}, prefill=True)
    assert (d.gamma, d.decided) == (3, True)
    # gamma0_mode auto (not resolved to sticky) holds nothing.
    ctl = controller(policy="cycle", min_gamma=0)
    assert [step(ctl, ["a"]).gamma for _ in range(3)] == [4, 0, 3]


def test_a_prefill_step_keeps_a_tree_arm_only_where_its_batch_allows_a_tree():
    ctl = GammaController(VSpecConfig(policy="cycle", min_gamma=1), 4, clock=Clock(),
                          max_width=2)
    for _ in range(20):                              # until the arm in force is a tree
        if ctl.decide(BatchState(1, BUDGET)).width == 2:
            break
    gamma = ctl.gamma

    def prefill(tree_allowed: bool):
        d = ctl.decide_step(["a"], {"a"}, True,
                            lambda: BatchState(1, BUDGET, tree_allowed=tree_allowed))
        return d.gamma, d.width, d.decided
    assert prefill(True) == (gamma, 2, False)
    assert prefill(False) == (gamma, 1, False)       # e.g. a sampled request joins
    assert ctl.width == 2                            # the arm in force stays


def test_gamma_is_capped_when_the_batch_outgrows_the_budget():
    ctl = fixed(4)
    d = ctl.decide(BatchState(10, 35))
    assert (d.gamma, d.reason) == (2, "infeasible")


def test_when_even_min_gamma_does_not_fit_the_controller_drafts_what_fits():
    ctl = controller(min_gamma=2)
    d = ctl.decide(BatchState(10, 25))          # only gamma 1 fits
    assert (d.gamma, d.reason) == (1, "infeasible")


def test_first_step_and_gamma_changes_are_not_rewarded():
    ctl = fixed(2)
    run_step(ctl, 0.0, 1.0)                      # no previous step: unstable
    assert ctl.summary()["reward_tok_s"] == {}
    run_step(ctl, 1.0, 2.0, committed=30)        # same gamma as before: stable
    assert ctl.summary()["reward_tok_s"] == {"2": 30.0}


def test_a_step_after_a_gamma_change_is_unstable():
    ctl = controller(policy="cycle", min_gamma=0)   # 4, 0, 3, 1, 2, ...
    for i in range(5):
        run_step(ctl, i, i + 1.0)                # each verifies drafts of another gamma
    assert ctl.summary()["reward_tok_s"] == {}


def test_the_policy_learns_the_decided_gamma_and_the_controllers_interval():
    seen = []
    ctl = fixed(3)
    ctl.policy.observe = seen.append
    run_step(ctl, 1.0, 1.5, committed=6)
    run_step(ctl, 2.0, 2.25, committed=6)
    assert [(o.gamma, o.interval_s, o.reward, o.stable) for o in seen] == [
        (3, 0.5, 12.0, False), (3, 0.25, 24.0, True)]


def test_reward_uses_the_non_overlapping_interval_under_async_scheduling():
    ctl = fixed(2)
    ctl.decide(BatchState(2, BUDGET))            # at 0.0
    ctl.clock.now = 0.5
    ctl.decide(BatchState(2, BUDGET))            # step 2 scheduled before step 1 completes
    ctl.clock.now = 1.0
    ctl.observe(feedback())
    ctl.clock.now = 1.5
    ctl.observe(feedback(committed=10))
    # Step 2 owns only 1.0 -> 1.5, not 0.5 -> 1.5.
    assert ctl.summary()["reward_tok_s"] == {"2": 20.0}


def test_idle_time_before_a_step_is_not_charged_to_it():
    ctl = fixed(2)
    run_step(ctl, 0.0, 1.0)
    ctl.step_processed(busy=False)               # no request left: the engine may idle
    run_step(ctl, 5.0, 5.5, committed=10)        # idle from 1.0 to 5.0
    assert ctl.summary()["reward_tok_s"] == {"2": 20.0}


def test_a_busy_engines_step_starts_where_the_previous_output_was_processed():
    # Output processing and scheduling take the same time at every gamma:
    # leaving them out would favour low gammas.
    ctl = fixed(2)
    run_step(ctl, 0.0, 1.0)
    ctl.clock.now = 1.1
    ctl.step_processed(busy=True)                # requests remain
    ctl.clock.now = 1.2
    ctl.step_processed(busy=True)                # a step the controller did not decide (prefill)
    run_step(ctl, 1.7, 2.2, committed=10)        # scheduled at 1.7, charged from 1.2
    assert ctl.summary()["reward_tok_s"] == {"2": 10.0}


def test_observe_without_decide_is_an_adapter_bug():
    with pytest.raises(RuntimeError, match="decide"):
        fixed(2).observe(feedback())


def test_summary_counts_steps_per_gamma_and_bucket_and_is_json():
    ctl = fixed(1)
    for i in range(3):
        run_step(ctl, i, i + 1, num_reqs=2)
    run_step(ctl, 3, 4, num_reqs=5)
    s = json.loads(json.dumps(ctl.summary()))
    assert s["steps"] == {"1": 4}
    assert s["buckets"]["2"]["steps"] == {"1": 3}
    assert s["buckets"]["8"]["steps"] == {"1": 1}
    assert "steps_per_gamma" in ctl.summary_line()


def test_overhead_is_reported_per_step_per_bucket_and_as_share_of_step_time(tmp_path):
    path = tmp_path / "trace.jsonl"
    ctl = fixed(2, trace_path=str(path))
    for i in range(4):                           # bucket 2: 4 steps of 1 s each
        ctl.clock.now = float(i)
        ctl.decide(BatchState(2, BUDGET), host_overhead_s=0.004)
        ctl.clock.now = i + 1.0
        ctl.observe(feedback(), host_overhead_s=0.006)
    ctl.decide(BatchState(16, BUDGET))           # bucket 16: one step of 0.5 s
    ctl.clock.now = 4.5
    ctl.observe(feedback(num_reqs=16), host_overhead_s=0.05)
    ctl.close()
    s = ctl.summary()
    # The host's share dominates; decide/observe themselves add microseconds.
    assert 10000 <= s["buckets"]["2"]["overhead_us_per_step"] < 10500
    assert 0.01 <= s["buckets"]["2"]["overhead_share"] < 0.0105
    assert 0.1 <= s["buckets"]["16"]["overhead_share"] < 0.101
    assert 0.02 <= s["overhead_share"] < 0.0202     # 0.09 s of 4.5 s
    assert "(2.0" in ctl.summary_line()
    _, records = read_trace(path)
    assert [r["overhead_us"] >= 1e4 for r in records] == [True] * 5


def test_trace_has_a_header_and_one_line_per_observed_step(tmp_path):
    path = tmp_path / "trace.jsonl"
    ctl = fixed(2, trace_path=str(path))
    for i in range(3):
        run_step(ctl, i, i + 1)
    ctl.close()
    header, records = read_trace(path)
    assert header["policy"] == "fixed" and header["max_gamma"] == 4
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["stable"] for r in records] == [False, True, True]
    assert records[1]["reason"] == "fixed" and records[1]["interval_s"] == 1.0
    # Completion times on the controller's clock since it was built (at 0).
    assert [r["t_s"] for r in records] == [1.0, 2.0, 3.0]


def test_a_model_trace_explains_each_decision_and_keeps_prefill_steps_on_lines_of_their_own(
        tmp_path):
    path, clock = tmp_path / "trace.jsonl", Clock()
    ctl = controller(clock, policy="model", min_gamma=0, trace_path=str(path))
    for i in range(6):
        state = BatchState(2, BUDGET, 300.0, prefill_tokens=100 * (i % 2))
        d = ctl.decide_step(["a", "b"], {"a", "b"}, bool(i % 2), lambda: state)
        clock.now += 0.02
        if d.decided:
            ctl.observe(feedback(drafted=d.gamma))
        else:
            ctl.observe_undecided(state, feedback())
        ctl.step_processed(busy=True)
    ctl.close()
    from vllm_vspec.core.trace import read_prefill_steps
    _, records = read_trace(path)
    prefill = read_prefill_steps(path)
    assert len(records) == 3 and len(prefill) == 3
    assert [p["prefill_tokens"] for p in prefill] == [100, 100, 100]
    assert all(set(r["predicted"]) == {"0", "1", "2", "3", "4"} for r in records)


def test_a_trace_records_the_prefill_steps_of_a_policy_that_does_not_price_them(tmp_path):
    # A fixed-gamma server's trace is the comparator of a paired run's:
    # its prefill steps' time belongs to the run as much as its decode steps'.
    path, clock = tmp_path / "trace.jsonl", Clock()
    ctl = controller(clock, policy="fixed", fixed_gamma=0, min_gamma=0, trace_path=str(path))
    assert not ctl.prices_steps
    prefill = BatchState(3, BUDGET, 50.0, prefill_tokens=400)
    assert ctl.decide_step(["a", "b", "c"], {"a", "b", "c"}, True, lambda: prefill).reason == "prefill"
    clock.now += 0.07
    ctl.observe_undecided(prefill, feedback(num_reqs=3))
    ctl.step_processed(busy=True)
    ctl.close()
    from vllm_vspec.core.trace import read_prefill_steps
    steps = read_prefill_steps(path)
    assert [(p["prefill_tokens"], p["gamma"], p["interval_s"], p["t_s"]) for p in steps] == [
        (400, 0, 0.07, 0.07)]


def test_reading_a_foreign_file_as_a_trace_fails_naming_the_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"schema": "vllm-vspec/trace", "version": 1}\n{"step": 1}\n')
    with pytest.raises(TraceError, match=r"x.jsonl:2: missing key 'num_reqs'"):
        read_trace(path)


def test_policies_and_step_types_do_not_import_the_controller():
    # controller.py imports the policies; a policy importing controller.py
    # back would be a cycle (steps.py, a leaf, holds the types both use).
    import subprocess
    import sys

    code = ("import sys\n"
            "import vllm_vspec.core.steps, vllm_vspec.core.policies\n"
            "from vllm_vspec.core.policies import REGISTRY, make_policy\n"
            "from vllm_vspec.config import VSpecConfig\n"
            "for name in REGISTRY:\n"
            "    make_policy(VSpecConfig(policy=name, profile_path='profiles/"
            "ascend-910b-qwen25-14b-draft.json').with_max_gamma(4))\n"
            "print('vllm_vspec.core.controller' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    assert out.split() == ["False"]


# ------------------------------------------------------------------ tree arms
def test_a_step_is_stable_only_after_one_of_the_same_gamma_and_width():
    seen = []
    ctl = GammaController(VSpecConfig(policy="cycle", min_gamma=1), 4, clock=Clock(),
                          max_width=2)
    ctl.policy.observe = seen.append
    drafted_width = 1           # the host reports the width the verified drafts had
    for i in range(6):
        ctl.clock.now = i
        decision = ctl.decide(BatchState(2, BUDGET))
        ctl.clock.now = i + 1.0
        ctl.observe(StepFeedback((0, 0), (0, 0), 10, width=drafted_width))
        drafted_width = decision.width
    arms = [(o.gamma, o.width) for o in seen]
    # Cost order (nodes, depth): (1,1) (1,2) (2,1) (3,1) (2,2) (4,1); interleaved.
    assert arms == [(4, 1), (1, 1), (2, 2), (1, 2), (3, 1), (2, 1)]
    assert [o.verified_width for o in seen] == [1, 1, 1, 2, 2, 1]
    assert not any(o.stable for o in seen)


def test_tree_arms_are_named_gamma_x_width_in_the_summary_and_traced_with_width(tmp_path):
    path = tmp_path / "trace.jsonl"
    ctl = GammaController(VSpecConfig(policy="fixed", fixed_gamma=2, trace_path=str(path)), 4,
                          clock=Clock(), max_width=2)
    # Before any decision: the fixed policy's own arm (issue 29: a prefill
    # step drafts what the policy asks for, not max_gamma).
    assert (ctl.gamma, ctl.width) == (2, 2)
    for i in range(3):
        run_step(ctl, i, i + 1)
    assert (ctl.gamma, ctl.width) == (2, 2)
    ctl.decide(BatchState(2, BUDGET, tree_allowed=False))
    assert (ctl.gamma, ctl.width) == (2, 1)
    ctl.clock.now = 4.0
    ctl.observe(feedback())
    ctl.close()
    s = ctl.summary()
    assert s["steps"] == {"2": 1, "2x2": 3} and s["reward_tok_s"] == {"2x2": 10.0}
    assert "width<=2" in ctl.summary_line()
    header, records = read_trace(path)
    assert (header["min_width"], header["max_width"]) == (1, 2)
    assert [(r["gamma"], r["width"]) for r in records] == [(2, 2)] * 3 + [(2, 1)]


def test_tree_widths_must_be_ordered_and_at_least_1():
    for lo, hi in ((0, 2), (3, 2)):
        with pytest.raises(ValueError, match=f"min_width={lo}, max_width={hi}"):
            GammaController(VSpecConfig(), 4, min_width=lo, max_width=hi)


class CostListener:
    """A policy's observe_cost, recorded (the rest is the fixed policy's)."""

    def __init__(self):
        self.seen = []

    def __call__(self, batch, fb, gamma, interval_s):
        self.seen.append((batch.prefill_tokens, gamma, round(interval_s, 6)))


def test_an_undecided_prefill_step_reaches_a_policy_that_prices_steps_with_its_interval():
    clock = Clock()
    ctl = fixed(2, clock)
    ctl.policy.observe_cost = listener = CostListener()
    ctl.prices_steps = True              # as for a policy with observe_cost
    ctl.decide(BatchState(2, BUDGET))
    clock.now = 0.05
    ctl.observe(feedback())
    ctl.step_processed(busy=True)
    prefill = BatchState(3, BUDGET, prefill_tokens=400)
    assert ctl.decide_step({"a", "b", "c"}, {"a", "b", "c"}, True, lambda: prefill).reason == "prefill"
    clock.now = 0.12                     # the prefill step took 70 ms
    ctl.observe_undecided(prefill, feedback(num_reqs=3))
    ctl.step_processed(busy=True)
    assert listener.seen == [(400, 2, 0.07)]


def test_an_undecided_step_is_left_out_while_a_decided_one_is_outstanding():
    clock = Clock()
    ctl = fixed(2, clock)
    ctl.policy.observe_cost = listener = CostListener()
    ctl.prices_steps = True              # as for a policy with observe_cost
    ctl.step_processed(busy=True)
    prefill = BatchState(3, BUDGET, prefill_tokens=400)
    ctl.decide_step({"a", "b", "c"}, {"a", "b", "c"}, True, lambda: prefill)
    ctl.decide(BatchState(2, BUDGET))    # async: scheduled, its output not yet processed
    clock.now = 0.05
    ctl.observe_undecided(prefill, feedback(num_reqs=3))
    assert listener.seen == []


def test_a_policy_that_does_not_price_steps_keeps_no_record_of_undecided_ones():
    ctl = fixed(2)
    prefill = BatchState(3, BUDGET, prefill_tokens=400)
    for _ in range(3):
        ctl.decide_step({"a"}, {"a"}, True, lambda: prefill)
    assert not ctl._undecided
