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
"""

from __future__ import annotations

from vllm_vspec.acceptance_stats import PositionAcceptance, expected_tokens_all
from vllm_vspec.config import VSpecConfig
from vllm_vspec.latency import LatencyProfile, load_profile
from vllm_vspec.policies.governor import Governor
from vllm_vspec.steps import nearest_bucket


class ProfilePolicy:
    def __init__(self, config: VSpecConfig, profile: LatencyProfile | None = None):
        self.config = config
        self.profile = profile if profile is not None else load_profile(config.profile_path)
        self.acceptance = PositionAcceptance(config.max_gamma, config.ewma_weight,
                                             config.min_observations)
        # bucket -> gamma -> measured / predicted step time
        self.calibration: dict[int, dict[int, float]] = {}
        self.governor = Governor(config)

    def goodput(self, batch, bucket: int, lo: int, hi: int) -> dict[int, float]:
        """Predicted committed tokens per second for each gamma in [lo, hi]."""
        b = max(batch.num_reqs, 1)
        ctx = b * batch.mean_context_len
        e = expected_tokens_all(self.acceptance.rates(), hi)
        return {k: 1000.0 * b * e[k] / (self.profile.step_ms(k, b, ctx)
                                        * self.factor(bucket, k))
                for k in range(lo, hi + 1)}

    def factor(self, bucket: int, gamma: int) -> float:
        """f for (bucket, gamma): measured, else as the module docstring says."""
        own = self.calibration.get(bucket)
        if own:
            return own.get(gamma, sum(own.values()) / len(own))
        if not self.calibration:
            return 1.0
        near = self.calibration[nearest_bucket(self.calibration, bucket)]
        return sum(near.values()) / len(near)

    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: int | None) -> tuple[int, str]:
        if bucket not in self.governor.gamma:
            g = self.goodput(batch, bucket, lo, hi)
            best = max(g, key=lambda k: (g[k], -k))
            self.governor.start(bucket, best)
            return best, "profile"
        return self.governor.step(bucket, lo, hi, lambda: self.goodput(batch, bucket, lo, hi),
                                  "profile")

    def observe(self, outcome) -> None:
        fb = outcome.feedback
        self.acceptance.update(fb.drafted, fb.accepted)
        if not (outcome.stable and self.config.latency_calibration):
            return
        b = max(outcome.batch.num_reqs, 1)
        predicted_s = self.profile.step_ms(outcome.gamma, b,
                                           b * outcome.batch.mean_context_len) / 1000.0
        if predicted_s <= 0:
            return
        ratio = outcome.interval_s / predicted_s
        w = self.config.latency_ewma_weight
        cal = self.calibration.setdefault(outcome.bucket, {})
        old = cal.get(outcome.gamma)
        cal[outcome.gamma] = ratio if old is None else old + w * (ratio - old)
