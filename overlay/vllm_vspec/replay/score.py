"""Score gamma policies on a recording (`vllm-vspec replay score`).

The simulator's event loop (sim/simulator.py `simulate`: batch scheduler,
step cost from a latency profile, the policies driven through the real
GammaController) with acceptance from the recording (RecordedAcceptance)
instead of synthetic draws: a step that verifies g drafts of request r at
decode position d accepts min(g, a_K[r][d]), exactly what the engine
accepts there. Deterministic for a seed: the only randomness is the
optional log-normal step-time noise (`noise`, seeded).

Policy `budget` verifies a different prefix per request: every step, as
the engine's scheduler does (hosts/vllm/budget_admission.py), its
BudgetPolicy plans from one DraftRow per request, whose probabilities are
the recorded draft probabilities of the request's pending drafts
(RecordedAdmission); request r then verifies len_r of them and accepts
min(len_r, a_K[r][d]), the step costs what its verified tokens and draft
passes cost (the latency profile), and the policy hears the outcome
before the controller observes the step. A recording without draft
probabilities cannot score it (`unscorable` says why).

Workloads are the bench's shapes over the recorded requests (families
interleaved, so every prefix mixes them): c1, c8 and c32 (a concurrency cap,
a finished request replaced at once) and `bursty` (phases of concurrency 1
and 32 alternating). Contenders: target-only (no drafter), fixed gamma
0..K (in a vspec engine), vLLM's static batch-size table (tuned offline
on the recording's mean acceptance), the vspec policies, and two oracles:

  informed  knows each request's true per-position acceptance (over its
            whole stream) and the true cost model, not the future: the
            argmax of sum_r E_r(g) / T(B, g) every step (causal bound);
  future    knows every a_K ahead: every step, the gamma whose drafts
            commit the most tokens net of their time priced at the rate
            the run achieves (tokens(g) - rate * T(g); the rate found by
            running it again at the rate of its previous run), the best
            a per-step choice can do (an upper bound in practice, not a
            proof: a whole-schedule optimum may look further ahead).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.acceptance_stats import expected_tokens_all
from vllm_vspec.core.budget.policy import DraftRow
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.latency import LatencyProfile
from vllm_vspec.core.policies.budget import BudgetPolicy
from vllm_vspec.core.steps import BatchState, Decision, StepFeedback, bucket_of, feasible_max_gamma
from vllm_vspec.replay.recording import RecordedRequest, Recording
from vllm_vspec.sim.simulator import (TARGET, Cycle, HostDrift, SimClock, SimResult, StaticTable, Workload,
                                      gamma_step_ms, simulate, tuned_table)


class RecordedAcceptance:
    """Acceptance from a recording: min(verified drafts, a_K at the
    request's decode position)."""

    def __init__(self, requests: Sequence[RecordedRequest], k: int,
                 limits: Sequence[int] | None = None):
        self.requests = list(requests)
        self.k = k
        self.out_len = np.array([r.decode_len for r in self.requests], dtype=np.int64)
        # What the host knows a request may generate (its max_tokens): the
        # recorded length, also where the workload ends it sooner (as EOS would).
        self.limit = self.out_len if limits is None else np.array(limits, dtype=np.int64)
        self.prompt_len = np.array([r.prompt_len + 1 for r in self.requests], dtype=np.int64)
        width = int(self.out_len.max()) + 1
        self.runs = np.zeros((len(self.requests), width), dtype=np.int64)
        for i, r in enumerate(self.requests):
            self.runs[i, :len(r.accept)] = r.accept
        # [request, decode position, chain slot] draft probabilities (None:
        # not every request has them).
        self.probs: np.ndarray | None = None
        if all(r.draft_probs is not None for r in self.requests):
            self.probs = np.zeros((len(self.requests), width, k), dtype=np.float64)
            for i, r in enumerate(self.requests):
                self.probs[i, :len(r.draft_probs)] = r.draft_probs

    def accepted(self, idx, done, verify, verify_w, rates):
        if (verify_w > 1).any():
            raise ValueError("a recording holds linear drafts only: tree width 1")
        return np.minimum(verify, self.runs[idx, done])


class RecordedAdmission:
    """Per-request verify lengths of policy `budget` on a recording
    (sim/simulator.py Admission), as the engine's scheduler admits them
    (hosts/vllm/budget_admission.BudgetAdmission): one DraftRow per request
    of the step with the recorded probabilities of its pending drafts, the
    policy's plan, each request cut to its admitted prefix; the verified and
    accepted drafts reported to the policy for a step the controller
    decided, before it observes the step."""

    def __init__(self, acc: RecordedAcceptance, policy: BudgetPolicy,
                 max_num_batched_tokens: int):
        if acc.probs is None:
            raise ValueError("policy budget needs the recording's draft probabilities")
        self.acc, self.policy, self.max_tokens = acc, policy, max_num_batched_tokens
        self.rows: list[DraftRow] = []

    def admit(self, idx, done, drafts):
        self.rows = [DraftRow(int(r), tuple(self.acc.probs[r, d, :g].tolist()))
                     for r, d, g in zip(idx.tolist(), done.tolist(), drafts.tolist())]
        plan = self.policy.plan(self.rows, self.max_tokens)
        return drafts if plan is None else np.minimum(drafts, np.array(plan.admitted))

    def verified(self, verify, accepted, decided):
        if decided:
            self.policy.report(self.rows, verify.tolist(), accepted.tolist())


def admission_of(policy, acc: RecordedAcceptance,
                 max_num_batched_tokens: int) -> RecordedAdmission | None:
    """The admission a contender needs: a controller under policy budget
    admits per request; every other contender verifies all its drafts."""
    if isinstance(policy, GammaController) and isinstance(policy.policy, BudgetPolicy):
        return RecordedAdmission(acc, policy.policy, max_num_batched_tokens)
    return None


def unscorable(recording: Recording, policies: Sequence[str]) -> dict[str, str]:
    """Policy -> why this recording cannot score it (budget ranks draft
    probabilities, which a recording may lack)."""
    reason = recording.missing_draft_probs
    return {p: reason for p in policies if p == "budget" and reason}


# ------------------------------------------------------------------ workloads
@dataclass(frozen=True)
class Shape:
    """A bench-like workload over the recorded requests: phases of
    (concurrency, requests); `varied`: each request ends after a share of
    its recorded decode tokens (varied_lengths), so requests that start
    together do not end together."""
    name: str
    phases: tuple[tuple[int, int], ...]
    varied: bool = False


def shapes(requests_low: int = 48, requests_high: int = 240) -> dict[str, Shape]:
    half_low, half_high = max(1, requests_low // 4), max(1, requests_high // 4)
    return {
        "c1": Shape("c1", ((1, requests_low),)),
        "c8": Shape("c8", ((8, requests_high // 2),)),
        "c32": Shape("c32", ((32, requests_high),)),
        # c32 whose requests end at varied lengths (as EOS ends them): a
        # finished request's replacement arrives alone, not in a wave.
        "c32v": Shape("c32v", ((32, requests_high),), varied=True),
        "bursty": Shape("bursty", ((1, half_low), (32, half_high), (1, half_low), (32, half_high))),
        # `make demo`'s batches: all requests start together and run to completion.
        "b16": Shape("b16", ((16, 16),)),
        "b32": Shape("b32", ((32, 32),)),
    }


# What `replay score` scores unless told: the served loads.
DEFAULT_WORKLOADS = ("c1", "c8", "c32", "bursty")


def interleaved(recording: Recording) -> list[RecordedRequest]:
    """The recorded requests, families interleaved (any prefix mixes them)."""
    fams = list(recording.families().values())
    longest = max(len(f) for f in fams)
    return [f[i] for i in range(longest) for f in fams if i < len(f)]


# A varied workload's request i keeps this share of its decode tokens:
# MIN_SHARE + (1 - MIN_SHARE) * frac(i * golden ratio), spread evenly over
# [MIN_SHARE, 1) in any run of consecutive requests, the same every run.
MIN_SHARE = 0.25
GOLDEN = (5 ** 0.5 - 1) / 2


def varied_lengths(request: RecordedRequest, i: int) -> RecordedRequest:
    """`request` ended after its varied share of decode tokens (at least 1):
    its output, acceptance runs and draft probabilities cut there."""
    share = MIN_SHARE + (1.0 - MIN_SHARE) * ((i * GOLDEN) % 1.0)
    n = max(1, round(request.decode_len * share))
    probs = None if request.draft_probs is None else request.draft_probs[:n]
    return replace(request, output=request.output[:n + 1], accept=request.accept[:n],
                   disagree=tuple(d for d in request.disagree if d < n), draft_probs=probs)


def workload_of(shape: Shape, recording: Recording) -> tuple[Workload, RecordedAcceptance]:
    """The simulator's workload for `shape`: its requests in order (the pool
    wraps around; varied_lengths cut if the shape says so), the concurrency
    cap of each phase lasting the decode tokens of its requests."""
    pool = interleaved(recording)
    reqs, segments, at, limits = [], [], 0, []
    for conc, n in shape.phases:
        chunk = [pool[(at + i) % len(pool)] for i in range(n)]
        limits += [r.decode_len for r in chunk]
        if shape.varied:
            chunk = [varied_lengths(r, at + i) for i, r in enumerate(chunk)]
        at += n
        reqs += chunk
        segments.append((sum(r.decode_len for r in chunk), conc))
    acc = RecordedAcceptance(reqs, recording.k, limits)
    rates = recording.mean_rates()
    wl = Workload(shape.name, len(reqs), int(acc.prompt_len.mean()),
                  (int(acc.out_len.min()), int(acc.out_len.max())),
                  Cycle(tuple(segments)), Cycle(((1, rates),)))
    return wl, acc


# ------------------------------------------------------------------ oracles
class _Seen:
    """What simulate's on_batch hook shows an oracle: the step's requests,
    their decode positions and their pending draft lengths."""

    def __init__(self) -> None:
        self.idx = self.done = self.pending = np.zeros(0, dtype=np.int64)

    def __call__(self, idx, done, pending) -> None:
        self.idx, self.done, self.pending = idx, done, pending


class _Oracle:
    """What both oracles share: the true cost of a step at gamma g, its
    prompts' prefill and a lazy gamma 0's catch-up included (the tokens
    committed and the prompts admitted since drafting stopped, caught up by
    the next drafting step; a gamma-0 step adds its own to that debt, and
    is charged it as if drafting resumed)."""

    name = "oracle"

    def __init__(self, acc: RecordedAcceptance, profile: LatencyProfile, k: int,
                 gamma0_mode: str, seen: _Seen):
        self.acc, self.profile, self.k, self.mode, self.seen = acc, profile, k, gamma0_mode, seen
        self.lag = 0            # tokens the drafter has not seen (lazy gamma 0), prompts included
        self.prompt = 0         # prompt tokens of the step decided last
        self.last = None

    def cost_ms(self, g: int, b: int, ctx: float) -> float:
        ms = gamma_step_ms(self.profile, g, b, ctx, self.mode)
        lazy = self.mode == "lazy"
        ms += self.profile.prompt_ms(self.prompt, drafter=g > 0 or not lazy)
        if lazy:
            if g and self.lag:
                ms += self.profile.draft(ctx, 0) + self.profile.draft_prompt_ms(self.lag)
            elif not g:                                    # the debt this step adds
                ms += self.profile.draft_prompt_ms(b + self.prompt)
        return ms

    def value(self, g: int, b: int, ctx: float) -> float:
        raise NotImplementedError

    def decide(self, batch: BatchState) -> Decision:
        hi = max(0, feasible_max_gamma(batch, self.k))
        b, ctx = batch.num_reqs, batch.num_reqs * batch.mean_context_len
        # A request that has committed nothing is admitted by this step.
        new = self.seen.idx[self.seen.done == 0]
        self.prompt = int(self.acc.prompt_len[new].sum())
        self.last = max(range(hi + 1), key=lambda g: self.value(g, b, ctx))
        return Decision(self.last, bucket_of(b), self.name)

    def observe(self, fb: StepFeedback) -> None:
        """An oracle learns nothing; it keeps the drafter's debt."""
        skipped = self.last == 0 and self.mode == "lazy"
        self.lag = self.lag + fb.committed + self.prompt if skipped else 0


class InformedOracle(_Oracle):
    """Knows each request's true conditional acceptance per position and the
    true cost model; not the future."""

    name = "informed"

    def __init__(self, *args):
        super().__init__(*args)
        self.e = np.array([expected_tokens_all(r.rates(self.k), self.k) for r in self.acc.requests])

    def value(self, g: int, b: int, ctx: float) -> float:
        return self.e[self.seen.idx, g].sum() / self.cost_ms(g, b, ctx)


class FutureOracle(_Oracle):
    """Knows every a_K: the drafts this step proposes are verified at the
    position the step's own verification leaves each request at."""

    name = "future"

    def __init__(self, *args, rate_tok_s: float):
        super().__init__(*args)
        self.rate_ms = rate_tok_s / 1000.0

    def value(self, g: int, b: int, ctx: float) -> float:
        idx, done, runs = self.seen.idx, self.seen.done, self.acc.runs
        nxt = np.minimum(done + np.minimum(self.seen.pending, runs[idx, done]) + 1,
                         runs.shape[1] - 1)
        return np.minimum(g, runs[idx, nxt]).sum() + b - self.rate_ms * self.cost_ms(g, b, ctx)


# ------------------------------------------------------------------ contenders
DEFAULT_POLICIES = ("model", "online", "profile", "budget")
# Policies whose decisions draw random numbers, and their seed key: scored
# over several seeds, a result is the first seed's with the mean time.
RANDOMISED = {"model": "model_seed"}
# Runs of the future oracle, each priced at the rate of the one before (the
# first at the informed oracle's): the rate settles within a few tenths of
# a percent by the second.
FUTURE_PASSES = 2


def controller(recording: Recording, vspec: Mapping, **over) -> Callable[[SimClock, _Seen], object]:
    """A GammaController factory with these vspec settings, as the engine builds it."""
    cfg = VSpecConfig.from_dict({**vspec, **over}, recording.k)
    return lambda clock, seen: GammaController(cfg, recording.k, clock=clock)


def policy_settings(name: str, profile_path: str, gamma0_mode: str) -> dict:
    """The vspec settings that make policy `name` a contender, with the
    replay's `gamma0_mode` as the engine resolves `auto` for the method
    (what a gamma-0 step runs: a lazy drafter skips it, prompts included,
    which the `model` and `budget` policies price)."""
    return {"policy": name, "gamma0_mode": gamma0_mode,
            **({"profile_path": profile_path} if name == "profile" else {})}


def contenders(recording: Recording, profile: LatencyProfile, profile_path: str, wl: Workload,
               acc: RecordedAcceptance, policies: Sequence[str], vspec: Mapping,
               gamma0_mode: str) -> list[tuple[str, Callable[[SimClock, _Seen], object]]]:
    k = recording.k
    out = [(TARGET, controller(recording, vspec, policy="fixed", min_gamma=0, fixed_gamma=0))]
    out += [(f"fixed-{g}", controller(recording, vspec, policy="fixed", min_gamma=0, fixed_gamma=g))
            for g in range(k + 1)]
    table = tuned_table(wl, profile, k, gamma0_mode=gamma0_mode)
    out.append(("table", lambda clock, seen: StaticTable(table, k)))
    out += [(name, controller(recording, vspec,
                              **policy_settings(name, profile_path, gamma0_mode)))
            for name in policies]
    out.append(("informed", lambda clock, seen: InformedOracle(acc, profile, k, gamma0_mode, seen)))
    return out


def score(recording: Recording, profile: LatencyProfile, profile_path: str,
          workloads: Sequence[Shape], *, policies: Sequence[str] = DEFAULT_POLICIES,
          vspec: Mapping | None = None, gamma0_mode: str = "lazy", noise: float = 0.0,
          seed: int = 0, max_num_batched_tokens: int = 8192, policy_seeds: int = 1,
          warm: bool = False, after: Shape | None = None, rounds: int = 1,
          slow_start: tuple[float, int] = (1.0, 0), drift: tuple[float, float] = (0.0, 0.0),
          progress: Callable[[str], None] | None = None) -> list[SimResult]:
    """Every contender on every workload (see the module docstring); a
    RANDOMISED policy is run with `policy_seeds` seeds, its result carrying
    each seed's tokens/s (`SimResult.seed_tok_s`). `warm`: each contender
    is scored on its second pass over the workload, its policy keeping
    what the first taught it (a server that has served this load before,
    or one started from a warm-start state). `rounds`: each contender serves
    the workload that many times in a row (after the warm pass, if any),
    keeping what it learnt, and is scored on them all (a paired bench's
    rounds: every round starts its requests together and drains at its
    end). `after`: each contender first
    serves that workload, untimed, and is scored on the next (a server
    that served, say, concurrency 1 before its load rose). Policies the
    recording cannot score (`unscorable`) are left out. `slow_start`
    (factor, steps): each contender's first `steps` steps (of its first
    pass) take `factor` times their price. `drift` (sd, seconds): the
    host's speed wanders (sim.simulator.HostDrift, seeded from `seed`), the
    same over time for every contender."""
    vspec = vspec or {}
    policies = [p for p in policies if p not in unscorable(recording, policies)]
    results = []
    before = [] if after is None else [workload_of(after, recording)]
    for shape in workloads:
        wl, acc = workload_of(shape, recording)

        def run(name, factory):
            clock, seen = SimClock(), _Seen()
            if progress:
                progress(f"{shape.name} {name}")
            policy = factory(clock, seen)
            passes = before + [(wl, acc)] * (int(warm) + rounds)
            timed = []
            for i, (wl_now, acc_now) in enumerate(passes):
                result = simulate(wl_now, profile, policy, clock, name=name,
                                  max_gamma=recording.k,
                                  max_num_batched_tokens=max_num_batched_tokens,
                                  seed=seed, noise=noise, gamma0_mode=gamma0_mode,
                                  drafter=name != TARGET, acceptance=acc_now, on_batch=seen,
                                  prefill=True,
                                  admission=admission_of(policy, acc_now, max_num_batched_tokens),
                                  slow_start=slow_start if i == 0 else (1.0, 0),
                                  drift=HostDrift(*drift, seed + 2) if drift[0] > 0 else None)
                if i >= len(passes) - rounds:
                    timed.append(result)
            return replace(result, tokens=sum(r.tokens for r in timed),
                           seconds=sum(r.seconds for r in timed), steps=sum(r.steps for r in timed),
                           gamma_steps=dict(sum((Counter(r.gamma_steps) for r in timed), Counter())),
                           timeline=[point for r in timed for point in r.timeline])
        for name, factory in contenders(recording, profile, profile_path, wl, acc, policies,
                                        vspec, gamma0_mode):
            if name not in RANDOMISED or policy_seeds == 1:
                results.append(run(name, factory))
                continue
            runs = [run(name, controller(recording, vspec,
                                         **policy_settings(name, profile_path, gamma0_mode),
                                         **{RANDOMISED[name]: s}))
                    for s in range(policy_seeds)]
            results.append(replace(runs[0], seconds=sum(r.seconds for r in runs) / len(runs),
                                   seed_tok_s=tuple(round(r.tok_s, 3) for r in runs)))
        rate = results[-1].tok_s                                   # the informed oracle's
        for _ in range(FUTURE_PASSES):
            future = run("future", lambda clock, seen, r=rate: FutureOracle(
                acc, profile, recording.k, gamma0_mode, seen, rate_tok_s=r))
            rate = future.tok_s
        results.append(future)
    return results


# ------------------------------------------------------------------ report
def ratio_rows(results: Sequence[SimResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload and contender: tokens/s and its ratios to target-only,
    to the best fixed gamma (1..K, and 0..K with target-only: 'best any'),
    and to each oracle."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for wl in dict.fromkeys(r.workload for r in results):
        by = {r.policy: r.tok_s for r in results if r.workload == wl}
        fixed = {k: v for k, v in by.items() if k.startswith("fixed-") and k != "fixed-0"}
        best_fixed = max(fixed.values())
        best_any = max([best_fixed, by[TARGET], by.get("fixed-0", 0.0)])
        out[wl] = {name: {"tok_s": v, "vs_target": v / by[TARGET], "vs_best_fixed": v / best_fixed,
                          "vs_best_any": v / best_any, "vs_informed": v / by["informed"],
                          "vs_future": v / by["future"]}
                   for name, v in by.items()}
        out[wl]["_best_fixed"] = {"gamma": float(max(fixed, key=fixed.get).split("-")[1])}
    return out


def table_text(results: Sequence[SimResult]) -> str:
    rows = ratio_rows(results)
    lines = []
    for wl, by in rows.items():
        best = int(by["_best_fixed"]["gamma"])
        lines.append(f"{wl}  (best fixed gamma: {best})")
        lines.append(f"  {'policy':<10}{'tok/s':>10}{'/target':>9}{'/best fixed':>12}"
                     f"{'/best any':>10}{'/informed':>10}{'/future':>9}")
        for name, r in by.items():
            if name.startswith("_"):
                continue
            lines.append(f"  {name:<10}{r['tok_s']:>10.1f}{r['vs_target']:>9.3f}"
                         f"{r['vs_best_fixed']:>12.3f}{r['vs_best_any']:>10.3f}"
                         f"{r['vs_informed']:>10.3f}{r['vs_future']:>9.3f}")
        lines.append("")
    return "\n".join(lines)


def to_json(results: Sequence[SimResult], meta: Mapping) -> dict:
    return {"meta": dict(meta), "ratios": ratio_rows(results),
            "results": [{"policy": r.policy, "workload": r.workload, "tokens": r.tokens,
                         "seconds": round(r.seconds, 6), "steps": r.steps,
                         "gamma_steps": r.gamma_steps,
                         **({"seed_tok_s": list(r.seed_tok_s)} if r.seed_tok_s else {})}
                        for r in results]}


def plot(results: Sequence[SimResult], path: Path, policies: Sequence[str] = ("online", "informed")) -> None:
    """Per workload, gamma over simulated time for the given policies, with
    the batch size (grey) on a second axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(dict.fromkeys(r.workload for r in results))
    by = {(r.workload, r.policy): r for r in results}
    fig, axes = plt.subplots(len(wls), 1, figsize=(12, 2.8 * len(wls)), squeeze=False)
    for ax, wl in zip(axes[:, 0], wls):
        for n in policies:
            if (wl, n) not in by:
                continue
            t, _, g = zip(*by[wl, n].timeline)
            ax.step(t, g, where="post", label=f"gamma {n}", alpha=0.8)
        ref = next(by[wl, n] for n in policies if (wl, n) in by)
        t, b, _ = zip(*ref.timeline)
        twin = ax.twinx()
        twin.plot(t, b, color="grey", alpha=0.4)
        twin.set_ylabel("batch size (grey)")
        ax.set_ylabel("gamma")
        ax.set_title(wl)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("simulated seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
