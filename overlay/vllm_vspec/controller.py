"""GammaController: chooses gamma (the draft length) for every decode step.

The host adapter calls `decide(BatchState)` once per scheduled step and
`observe(StepFeedback)` once per processed step output, in scheduling order
(with async scheduling a few decisions may be pending before their outputs
arrive; they are matched first-in first-out). The controller owns what all
policies share: the feasible gamma range of a step, the batch-size bucket,
the reward of a step, which steps are "stable", the summary and the trace.
The policy (see policies/, chosen by `config.policy`) only scores gammas.

Timing model of speculative decoding: the drafts PROPOSED in step n (with
step n's gamma) are VERIFIED in step n+1. A step's time and committed tokens
therefore mix two gammas unless both are equal; only such "stable" steps are
rewarded, so a reward always describes one gamma.

No vLLM import here: this is the host-agnostic core.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from vllm_vspec.config import VSpecConfig
from vllm_vspec.policies import make_policy
from vllm_vspec.trace import DecisionTrace


@dataclass(frozen=True)
class BatchState:
    num_reqs: int                  # decode requests scheduled this step (B)
    max_num_batched_tokens: int    # gamma g feasible iff num_reqs * (g + 1) <= this
    mean_context_len: float = 0.0


@dataclass(frozen=True)
class StepFeedback:
    gamma: int                     # the gamma decided when this step was scheduled (it governs the drafts PROPOSED in this step)
    num_reqs: int
    drafted: tuple[int, ...]       # per request: draft tokens VERIFIED in this step (proposed with the previous decision)
    accepted: tuple[int, ...]      # per request: of those, accepted
    committed: int                 # tokens committed this step over the batch
    scheduled_at: float            # clock() when this step's scheduling began (a busy host: its previous step's output)
    completed_at: float            # clock() when the host processed its output


@dataclass(frozen=True)
class Decision:
    gamma: int
    bucket: int                    # batch-size bucket 2**ceil(log2 B)
    reason: str                    # short word: warmup / ucb / hold / hysteresis / fixed / profile / infeasible / ...


@dataclass(frozen=True)
class StepOutcome:
    """What a policy learns from one processed step."""

    feedback: StepFeedback
    batch: BatchState              # as it was when the step was scheduled
    bucket: int
    interval_s: float              # non-overlapping completion interval
    reward: float                  # committed tokens per second of that interval
    stable: bool                   # verified and proposed drafts used the same gamma


def bucket_of(num_reqs: int) -> int:
    """Batch-size bucket: the next power of two >= num_reqs (1 for B <= 1)."""
    return 1 if num_reqs <= 1 else 1 << math.ceil(math.log2(num_reqs))


def nearest_bucket(buckets: Iterable[int], bucket: int) -> int | None:
    """Of `buckets`, the one nearest to `bucket` in doublings of batch size
    (buckets are powers of two: distance is the log ratio); ties prefer the
    smaller. None when `buckets` is empty."""
    return min(buckets, key=lambda b: (abs(math.log2(b / bucket)), b), default=None)


def feasible_max_gamma(batch: BatchState, max_gamma: int) -> int:
    """Largest gamma with num_reqs * (gamma + 1) <= max_num_batched_tokens
    (may be negative when not even target-only fits), capped at max_gamma."""
    return min(max_gamma, batch.max_num_batched_tokens // max(batch.num_reqs, 1) - 1)


class GammaController:
    def __init__(self, config: VSpecConfig, num_speculative_tokens: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config.with_max_gamma(num_speculative_tokens)
        self.num_speculative_tokens = num_speculative_tokens
        self.clock = clock
        self.policy = make_policy(self.config)
        # (batch, decision, seconds decide() took) of scheduled steps whose
        # output is not yet observed.
        self._pending: deque[tuple[BatchState, Decision, float]] = deque()
        self._last_completed_at: float | None = None
        self._last_observed_gamma: int | None = None
        self._steps = 0
        # bucket -> [controller seconds, step-interval seconds, steps] of observed steps
        self._cost: dict[int, list[float]] = {}
        # bucket -> gamma -> [decided steps, rewarded steps, reward sum]
        self._stats: dict[int, dict[int, list[float]]] = {}
        self._trace = (DecisionTrace(self.config.trace_path, {
            "policy": self.config.policy, "min_gamma": self.config.min_gamma,
            "max_gamma": self.config.max_gamma,
            "num_speculative_tokens": num_speculative_tokens})
            if self.config.trace_path else None)

    # ------------------------------------------------------------ per step
    def decide(self, batch: BatchState) -> Decision:
        started = time.perf_counter()
        bucket = bucket_of(batch.num_reqs)
        lo, hi = self.config.min_gamma, feasible_max_gamma(batch, self.config.max_gamma)
        if hi < lo:
            # Not even min_gamma fits the token budget: draft what fits.
            decision = Decision(max(hi, 0), bucket, "infeasible")
        else:
            gamma, reason = self.policy.decide(batch, bucket, lo, hi)
            decision = Decision(gamma, bucket, reason)
        self._stat(bucket, decision.gamma)[0] += 1
        self._pending.append((batch, decision, time.perf_counter() - started))
        return decision

    def observe(self, fb: StepFeedback, host_overhead_s: float = 0.0) -> None:
        """`host_overhead_s`: wall time the host adapter spent on vspec for
        this step outside decide()/observe() (building BatchState and `fb`);
        it is added to the step's controller overhead."""
        started = time.perf_counter()
        if not self._pending:
            raise RuntimeError("GammaController.observe() without a pending decide(): "
                               "the adapter must call decide() once per scheduled step")
        batch, decision, decide_s = self._pending.popleft()
        # Non-overlapping interval: under async scheduling step n+1 is scheduled
        # before step n completes, and idle time before scheduling is no cost.
        start = fb.scheduled_at if self._last_completed_at is None else max(
            self._last_completed_at, fb.scheduled_at)
        interval = fb.completed_at - start
        self._last_completed_at = fb.completed_at
        stable = self._last_observed_gamma == fb.gamma and interval > 0
        self._last_observed_gamma = fb.gamma
        reward = fb.committed / interval if interval > 0 else 0.0
        outcome = StepOutcome(fb, batch, decision.bucket, interval, reward, stable)
        self.policy.observe(outcome)
        if stable:
            stat = self._stat(decision.bucket, fb.gamma)
            stat[1] += 1
            stat[2] += reward
        self._steps += 1
        # Measured on the wall clock, whatever `clock` the rewards use; the
        # trace write below is the opt-in trace's cost, not counted.
        overhead = decide_s + host_overhead_s + time.perf_counter() - started
        cost = self._cost.setdefault(decision.bucket, [0.0, 0.0, 0])
        cost[0] += overhead
        cost[1] += max(interval, 0.0)
        cost[2] += 1
        if self._trace is not None:
            self._trace.write({
                "step": self._steps, "num_reqs": batch.num_reqs, "bucket": decision.bucket,
                "mean_context_len": batch.mean_context_len, "gamma": fb.gamma,
                "reason": decision.reason, "drafted": list(fb.drafted),
                "accepted": list(fb.accepted), "committed": fb.committed,
                "interval_s": round(interval, 6), "stable": stable,
                "reward": round(reward, 3), "overhead_us": round(overhead * 1e6, 1)})

    def _stat(self, bucket: int, gamma: int) -> list[float]:
        return self._stats.setdefault(bucket, {}).setdefault(gamma, [0, 0, 0.0])

    # ------------------------------------------------------------ reporting
    def summary(self) -> dict:
        """Steps decided per gamma, mean stable-step reward (committed
        tokens/s) per gamma, and the controller's overhead (us per observed
        step, share of step time), overall and per batch-size bucket. JSON-able."""
        def view(per_gamma: dict[int, list[float]], cost: list[float]) -> dict:
            return {"steps": {str(g): int(s[0]) for g, s in sorted(per_gamma.items())},
                    "reward_tok_s": {str(g): round(s[2] / s[1], 2)
                                     for g, s in sorted(per_gamma.items()) if s[1]},
                    "overhead_us_per_step": round(cost[0] / cost[2] * 1e6, 1) if cost[2] else 0.0,
                    "overhead_share": round(cost[0] / cost[1], 5) if cost[1] else 0.0}
        total: dict[int, list[float]] = {}
        for per_gamma in self._stats.values():
            for g, s in per_gamma.items():
                t = total.setdefault(g, [0, 0, 0.0])
                for i in range(3):
                    t[i] += s[i]
        return {"policy": self.config.policy, "min_gamma": self.config.min_gamma,
                "max_gamma": self.config.max_gamma, "observed_steps": self._steps,
                **view(total, [sum(c[i] for c in self._cost.values()) for i in range(3)]),
                "buckets": {str(b): view(pg, self._cost.get(b, [0.0, 0.0, 0]))
                            for b, pg in sorted(self._stats.items())}}

    def summary_line(self) -> str:
        """One log line: policy, steps and mean reward per gamma, and the
        controller's cost per step (absolute and as a share of step time)."""
        s = self.summary()
        return (f"policy={s['policy']} gamma=[{s['min_gamma']},{s['max_gamma']}] "
                f"steps={self._steps} steps_per_gamma={json.dumps(s['steps'])} "
                f"reward_tok_s={json.dumps(s['reward_tok_s'])} "
                f"overhead={s['overhead_us_per_step']}us/step "
                f"({100 * s['overhead_share']:.2f}% of step time)")

    def close(self) -> None:
        """Flush and close the trace file (if any)."""
        if self._trace is not None:
            self._trace.close()
