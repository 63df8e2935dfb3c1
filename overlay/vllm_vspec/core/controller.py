"""GammaController: chooses gamma (the draft length) for every decode step,
and the tree width with it when given a max width above 1.

The host adapter calls `decide_step(...)` once per scheduled step and
applies the Decision it returns; `observe(StepFeedback)` once per processed
output of a decided step (`Decision.decided`), in scheduling order (with
async scheduling a few decisions may be pending before their outputs
arrive; they are matched first-in first-out), and `step_processed(busy)`
after every step's output, decided or not. (`decide(BatchState)` is the
policy's part of decide_step, which the simulators call directly.) The
controller owns what all policies share and is the one owner of each piece
of step state: the decision in force (`gamma`), which steps are decided at
all (a prefill step keeps the arm in force; sticky gamma 0 holds), the
feasible gamma range of a step, the batch-size bucket, the step's interval
(stamped on `clock`), its reward, which steps are "stable", the summary and
the trace. The policy (see policies/, chosen by `config.policy`) only
scores arms.

Arms (arms.py): gammas, or (gamma, width) trees when the controller is
built with `max_width` > 1 (what the engine's `tree_width` /
`min_tree_width` settings will pass: docs/design/eagle-tree.md 4.5). A tree of
width W drafts gamma*W nodes within the host's `num_speculative_tokens`.
With max_width 1 (the default) every decision and tally is what it was
before widths existed (tests/unit/test_arm_replay.py); trace lines carry width 1.

Timing model of speculative decoding: the drafts PROPOSED in step n (with
step n's gamma) are VERIFIED in step n+1. A step's time and committed tokens
therefore mix two gammas unless both are equal; only such "stable" steps are
rewarded, so a reward always describes one gamma (one arm: gamma and
width). For the same reason a step's acceptance is that of the width its
verified drafts were drafted with, as the host reports it
(`StepFeedback.width`, passed on as `StepOutcome.verified_width`).

No vLLM import here: this is the host-agnostic core.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Collection, Container

from vllm_vspec.core.arms import arm_label, make_space
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.policies import make_policy
from vllm_vspec.core.steps import (BatchState, BusySince, Decision, StepFeedback, StepOutcome,
                                   bucket_of, feasible_max_gamma)
from vllm_vspec.core.trace import DecisionTrace
from vllm_vspec.core.warm_state import WarmKey, WarmStore, state_dir


@dataclass
class GammaTally:
    """Steps of one arm (in one bucket, or over all)."""

    decided: int = 0               # steps decided at this gamma
    rewarded: int = 0              # of the observed ones, stable steps (rewarded)
    reward_sum: float = 0.0        # sum of their rewards (committed tokens/s)

    def add(self, other: "GammaTally") -> None:
        self.decided += other.decided
        self.rewarded += other.rewarded
        self.reward_sum += other.reward_sum


@dataclass
class CostTally:
    """The controller's own cost over observed steps (one bucket, or all)."""

    controller_s: float = 0.0      # decide + observe + the adapter's bookkeeping, wall clock
    interval_s: float = 0.0        # the steps' intervals
    steps: int = 0

    def add(self, other: "CostTally") -> None:
        self.controller_s += other.controller_s
        self.interval_s += other.interval_s
        self.steps += other.steps


@dataclass(frozen=True)
class _Pending:
    """A decided step whose output is not yet observed."""

    batch: BatchState
    decision: Decision
    scheduled_at: float            # clock(): where the step's interval may start
    overhead_s: float              # decide() and the adapter's share, wall clock
    predicted: dict | None = None  # the policy's explanation, for the trace


class GammaController:
    def __init__(self, config: VSpecConfig, num_speculative_tokens: int,
                 clock: Callable[[], float] = time.perf_counter,
                 min_width: int = 1, max_width: int = 1, warm_key: WarmKey | None = None):
        """`min_width`/`max_width`: the tree widths the policy may choose
        (ValueError unless 1 <= min_width <= max_width); the widest tree
        still drafts at most `num_speculative_tokens` nodes. `warm_key`:
        what this engine is (host, models, method, K), given by a host
        that serves: a policy with state() and restore() (`model`) then
        starts from the state file of that key in `model_state_dir` and
        keeps it up to date (warm_state.py); None: nothing is read or kept."""
        self.config = config.with_max_gamma(num_speculative_tokens)
        self.num_speculative_tokens = num_speculative_tokens
        self.clock = clock
        self.space = make_space(min_width, max_width, num_speculative_tokens)
        self.policy = make_policy(self.config, self.space)
        directory = None if warm_key is None else state_dir(self.config.model_state_dir)
        self._warm = (WarmStore(directory, dataclasses.replace(warm_key, policy=self.config.policy))
                      if directory is not None and hasattr(self.policy, "restore") else None)
        if self._warm is not None:
            self._warm.load(self.policy)
        opening = getattr(self.policy, "opening", lambda: None)()
        self._opening = ((self.config.max_gamma, 1) if opening is None else
                         (min(self.space.gamma(opening), self.config.max_gamma),
                          self.space.width(opening)))
        self._pending: deque[_Pending] = deque()
        # A policy that prices every step (`observe_cost`) hears of the
        # undecided prefill steps too (observe_undecided), and a trace
        # records them whatever the policy: when each outstanding one
        # started, and the gamma in force (its drafts).
        self.prices_steps = hasattr(self.policy, "observe_cost")
        self._undecided: deque[tuple[float, int]] = deque()
        # gamma0_mode sticky (as wiring.resolve resolves it): the requests
        # whose draft KV missed a target-only step; no speculation while one
        # of them remains.
        self._sticky = self.config.gamma0_mode == "sticky"
        self._stale: set[str] = set()
        self._last_decision: Decision | None = None
        # Where a busy engine's next step starts (steps.BusySince).
        self._busy = BusySince()
        self._last_completed_at: float | None = None
        self._born = clock()                  # the trace's time origin (`t_s`)
        self._last_observed: tuple[int, int] | None = None     # (gamma, width) last observed
        self._steps = 0
        self._cost: dict[int, CostTally] = {}                  # bucket -> cost
        # bucket -> (gamma, width) -> tally
        self._stats: dict[int, dict[tuple[int, int], GammaTally]] = {}
        self._trace = (DecisionTrace(self.config.trace_path, {
            "policy": self.config.policy, "min_gamma": self.config.min_gamma,
            "max_gamma": self.config.max_gamma,
            "num_speculative_tokens": num_speculative_tokens,
            "min_width": min_width, "max_width": max_width})
            if self.config.trace_path else None)

    @property
    def hears_undecided(self) -> bool:
        """Whether the host reports the prefill steps the controller does
        not decide (`undecided`, `observe_undecided`): a policy that prices
        steps learns from them, a trace records them."""
        return self.prices_steps or self._trace is not None

    @property
    def gamma(self) -> int:
        """The gamma in force: the last decision; before the first, the
        policy's opening arm (`fixed`: its gamma), else max_gamma (where
        `online` and `cycle` start). A host step the controller does not
        decide (a prefill step) keeps it, so the drafts a prefill step
        proposes are the ones the policy would ask for: under `fixed` gamma
        0 the first decode step verifies nothing, not 1 + K per
        request."""
        if self._last_decision is not None:
            return self._last_decision.gamma
        return self._opening[0]

    @property
    def width(self) -> int:
        """The tree width in force (the opening arm's before the first decision)."""
        return self._opening[1] if self._last_decision is None else self._last_decision.width

    # ------------------------------------------------------------ per step
    def decide_step(self, scheduled: Collection[str], live: Container[str], prefill: bool,
                    batch: Callable[[], BatchState]) -> Decision | None:
        """The Decision for one scheduled step, which the host applies as it
        is. `scheduled`: the step's request ids; `live`: the requests the
        host still holds; `prefill`: some request processes prompt tokens;
        `batch()` builds the step's BatchState, called only for a step the
        policy decides. None: no request is scheduled and nothing is held.

        Not decided (`decided` False; the gamma in force stays):
        - "sticky": under gamma0_mode sticky, gamma 0 while a request that
          a decided gamma-0 step scheduled remains (the drafter skipped its
          tokens); the requests scheduled meanwhile join it.
        - "prefill": a prefill step's time is not a decode step's and would
          skew the reward of whichever arm is in force, so the step keeps
          that arm (linear where the batch rules a tree out,
          `BatchState.tree_allowed`), unless `reward_prefill_steps` (or
          after a sticky gamma 0: a new cohort's prefill must not skip the
          drafter); a policy with `prefill_gamma` may run it at gamma 0.

        The width of every Decision is the one place a step's tree is
        allowed: the host's runner drafts what it is handed."""
        if self._stale:
            self._stale.intersection_update(live)
            if self._stale:
                self._stale.update(scheduled)
                return Decision(0, bucket_of(len(scheduled)), "sticky", decided=False)
        if (prefill and not self.config.reward_prefill_steps
                and not (self._sticky and self.gamma == 0)):
            gamma, width = self.gamma, self.width
            if width == 1 and hasattr(self.policy, "prefill_gamma"):
                gamma = self.policy.prefill_gamma(batch(), gamma)
            self.undecided(gamma)
            width = width if width == 1 or batch().tree_allowed else 1
            return Decision(gamma, bucket_of(len(scheduled)), "prefill", width,
                            decided=False)
        if not scheduled:
            return None
        started = time.perf_counter()
        state = batch()
        decision = self.decide(state, host_overhead_s=time.perf_counter() - started)
        if self._sticky and decision.gamma == 0:
            self._stale.update(scheduled)
        return decision

    def decide(self, batch: BatchState, host_overhead_s: float = 0.0) -> Decision:
        """The policy's decision for a step (decide_step's decided steps).
        `host_overhead_s`: wall time the host adapter spent building `batch`."""
        started = time.perf_counter()
        scheduled_at = self._step_start()
        bucket = bucket_of(batch.num_reqs)
        lo, hi = self.config.min_gamma, feasible_max_gamma(batch, self.config.max_gamma)
        space = self.space
        if hi < lo:
            # Not even min_gamma fits the token budget: draft what fits.
            decision = Decision(max(hi, 0), bucket, "infeasible")
        else:
            last = self._last_decision
            previous = None if last is None else space.arm(last.gamma, last.width)
            arm, reason = self.policy.decide(batch, bucket, lo, hi, previous)
            decision = Decision(space.gamma(arm), bucket, reason, space.width(arm))
        self._stat(bucket, decision.gamma, decision.width).decided += 1
        self._last_decision = decision
        overhead = host_overhead_s + time.perf_counter() - started
        # The trace's explanation is the opt-in trace's cost, not counted.
        predicted = (self.policy.explain(batch, lo, hi) if self._trace is not None
                     and hasattr(self.policy, "explain") and hi >= lo else None)
        self._pending.append(_Pending(batch, decision, scheduled_at, overhead, predicted))
        return decision

    def observe(self, fb: StepFeedback, host_overhead_s: float = 0.0) -> None:
        """The output of the oldest pending decided step, processed now.
        `host_overhead_s`: wall time the host adapter spent building `fb`;
        it is added to the step's controller overhead."""
        completed_at = self.clock()
        started = time.perf_counter()
        if not self._pending:
            raise RuntimeError("GammaController.observe() without a pending decide(): "
                               "the adapter must call decide() once per scheduled step")
        step = self._pending.popleft()
        batch, decision = step.batch, step.decision
        interval = self._completed(step.scheduled_at, completed_at)
        arm = (decision.gamma, decision.width)
        stable = self._last_observed == arm and interval > 0
        self._last_observed = arm
        reward = fb.committed / interval if interval > 0 else 0.0
        self.policy.observe(StepOutcome(fb, batch, decision.gamma, decision.bucket, interval,
                                        reward, stable, decision.width, fb.width))
        if self._warm is not None:
            self._warm.observed(self.policy)
        if stable:
            stat = self._stat(decision.bucket, decision.gamma, decision.width)
            stat.rewarded += 1
            stat.reward_sum += reward
        self._steps += 1
        # Measured on the wall clock, whatever `clock` the rewards use; the
        # trace write below is the opt-in trace's cost, not counted.
        overhead = step.overhead_s + host_overhead_s + time.perf_counter() - started
        cost = self._cost.setdefault(decision.bucket, CostTally())
        cost.add(CostTally(overhead, max(interval, 0.0), 1))
        if self._trace is not None:
            self._trace.write({
                "step": self._steps, "num_reqs": batch.num_reqs, "bucket": decision.bucket,
                "mean_context_len": batch.mean_context_len, "gamma": decision.gamma,
                "width": decision.width, "reason": decision.reason, "drafted": list(fb.drafted),
                "accepted": list(fb.accepted), "committed": fb.committed,
                "interval_s": round(interval, 6), "t_s": round(completed_at - self._born, 4),
                "stable": stable,
                "reward": round(reward, 3), "overhead_us": round(overhead * 1e6, 1),
                **({"predicted": step.predicted} if step.predicted is not None else {})})

    def undecided(self, gamma: int) -> None:
        """A step scheduled now at `gamma` that the controller does not
        decide (decide_step's "prefill", or the host's padded steps:
        core/padded_gamma.py): a policy that prices steps hears of its
        output through observe_undecided, one call per such step, in order."""
        if self.hears_undecided:
            self._undecided.append((self._step_start(), gamma))

    def observe_undecided(self, batch: BatchState | None, fb: StepFeedback,
                          learn: Callable | None = None) -> None:
        """The oldest outstanding undecided step (`undecided`) was
        processed now, before `step_processed`: a policy that prices steps
        (`observe_cost`) learns its time and what it did, with the gamma
        that was in force (the drafts it proposed); `learn(batch, fb,
        gamma, interval_s)` instead where the host says how (a padded
        step: padded_gamma.observe_padded). Its interval follows the
        decided steps' rule; while a decided step is outstanding (async
        scheduling) the step is left out, its interval not its own."""
        if not self._undecided:
            return
        scheduled_at, gamma = self._undecided.popleft()
        if self._pending or batch is None:     # None: no request of the step is left
            return
        completed_at = self.clock()
        interval = self._completed(scheduled_at, completed_at)
        if interval > 0 and (learn is not None or self.prices_steps):
            (learn or self.policy.observe_cost)(batch, fb, gamma, interval)
        if self._trace is not None and learn is None:
            self._trace.write({"prefill_step": self._steps, "num_reqs": batch.num_reqs,
                               "prefill_tokens": batch.prefill_tokens, "gamma": gamma,
                               "committed": fb.committed, "interval_s": round(interval, 6),
                               "t_s": round(completed_at - self._born, 4)})

    def _completed(self, scheduled_at: float, completed_at: float) -> float:
        """A step scheduled at `scheduled_at` completed at `completed_at`:
        its interval, which does not overlap the step completed before it
        (under async scheduling step n+1 is scheduled before step n
        completes)."""
        start = scheduled_at if self._last_completed_at is None else max(
            self._last_completed_at, scheduled_at)
        self._last_completed_at = completed_at
        return completed_at - start

    def _step_start(self) -> float:
        """When a step scheduled now starts: where the host processed the
        previous step's output if busy since, else now (steps.BusySince)."""
        return self.clock() if self._busy.since is None else self._busy.since

    def step_processed(self, busy: bool) -> None:
        """The host processed a step's output (any step, decided or not).
        `busy`: requests remain, so the next step's interval starts now."""
        self._busy.processed(self.clock(), busy)

    def _stat(self, bucket: int, gamma: int, width: int) -> GammaTally:
        return self._stats.setdefault(bucket, {}).setdefault((gamma, width), GammaTally())

    # ------------------------------------------------------------ reporting
    def summary(self) -> dict:
        """Steps decided per arm, mean stable-step reward (committed
        tokens/s) per arm, and the controller's overhead (us per observed
        step, share of step time), overall and per batch-size bucket.
        JSON-able. Arms are named by arms.arm_label: "3" is gamma 3 at
        width 1, "2x4" depth 2 and width 4."""
        def view(per_arm: dict[tuple[int, int], GammaTally], cost: CostTally) -> dict:
            return {"steps": {arm_label(*a): t.decided for a, t in sorted(per_arm.items())},
                    "reward_tok_s": {arm_label(*a): round(t.reward_sum / t.rewarded, 2)
                                     for a, t in sorted(per_arm.items()) if t.rewarded},
                    "overhead_us_per_step": (round(cost.controller_s / cost.steps * 1e6, 1)
                                             if cost.steps else 0.0),
                    "overhead_share": (round(cost.controller_s / cost.interval_s, 5)
                                       if cost.interval_s else 0.0)}
        total: dict[tuple[int, int], GammaTally] = {}
        for per_arm in self._stats.values():
            for a, t in per_arm.items():
                total.setdefault(a, GammaTally()).add(t)
        total_cost = CostTally()
        for c in self._cost.values():
            total_cost.add(c)
        return {"policy": self.config.policy, "min_gamma": self.config.min_gamma,
                "max_gamma": self.config.max_gamma, "max_width": self.space.max_width,
                "observed_steps": self._steps,
                **view(total, total_cost),
                "buckets": {str(b): view(pg, self._cost.get(b, CostTally()))
                            for b, pg in sorted(self._stats.items())}}

    def summary_line(self) -> str:
        """One log line: policy, steps and mean reward per arm, and the
        controller's cost per step (absolute and as a share of step time)."""
        s = self.summary()
        widths = f" width<={s['max_width']}" if s["max_width"] > 1 else ""
        return (f"policy={s['policy']} gamma=[{s['min_gamma']},{s['max_gamma']}]{widths} "
                f"steps={self._steps} steps_per_gamma={json.dumps(s['steps'])} "
                f"reward_tok_s={json.dumps(s['reward_tok_s'])} "
                f"overhead={s['overhead_us_per_step']}us/step "
                f"({100 * s['overhead_share']:.2f}% of step time)")

    def close(self) -> None:
        """Save the warm state and flush and close the trace file (those in use)."""
        if self._warm is not None:
            self._warm.save(self.policy)
        if self._trace is not None:
            self._trace.close()
