"""`profile` policy: goodput argmax from a latency profile and online acceptance.

    G(k) = B * E(k) / (T_step(k) * f_k)

E(k) comes from the per-position acceptance EWMA (acceptance_stats.py),
T_step(k) from the profile at the step's batch size and context
(latency.py), and f_k is an online EWMA of measured / predicted step time
for gamma k in the step's batch-size bucket (stable steps only; 1.0 when
`latency_calibration` is off). Per bucket, because a profile's error
depends on batch size: one timed in-process misses the server's per-step
costs, which weigh most at batch 1. Until (bucket, k) is measured, f is the
mean of the bucket's measured gammas (a profile is usually off by a common
factor on a new machine), else that of the nearest measured bucket, else 1.
The switching rules are shared with the online policy (governor.py).

Tree arms (arms.py `TreeArms`): k becomes an arm (gamma, width), E comes
from the acceptance of that width's trees, and T_step(gamma, width) is the
profile's tree step (latency.py `LatencyProfile.split_step_ms`): the first
draft pass over B queries, each further depth one pass over B*width, and a
verify of B*(1 + gamma*width) tokens; f is per arm like k's.
"""

from __future__ import annotations

from vllm_vspec.core.arms import Arm, GammaArms, WidthAcceptance
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.latency import LatencyProfile, load_profile
from vllm_vspec.core.policies.governor import Governor
from vllm_vspec.core.steps import nearest_bucket


class ProfilePolicy:
    def __init__(self, config: VSpecConfig, profile: LatencyProfile | None = None, space=None):
        self.config = config
        self.profile = profile if profile is not None else load_profile(config.profile_path)
        self.space = GammaArms() if space is None else space
        self.acceptance = WidthAcceptance(config.max_gamma, config.ewma_weight,
                                          config.min_observations)
        # bucket -> arm -> measured / predicted step time
        self.calibration: dict[int, dict[Arm, float]] = {}
        self.governor = Governor(config, self.space)

    def goodput(self, batch, bucket: int, lo: int, hi: int, arms=None) -> dict[Arm, float]:
        """Predicted committed tokens per second for each arm of `arms`
        (default the gammas lo..hi)."""
        space = self.space
        arms = range(lo, hi + 1) if arms is None else arms
        b = max(batch.num_reqs, 1)
        ctx = b * batch.mean_context_len
        depth = max(space.gamma(a) for a in arms)
        e = {w: self.acceptance.expected(w, depth) for w in {space.width(a) for a in arms}}
        return {k: 1000.0 * b * e[space.width(k)][space.gamma(k)]
                / (self.profile.step_ms(space.gamma(k), b, ctx, space.width(k))
                   * self.factor(bucket, k))
                for k in arms}

    def factor(self, bucket: int, gamma: Arm) -> float:
        """f for (bucket, gamma): measured, else as the module docstring says."""
        own = self.calibration.get(bucket)
        if own:
            return own.get(gamma, sum(own.values()) / len(own))
        if not self.calibration:
            return 1.0
        near = self.calibration[nearest_bucket(self.calibration, bucket)]
        return sum(near.values()) / len(near)

    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: Arm | None) -> tuple[Arm, str]:
        arms = self.space.arms(batch, lo, hi)
        if bucket not in self.governor.gamma:
            g = self.goodput(batch, bucket, lo, hi, arms)
            best = max(g, key=lambda k: (g[k], [-c for c in self.space.cost(k)]))
            self.governor.start(bucket, best)
            return best, "profile"
        return self.governor.step(bucket, lo, hi,
                                  lambda: self.goodput(batch, bucket, lo, hi, arms),
                                  "profile", arms)

    def observe(self, outcome) -> None:
        fb = outcome.feedback
        self.acceptance.update(fb.drafted, fb.accepted, outcome.verified_width)
        if not (outcome.stable and self.config.latency_calibration):
            return
        b = max(outcome.batch.num_reqs, 1)
        predicted_s = self.profile.step_ms(outcome.gamma, b, b * outcome.batch.mean_context_len,
                                           outcome.width) / 1000.0
        if predicted_s <= 0:
            return
        ratio = outcome.interval_s / predicted_s
        w = self.config.latency_ewma_weight
        arm = self.space.arm(outcome.gamma, outcome.width)
        cal = self.calibration.setdefault(outcome.bucket, {})
        old = cal.get(arm)
        cal[arm] = ratio if old is None else old + w * (ratio - old)
