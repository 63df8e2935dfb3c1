"""The simulator of per-request verify budgets (`vllm-vspec sim --verify-budget`).

It compares, on one latency profile and the same simulated requests:
- `online`: the engine's batch-uniform GammaController (policy online,
  gamma 0..K): every request drafts and verifies the same gamma;
- `fixed-k`: the same controller at one fixed gamma (the best is reported);
- `budget`: core/budget's VerifyBudgetPolicy: the batch drafts one depth,
  and each request verifies the prefix of its draft that won the survival
  ranking, from CALIBRATED draft probabilities and an ONLINE cost model;
- `oracle`: the per-request oracle: the same rule (policy.choose) with each
  request's TRUE conditional acceptance and the TRUE latency model, no
  learning, no noise in its inputs.

Requests (closed loop, constant concurrency B, a finished request replaced
at once; all contenders meet the same requests and the same luck):
- Request r has a conditional acceptance level l_r, drawn once from
  uniform [level_lo, level_hi] (heterogeneous) or equal for all
  (level_lo == level_hi); per position j its rate is p_{r,j} = l_r *
  position_decay**j.
- Per slot (request, output position, draft position) the TRUE acceptance
  probability is pi = sigmoid(logit(p_{r,j}) + token_spread * z) (z
  standard normal; token_spread 0: every slot of a request at position j
  has p_{r,j}); the slot is accepted iff u < pi (u uniform; both drawn once
  per workload). A request verifying k slots accepts the leading accepted
  ones; it commits accepted + 1 (the target's own token).
- The drafter's reported probability of the slot's token is the confidence
  signal q = clip(pi**distortion + signal_noise * e, 0.001, 0.999) (e
  standard normal): distortion < 1 is an over-confident drafter (monotone,
  what calibration must undo), signal_noise blurs the ranking.
- Step time = T_target(ctx, B + verified slots) + the draft passes of the
  step's depth (latency.py split_step_ms), plus one draft pass on a
  depth-0 step (gamma0_mode sync: the Ascend overlay, EAGLE), times
  log-normal noise. Only sync gamma 0 is simulated here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.budget.admission import survival
from vllm_vspec.core.budget.policy import (BudgetPlan, BudgetSettings, DraftRow,
                                           VerifyBudgetPolicy, choose)
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.latency import LatencyProfile, load_profile
from vllm_vspec.core.steps import BatchState, StepFeedback, feasible_max_gamma


@dataclass(frozen=True)
class Signal:
    """The drafter's confidence signal: q = pi**distortion + signal_noise * N(0, 1)."""

    name: str
    distortion: float = 1.0
    signal_noise: float = 0.0


SIGNALS = {
    "exact": Signal("exact"),
    "noisy": Signal("noisy", 1.0, 0.15),
    "overconfident": Signal("overconfident", 0.4, 0.0),
    "overconfident-noisy": Signal("overconfident-noisy", 0.4, 0.15),
    "poor": Signal("poor", 1.0, 0.4),
}


@dataclass(frozen=True)
class RequestWorkload:
    name: str
    batch: int
    tokens: int                         # committed tokens the workload takes (about)
    level_lo: float                     # per-request acceptance level, uniform in [lo, hi]
    level_hi: float
    position_decay: float = 0.95
    token_spread: float = 0.0
    signal: Signal = SIGNALS["overconfident-noisy"]
    prompt_len: int = 256
    output_len: int = 256

    @property
    def heterogeneous(self) -> bool:
        return self.level_hi > self.level_lo


def hetero(batch: int, signal: str = "overconfident-noisy", tokens: int | None = None,
           token_spread: float = 0.0) -> RequestWorkload:
    """Levels uniform in [0.1, 0.95]: a mix of requests the drafter cannot
    predict and requests it predicts well (mean first-position acceptance
    0.525, near the 0.42-0.5 measured on unseen prompts here)."""
    return RequestWorkload(f"hetero-b{batch}", batch, tokens or default_tokens(batch), 0.1, 0.95,
                           token_spread=token_spread, signal=SIGNALS[signal])


def uniform_levels(batch: int, level: float = 0.8, signal: str = "overconfident-noisy",
                   tokens: int | None = None) -> RequestWorkload:
    """Every request at the same level (the control: nothing to rank by but noise)."""
    return RequestWorkload(f"uniform-b{batch}", batch, tokens or default_tokens(batch), level, level,
                           signal=SIGNALS[signal])


def default_tokens(batch: int) -> int:
    """Enough tokens for ~400 steps at 2.5 tokens per request-step."""
    return max(16384, int(batch * 2.5 * 400))


# ------------------------------------------------------------------ contenders
class Contender:
    """One step of a policy: plan(...) -> (verified per request, draft depth), then observe."""

    def plan(self, ids: Sequence[int], pending: Sequence[int], probs: Sequence[Sequence[float]],
             true_rates: Sequence[Sequence[float]], batch: BatchState) -> tuple[list[int], int]:
        raise NotImplementedError

    def observe(self, accepted: Sequence[int], committed: int, step_ms: float) -> None:
        raise NotImplementedError


class Uniform(Contender):
    """The engine's GammaController: every request verifies what it drafted."""

    def __init__(self, controller: GammaController, clock: "SimClock"):
        self.ctl, self.clock = controller, clock
        self._verified: list[int] = []

    def plan(self, ids, pending, probs, true_rates, batch):
        gamma = self.ctl.decide(batch).gamma
        self._verified = list(pending)
        return self._verified, gamma

    def observe(self, accepted, committed, step_ms):
        has = [i for i, v in enumerate(self._verified) if v > 0]
        self.ctl.observe(StepFeedback(tuple(self._verified[i] for i in has),
                                      tuple(accepted[i] for i in has), committed))


class Budget(Contender):
    """core/budget's VerifyBudgetPolicy on the drafter's probabilities."""

    def __init__(self, policy: VerifyBudgetPolicy):
        self.policy = policy
        self._plan: BudgetPlan | None = None
        self._rows: list[DraftRow] = []

    def plan(self, ids, pending, probs, true_rates, batch):
        self._rows = [DraftRow(i, tuple(p)) for i, p in zip(ids, probs)]
        self._plan = self.policy.plan(self._rows, batch.max_num_batched_tokens)
        return list(self._plan.admitted), self._plan.depth

    def observe(self, accepted, committed, step_ms):
        self.policy.observe(self._plan, self._rows, accepted, step_ms)


class RequestOracle(Contender):
    """policy.choose on each request's TRUE conditional acceptance and the TRUE step time."""

    def __init__(self, profile: LatencyProfile, max_depth: int):
        self.profile, self.max_depth = profile, max_depth

    def plan(self, ids, pending, probs, true_rates, batch):
        b = batch.num_reqs
        ctx = b * batch.mean_context_len
        scores = [survival(r[:k]) for r, k in zip(true_rates, pending)]
        predicted = [survival(r[:self.max_depth]) for r in true_rates]
        hi = max(0, feasible_max_gamma(batch, self.max_depth))
        depth, admitted, _ = choose(scores, predicted, hi,
                                    lambda d: step_ms(self.profile, b, d, b, ctx),
                                    self.profile.target.beta)   # the target is linear in tokens
        return admitted, depth

    def observe(self, accepted, committed, step_ms):
        """The oracle does not learn."""


def step_ms(profile: LatencyProfile, tokens: int, depth: int, batch: int, ctx: float) -> float:
    """True step time: target over `tokens`, `depth` draft passes, one at depth 0 (sync)."""
    ms = profile.split_step_ms(tokens, depth, batch, ctx)
    return ms + (profile.draft(ctx, batch) if depth == 0 else 0.0)


# ------------------------------------------------------------------ engine
class SimClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class BudgetSimResult:
    policy: str
    workload: str
    batch: int
    tokens: int
    seconds: float
    steps: int
    verified_per_step: float            # mean draft slots verified per step
    detail: dict = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def simulate(workload: RequestWorkload, profile: LatencyProfile, contender: Contender,
             clock: SimClock, *, name: str, max_depth: int, max_num_batched_tokens: int = 8192,
             seed: int = 0, noise: float = 0.03) -> BudgetSimResult:
    rng = np.random.default_rng(seed)
    b = workload.batch
    n = max(2 * b, workload.tokens // workload.output_len)
    length = workload.output_len
    level = rng.uniform(workload.level_lo, workload.level_hi, size=n)
    rates = np.clip(level[:, None] * workload.position_decay ** np.arange(max_depth)[None, :],
                    1e-4, 1 - 1e-4)                                   # [n, K] true p_{r,j}
    u = rng.random((n, length + 1, max_depth))
    z = rng.standard_normal((n, length + 1, max_depth))
    logit = np.log(rates / (1 - rates))[:, None, :]
    pi = 1.0 / (1.0 + np.exp(-(logit + workload.token_spread * z)))   # true slot acceptance
    sig = workload.signal
    e = rng.standard_normal(pi.shape)
    q = np.clip(pi ** sig.distortion + sig.signal_noise * e, 0.001, 0.999)
    noise_rng = np.random.default_rng(seed + 1)
    done = np.zeros(n, dtype=np.int64)
    pending = np.zeros(n, dtype=np.int64)
    active: list[int] = []
    next_req = progress = steps = verified_total = 0
    while next_req < n or active:
        while len(active) < b and next_req < n:
            active.append(next_req)
            next_req += 1
        idx = np.array(active)
        bb = len(active)
        ctx = float(workload.prompt_len * bb + done[idx].sum())
        batch = BatchState(bb, max_num_batched_tokens, ctx / bb)
        t = done[idx]
        probs = [q[r, done[r], :pending[r]].tolist() for r in active]
        verified, depth = contender.plan(active, pending[idx].tolist(), probs,
                                         rates[idx].tolist(), batch)
        verified = np.minimum(np.array(verified, dtype=np.int64), pending[idx])
        ok = (u[idx, t, :] < pi[idx, t, :]) & (np.arange(max_depth)[None, :] < verified[:, None])
        accepted = np.cumprod(ok, axis=1).sum(axis=1)
        committed = np.minimum(accepted + 1, length - done[idx])
        ms = step_ms(profile, bb + int(verified.sum()), depth, bb, ctx)
        ms *= math.exp(noise * noise_rng.standard_normal()) if noise else 1.0
        clock.now += ms / 1000.0
        contender.observe(accepted.tolist(), int(committed.sum()), ms)
        done[idx] += committed
        pending[idx] = depth
        progress += int(committed.sum())
        verified_total += int(verified.sum())
        active = [r for r in active if done[r] < length]
        steps += 1
    detail = {}
    if isinstance(contender, Budget):
        detail = contender.policy.snapshot()
    return BudgetSimResult(name, workload.name, b, progress, clock.now, steps,
                           verified_total / max(steps, 1), detail)


# ------------------------------------------------------------------ compare
def contenders(profile: LatencyProfile, max_depth: int, vspec: dict,
               settings: BudgetSettings | None = None, fixed: bool = True
               ) -> list[tuple[str, Callable[[SimClock], Contender]]]:
    def controller(**over):
        cfg = VSpecConfig.from_dict({**vspec, **over}, max_depth)
        return lambda clock: Uniform(GammaController(cfg, max_depth, clock=clock), clock)
    out = [("online", controller(policy="online"))]
    if fixed:
        out += [(f"fixed-{g}", controller(policy="fixed", min_gamma=0, fixed_gamma=g))
                for g in range(max_depth + 1)]
    out.append(("budget", lambda clock: Budget(VerifyBudgetPolicy(max_depth, settings))))
    out.append(("oracle", lambda clock: RequestOracle(profile, max_depth)))
    return out


def compare(workloads: Sequence[RequestWorkload], profile_path: str, max_depth: int = 4,
            vspec: dict | None = None, seed: int = 0, noise: float = 0.03,
            fixed: bool = True) -> list[BudgetSimResult]:
    profile = load_profile(profile_path)
    results = []
    for wl in workloads:
        for name, factory in contenders(profile, max_depth, vspec or {}, fixed=fixed):
            clock = SimClock()
            results.append(simulate(wl, profile, factory(clock), clock, name=name,
                                    max_depth=max_depth, seed=seed, noise=noise))
    return results


def summary(results: Sequence[BudgetSimResult]) -> list[dict]:
    """Per workload: tokens/s of online, best fixed, budget, oracle and the ratios."""
    out = []
    for wl in dict.fromkeys(r.workload for r in results):
        by = {r.policy: r for r in results if r.workload == wl}
        fixed = {k: v.tok_s for k, v in by.items() if k.startswith("fixed-")}
        best_fixed = max(fixed, key=fixed.get) if fixed else None
        row = {"workload": wl, "batch": by["budget"].batch,
               "online": by["online"].tok_s, "budget": by["budget"].tok_s,
               "oracle": by["oracle"].tok_s,
               "budget/oracle": by["budget"].tok_s / by["oracle"].tok_s,
               "online/oracle": by["online"].tok_s / by["oracle"].tok_s,
               "budget/online": by["budget"].tok_s / by["online"].tok_s,
               "calibration": by["budget"].detail.get("calibration", {})}
        if best_fixed:
            row["best_fixed"] = best_fixed
            row["best_fixed_tok_s"] = fixed[best_fixed]
        out.append(row)
    return out


def table_text(rows: Sequence[dict]) -> str:
    head = (f"{'workload':<14}{'online':>9}{'best fixed':>16}{'budget':>9}{'oracle':>9}"
            f"{'budget/oracle':>15}{'online/oracle':>15}{'budget/online':>15}"
            f"{'brier raw->cal':>17}")
    lines = ["tokens/s", head]
    for r in rows:
        fixed = (f"{r['best_fixed_tok_s']:.1f} ({r['best_fixed'][6:]})"
                 if "best_fixed" in r else "-")
        cal = r["calibration"]
        brier = f"{cal['raw_brier']:.3f}->{cal['brier']:.3f}" if cal else "-"
        lines.append(f"{r['workload']:<14}{r['online']:>9.1f}{fixed:>16}{r['budget']:>9.1f}"
                     f"{r['oracle']:>9.1f}{r['budget/oracle']:>15.3f}{r['online/oracle']:>15.3f}"
                     f"{r['budget/online']:>15.3f}{brier:>17}")
    return "\n".join(lines)

