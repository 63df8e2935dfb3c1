"""The simulator of dynamic gamma (`vllm-vspec sim`; its table, plot and
command line are in report.py).

It runs the engine's own GammaController (fixed, online and profile
policies, the same objects the vLLM scheduler adapter drives) against a
simulated engine, beside two baselines that only the simulator can build:
vLLM's static batch-size table (`num_speculative_tokens_per_batch_size`) and
the per-step oracle (knows the true acceptance rates and latency model and
takes the goodput argmax every step).

Simulated engine (closed loop, synchronous scheduling):
- The batch size is a concurrency cap: a finished request is replaced while
  the cap allows, and when the cap drops the requests above it wait
  (preempted) until it rises again, so the batch follows the cap exactly.
  The cap and the acceptance rates follow schedules keyed on the workload's
  committed tokens: every policy meets the same batch sizes and acceptance
  for the same tokens, and only the time they take differs. (A step that
  crosses a change of either ends the segment there: its tokens past the
  change are not taken from the next segment, so every segment lasts its
  tokens plus its own last step's, whatever a policy commits per step.)
- Acceptance: for request r at output position t, draft position j is
  accepted iff u[r, t, j] < p_j(tokens) (conditional rates p; u uniform,
  drawn once per workload, so policies share their luck). A request verifies
  the drafts proposed one step earlier: accepted = leading accepted
  positions among them, committed = accepted + 1. Its first step verifies
  what its prefill step drafted: the arm in force when it was admitted (the
  engine's prefill step keeps the last decision; before any, the policy's
  opening arm), as stock vLLM's prefill step drafts K.
- Trees: a workload may give rates per tree width ({width: rates}, the
  conditional acceptance per DEPTH of that width's trees; a plain tuple is
  width 1 only). A request verifying a tree of width W uses p(W) with the
  same u, so a width whose rates are higher accepts at least as deep on the
  same luck. Contenders get tree arms up to the widest width every segment
  of the workload has rates for (and `max_width`).
- Step time = T_target(ctx, sum of 1 + verified nodes) + the draft passes
  of the step's arm, from a latency profile (latency.py split_step_ms: at
  width 1 sum_{i<gamma} T_draft(ctx + i*B, B); a tree's later depths run
  B*W queries), times log-normal noise.
- A gamma-0 step costs what the host's gamma-0 mode makes it cost
  (config.py `gamma0_mode`): `sync` (the Ascend overlay, EAGLE, async
  scheduling) still runs the draft model once over the step's tokens,
  T_draft(ctx, B); `lazy` (vspec's vLLM runner with a draft model) runs
  nothing then, and the next drafting step first catches the draft up on
  every token it skipped, T_draft(ctx, skipped tokens). The `target`
  contender has no draft model at all.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from vllm_vspec.core.acceptance_stats import PositionAcceptance, expected_tokens_all
from vllm_vspec.core.arms import arm_label
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.latency import LatencyProfile, load_profile
from vllm_vspec.core.steps import BatchState, Decision, StepFeedback, bucket_of, feasible_max_gamma
from vllm_vspec.core.trace import read_trace

# Synthetic acceptance (conditional per-position rates). DRAFT_RATES is the
# assumption under which the Ascend-figure profile reproduces the published
# Ascend 910B throughputs it was derived from (Qwen2.5-14B, GSM8K, batch
# 128: the profile's "derivation"); EASY/HARD alternate in the
# phase-shifting workloads (e.g. boilerplate vs free prose).
DRAFT_RATES = (0.80, 0.75, 0.70, 0.65)
EASY_RATES = (0.92, 0.88, 0.84, 0.80)
HARD_RATES = (0.55, 0.42, 0.32, 0.25)


# ------------------------------------------------------------------ workloads
@dataclass(frozen=True)
class Cycle:
    """A value that changes with the schedule position (committed tokens):
    segments of (length in tokens, value), repeated."""

    segments: tuple[tuple[int, object], ...]

    def at(self, position: int):
        period = sum(n for n, _ in self.segments)
        pos = position % period
        for n, value in self.segments:
            if pos < n:
                return value
            pos -= n
        raise AssertionError("unreachable: pos < period")

    def next_change(self, position: int) -> int | None:
        """The first position after `position` whose value differs from the
        value at `position` (None: the value never changes)."""
        now = self.at(position)
        if all(value == now for _, value in self.segments):
            return None
        period = sum(n for n, _ in self.segments)
        start = position - position % period
        while True:
            for n, value in self.segments:
                if start > position and value != now:
                    return start
                start += n


@dataclass(frozen=True)
class Workload:
    name: str
    num_requests: int
    prompt_len: int
    output_len: tuple[int, int]          # inclusive range, drawn per request
    concurrency: Cycle                   # -> int
    rates: Cycle                         # -> tuple of conditional rates, or {tree width: tuple}


Rates = Sequence[float] | Mapping[int, Sequence[float]]


def rates_value(rates: Rates):
    """A workload's rates value: a tuple (linear drafts only) or {width: tuple}."""
    if isinstance(rates, Mapping):
        return {int(w): tuple(r) for w, r in sorted(rates.items())}
    return tuple(rates)


def widths_of(rates: Rates) -> dict[int, tuple[float, ...]]:
    """{tree width: conditional rates per depth}; a plain tuple is width 1."""
    value = rates_value(rates)
    return value if isinstance(value, dict) else {1: value}


def tree_widths(workload: Workload) -> int:
    """The widest W such that every rates segment has rates for widths 1..W."""
    def contiguous(widths) -> int:
        w = 0
        while w + 1 in widths:
            w += 1
        return w
    return min(contiguous(widths_of(r)) for _, r in workload.rates.segments)


def steady(batch: int, rates: Rates = DRAFT_RATES, tokens: int = 32768) -> Workload:
    n = max(2 * batch, tokens // 256)
    return Workload(f"steady-b{batch}", n, 256, (256, 256), Cycle(((1, batch),)),
                    Cycle(((1, rates_value(rates)),)))


def phase_shift(batch: int, segment: int = 4096, tokens: int = 65536) -> Workload:
    return Workload(f"phase-b{batch}", max(2 * batch, tokens // 256), 256, (256, 256),
                    Cycle(((1, batch),)),
                    Cycle(((segment, EASY_RATES), (segment, HARD_RATES))))


def bursty(low: int = 2, high: int = 128, rates: Rates = DRAFT_RATES,
           tokens: int = 98304) -> Workload:
    # Bursts of `high`, each followed by a quiet spell at `low` and a
    # middling one; a token at batch 2 costs ~20x the time of one at batch
    # 128, so the quiet spells take about as long as the bursts.
    mid = max(low, min(high, 16))
    return Workload(f"bursty-b{low}-b{high}", tokens // 96, 256, (32, 160),
                    Cycle(((16384, high), (1024, low), (4096, mid), (1024, low))),
                    Cycle(((1, rates_value(rates)),)))


def per_request(batch: int, tokens: int = 16384, output_len: int = 64,
                seed: int = 0) -> Workload:
    """Acceptance that changes with every request, as prompts of one family
    do at low concurrency (the CPU bench at concurrency 1: first-position
    acceptance 0.55-0.70 on average, single requests far apart). Each span
    of `output_len * batch` tokens draws its own conditional rates: the
    first position uniform in [0.3, 0.97], each later one the one before
    times uniform [0.4, 1.05] (within [0.02, 0.98]), from `seed`."""
    rng = np.random.default_rng(seed)
    spans = []
    for _ in range(max(1, tokens // (output_len * batch))):
        rates = [float(rng.uniform(0.3, 0.97))]
        for _ in range(3):
            rates.append(min(0.98, max(0.02, rates[-1] * float(rng.uniform(0.4, 1.05)))))
        spans.append((output_len * batch, tuple(round(x, 3) for x in rates)))
    return Workload(f"per-request-b{batch}", max(2 * batch, tokens // output_len), 256,
                    (output_len, output_len), Cycle(((1, batch),)), Cycle(tuple(spans)))


def from_trace(path: str | Path, window: int = 64, output_len: int = 256) -> Workload:
    """Replay a recorded controller trace (trace.py): per window of `window`
    steps, its mean batch size becomes the concurrency and its measured
    conditional per-depth acceptance, per tree width, becomes the rates,
    each lasting the tokens the window committed. A step verifies the
    drafts of the step before, so its acceptance is that step's width's."""
    header, records = read_trace(path)
    k = int(header.get("max_gamma") or 1)
    widths = sorted({r.get("width", 1) for r in records} | {1})
    conc, rates = [], []
    prev: dict[int, tuple[float, ...]] = {}
    for i in range(0, len(records), window):
        chunk = records[i:i + window]
        tokens = max(1, sum(r["committed"] for r in chunk))
        est = {w: PositionAcceptance(k, ewma_weight=0.0, min_observations=1)  # window means
               for w in widths}
        for n, r in enumerate(chunk, start=i):
            est[records[n - 1].get("width", 1) if n else 1].update(r["drafted"], r["accepted"])
        window_rates = {}
        for w in widths:
            # Positions this window never judged keep the previous window's
            # rate; before any, a tree borrows the linear drafts' rate.
            before = prev.get(w, window_rates.get(1, (1.0,) * k))
            measured, estimate = est[w].snapshot()["trials"], est[w].rates()
            window_rates[w] = tuple(round(estimate[j], 4) if measured[j] else before[j]
                                    for j in range(k))
        prev = window_rates
        conc.append((tokens, max(1, round(sum(r["num_reqs"] for r in chunk) / len(chunk)))))
        rates.append((tokens, window_rates if len(widths) > 1 else window_rates[1]))
    total = sum(n for n, _ in conc)
    return Workload(f"trace-{Path(path).stem}", max(1, total // output_len), 256,
                    (output_len, output_len), Cycle(tuple(conc)), Cycle(tuple(rates)))


def padded(rates: Sequence[float], width: int) -> tuple[float, ...]:
    """Rates for `width` positions: positions past the given ones repeat the last."""
    return (tuple(rates) + (rates[-1],) * width)[:width]


# ------------------------------------------------------------------ policies
class StepPolicy(Protocol):
    def decide(self, batch: BatchState) -> Decision: ...

    def observe(self, fb: StepFeedback) -> None: ...


GAMMA0_MODES = ("sync", "lazy")


def sync_gamma0_ms(profile: LatencyProfile, gamma: int, batch: int, ctx: float,
                   gamma0_mode: str) -> float:
    """The draft pass a sync gamma-0 step still runs over its `batch` new
    tokens (0 for any other step or mode)."""
    return profile.draft(ctx, batch) if gamma == 0 and gamma0_mode == "sync" else 0.0


def gamma_step_ms(profile: LatencyProfile, gamma: int, batch: int, ctx: float,
                  gamma0_mode: str, width: int = 1) -> float:
    """A steady step at `gamma` (drafting and verifying it; trees of
    `width`), with a sync gamma-0 step's draft pass; a lazy catch-up depends
    on the steps before and is not included."""
    return (profile.step_ms(gamma, batch, ctx, width)
            + sync_gamma0_ms(profile, gamma, batch, ctx, gamma0_mode))


class Oracle:
    """Per-step oracle: the goodput argmax under the TRUE current acceptance
    rates and the true latency model (no noise, no learning), over every
    feasible arm: gammas at width 1, then (gamma, width) trees for each
    width up to `max_width` the rates give (gamma*width within K and the
    token budget). Per step, so it does not foresee a lazy gamma 0's
    catch-up."""

    def __init__(self, profile: LatencyProfile, max_gamma: int, rates_now: Callable[[], Rates],
                 gamma0_mode: str = "sync", max_width: int = 1):
        self.profile, self.max_gamma, self.rates_now = profile, max_gamma, rates_now
        self.gamma0_mode, self.max_width = gamma0_mode, max_width

    def decide(self, batch: BatchState) -> Decision:
        hi = max(0, feasible_max_gamma(batch, self.max_gamma))   # = the node budget
        b = batch.num_reqs
        rates = widths_of(self.rates_now())
        e = {w: expected_tokens_all(r, hi) for w, r in rates.items() if w <= self.max_width}
        ctx = b * batch.mean_context_len
        # Width 1 first: on a tie the linear arm wins (max keeps the first).
        arms = [(g, 1) for g in range(hi + 1)] + [
            (g, w) for w in sorted(e) if w > 1 for g in range(1, hi // w + 1)]
        gamma, width = max(arms, key=lambda a: e[a[1]][a[0]] / gamma_step_ms(
            self.profile, a[0], b, ctx, self.gamma0_mode, a[1]))
        return Decision(gamma, bucket_of(b), "oracle", width)

    def observe(self, fb: StepFeedback) -> None:
        """The oracle does not learn."""


class StaticTable:
    """vLLM's `num_speculative_tokens_per_batch_size`: inclusive batch-size
    ranges [(start, end, k), ...] starting at 1; a gap keeps the previous
    range's k and sizes past the last range keep its k."""

    def __init__(self, schedule: Sequence[Sequence[int]], max_gamma: int):
        self.schedule = sorted((int(s), int(e), int(k)) for s, e, k in schedule)
        if not self.schedule or self.schedule[0][0] != 1:
            raise ValueError(f"table {schedule!r}: the first range must start at batch size 1")
        self.max_gamma = max_gamma

    def lookup(self, batch_size: int) -> int:
        k = self.schedule[0][2]
        for start, _end, value in self.schedule:
            if start > batch_size:
                break
            k = value
        return min(k, self.max_gamma)

    def decide(self, batch: BatchState) -> Decision:
        k = min(self.lookup(batch.num_reqs), max(0, feasible_max_gamma(batch, self.max_gamma)))
        return Decision(k, bucket_of(batch.num_reqs), "table")

    def observe(self, fb: StepFeedback) -> None:
        """A static table does not learn."""


def tuned_table(workload: Workload, profile: LatencyProfile, max_gamma: int,
                max_batch: int = 1024, gamma0_mode: str = "sync") -> list[list[int]]:
    """The table an operator would tune offline: per power-of-two batch
    range, the best fixed gamma under the workload's average acceptance."""
    segs = workload.rates.segments
    total = sum(n for n, _ in segs)
    mean = [sum(n * padded(widths_of(r)[1], max_gamma)[j] for n, r in segs) / total
            for j in range(max_gamma)]
    e = expected_tokens_all(mean, max_gamma)
    table, start = [], 1
    while start <= max_batch:
        b = bucket_of(start)
        ctx = b * (workload.prompt_len + sum(workload.output_len) / 4)
        k = max(range(max_gamma + 1),
                key=lambda g: e[g] / gamma_step_ms(profile, g, b, ctx, gamma0_mode))
        table.append([start, b, k])
        start = b + 1
    return table


# ------------------------------------------------------------------ engine
@dataclass
class SimResult:
    policy: str
    workload: str
    tokens: int
    seconds: float
    steps: int
    gamma_steps: dict[str, int]          # arm (arms.arm_label: "2", or "2x4" for a tree) -> steps
    timeline: list[tuple[float, int, int]] = field(repr=False)   # (t, B, gamma)
    # A result averaged over a randomised policy's seeds: each seed's tokens/s.
    seed_tok_s: tuple[float, ...] = ()

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class SimClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Acceptance(Protocol):
    """Where a simulated step's acceptance comes from: the requests' lengths
    and, per step, how many of each request's verified drafts it accepts.
    The one difference between the synthetic simulator and exact replay."""

    out_len: np.ndarray            # tokens each request generates in decode steps
    prompt_len: np.ndarray         # its prompt tokens (the step's context)

    def accepted(self, idx: np.ndarray, done: np.ndarray, verify: np.ndarray,
                 verify_w: np.ndarray, rates: Mapping[int, tuple]) -> np.ndarray: ...


class Admission(Protocol):
    """Per-request verify lengths (policy `budget`), as the engine's
    scheduler admits them: `admit` before the policy decides the step, with
    the step's requests, their generated tokens and the drafts each has to
    verify, returns the prefix each verifies (at most its drafts);
    `verified` after the step's acceptance, before the policy observes it
    (`decided`: the policy decided the step)."""

    def admit(self, idx: np.ndarray, done: np.ndarray, drafts: np.ndarray) -> np.ndarray: ...

    def verified(self, verify: np.ndarray, accepted: np.ndarray, decided: bool) -> None: ...


class BernoulliAcceptance:
    """Synthetic acceptance: draft position j of request r at output
    position t is accepted iff u[r, t, j] < p_j (the workload's rates of the
    moment, per tree width); u is drawn once, so policies share their luck."""

    def __init__(self, workload: Workload, rng: np.random.Generator, width: int):
        lo_len, hi_len = workload.output_len
        n = workload.num_requests
        self.out_len = rng.integers(lo_len, hi_len + 1, size=n)
        self.prompt_len = np.full(n, workload.prompt_len, dtype=np.int64)
        self.u = rng.random((n, int(self.out_len.max()) + 1, width), dtype=np.float32)
        self.positions = np.arange(width)

    def accepted(self, idx, done, verify, verify_w, rates):
        by_width = np.zeros((max(rates) + 1, self.u.shape[2]), dtype=np.float32)
        for w, r in rates.items():
            by_width[w] = r
        trial = self.u[idx, done, :] < by_width[verify_w]     # each request's verified width
        ok = trial & (self.positions[None, :] < verify[:, None])
        return np.cumprod(ok, axis=1).sum(axis=1)


class HostDrift:
    """A host whose speed wanders: every step's time is multiplied by
    exp(x(t)), x an Ornstein-Uhlenbeck process of stationary sd `sd` and
    correlation time `tau_s` seconds, drawn on a grid of GRID_S seconds
    from `seed` (x(0) from the stationary law). Indexed by the time since
    the run began, so every contender of a seed meets the same host over
    time (common random numbers), whatever steps it takes."""

    GRID_S = 0.05

    def __init__(self, sd: float, tau_s: float, seed: int):
        if sd < 0 or tau_s <= 0:
            raise ValueError(f"HostDrift(sd={sd}, tau_s={tau_s}): need sd >= 0 and tau_s > 0")
        self.sd = sd
        self.keep = math.exp(-self.GRID_S / tau_s)
        self.rng = np.random.default_rng(seed)
        self.path = [sd * float(self.rng.standard_normal())]

    def factor(self, t_s: float) -> float:
        k = max(int(t_s / self.GRID_S), 0)
        step_sd = self.sd * math.sqrt(1.0 - self.keep ** 2)
        while len(self.path) <= k:
            self.path.append(self.path[-1] * self.keep + step_sd * float(self.rng.standard_normal()))
        return math.exp(self.path[k])


# Request ids a simulated run hands the policy: its index plus its run's offset.
_IDS_A_RUN = 1 << 32
_RUN_IDS = itertools.count()


def simulate(workload: Workload, profile: LatencyProfile, policy: StepPolicy, clock: SimClock,
             *, name: str, max_gamma: int, max_num_batched_tokens: int = 8192,
             seed: int = 0, noise: float = 0.03, gamma0_mode: str = "sync",
             drafter: bool = True,
             on_rates: Callable[[tuple], None] | None = None,
             acceptance: Acceptance | None = None,
             on_batch: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
             prefill: bool = False, admission: Admission | None = None,
             slow_start: tuple[float, int] = (1.0, 0),
             drift: HostDrift | None = None) -> SimResult:
    """`drafter=False`: no draft model (target-only serving; only gamma 0).
    `acceptance`: where acceptance comes from (default: BernoulliAcceptance
    over the workload's rates, drawn from `seed`); `on_batch(idx, done,
    pending)`: the step's requests, their generated tokens and pending draft
    lengths, before the policy decides (what an oracle may know).
    `prefill`: a request's prompt tokens join the target's pass of the step
    that admits it, and the drafter's when that step drafts (or gamma0_mode
    is sync), at each model's price a prompt token (LatencyProfile.prompt_ms);
    a lazy gamma-0 step leaves the prompt to the catch-up of the next step
    that drafts for the request. A controller that prices every step
    (GammaController.prices_steps) observes the prefill steps it did not
    decide, as the engine's scheduler reports them (observe_undecided).
    `admission`: per-request verify lengths (Admission; None: every
    request verifies all its pending drafts). `slow_start` (factor, steps):
    the first `steps` steps take `factor` times their price (a host busy
    at first, as a server's first requests often find it). `drift`: the
    host's speed over the run's time (HostDrift), on top of `noise`."""
    rng = np.random.default_rng(seed)
    run_id = next(_RUN_IDS) * _IDS_A_RUN         # request ids unique over runs sharing a policy
    start = clock.now                              # a clock may carry an earlier run's time
    width = max(max_gamma, 1)                      # draft positions (depths) per request
    if acceptance is None:
        acceptance = BernoulliAcceptance(workload, rng, width)
    out_len, prompt_len = acceptance.out_len, acceptance.prompt_len
    # What the host knows a request may still generate is its limit (max_tokens) less its tokens.
    limit = getattr(acceptance, "limit", out_len)
    n = len(out_len)
    noise_rng = np.random.default_rng(seed + 1)
    done = np.zeros(n, dtype=np.int64)             # tokens generated per request
    pending = np.zeros(n, dtype=np.int64)          # drafts (tree depth) awaiting verification
    pending_w = np.ones(n, dtype=np.int64)         # their tree width
    drafted_width = 1                              # the width the last step drafted with
    lag = np.zeros(n, dtype=np.int64)              # lazy gamma 0: tokens the draft KV misses
    started: list[int] = []                        # admitted, unfinished, in arrival order
    next_req = progress = schedule = steps = 0
    gamma_steps: dict[str, int] = {}
    timeline: list[tuple[float, int, int]] = []
    # A request's prefill step drafts too: the arm in force then (the
    # engine's prefill step keeps the last decision; before any, the
    # policy's opening arm, GammaController.gamma; a policy without one,
    # such as the oracle, drafts what it decides for the first step), and
    # its first decode step verifies those drafts, as every later step
    # verifies the drafts of the step before. (Stock vLLM drafts K there.)
    in_force = ((policy.gamma, policy.width) if isinstance(policy, GammaController)
                else None)
    while next_req < n or started:
        cap = workload.concurrency.at(schedule)
        admitted = []
        while len(started) < cap and next_req < n:
            started.append(next_req)
            admitted.append(next_req)
            next_req += 1
        active = started[:cap]                     # the rest wait (preempted) until the cap allows
        rates = {w: padded(r, width) for w, r in widths_of(workload.rates.at(schedule)).items()}
        if on_rates is not None:
            on_rates(rates)
        idx = np.array(active)
        b = len(active)
        ctx = float(prompt_len[idx].sum() + done[idx].sum())
        if on_batch is not None:
            on_batch(idx, done[idx], pending[idx])
        state = BatchState(b, max_num_batched_tokens, ctx / b,
                           requests=tuple((idx + run_id).tolist()),
                           remaining=tuple((limit[idx] - done[idx]).tolist()))
        if admission is not None:
            # What each request verifies this step: its pending drafts (a
            # request admitted now, the prefill step's: the arm in force).
            drafts = pending[idx].copy()
            if drafter and admitted and in_force is not None:
                drafts[np.isin(idx, admitted)] = in_force[0]
            admit = admission.admit(idx, done[idx], drafts)
        if prefill and admitted and isinstance(policy, GammaController):
            # A step that carries a prefill is the controller's to decide or
            # not (by default it keeps the arm in force and is not observed),
            # as in the engine.
            decision = policy.decide_step(active, set(started), True, lambda: state)
        else:
            decision = policy.decide(state)
        gamma = decision.gamma
        if drafter and admitted:
            pending[admitted], pending_w[admitted] = in_force or (gamma, decision.width)
        in_force = (gamma, decision.width)
        verify, verify_w = pending[idx], pending_w[idx]
        if admission is not None:
            verify = np.minimum(verify, admit)
        missing = set(np.unique(verify_w).tolist()) - set(rates)
        if missing:
            raise ValueError(f"workload {workload.name}: no acceptance rates for tree "
                             f"width {sorted(missing)} (has {sorted(rates)})")
        accepted = acceptance.accepted(idx, done[idx], verify, verify_w, rates)
        committed = np.minimum(accepted + 1, out_len[idx] - done[idx])
        ms = profile.split_step_ms(b + int((verify * verify_w).sum()), gamma, b, ctx,
                                   decision.width)
        if drafter:
            ms += sync_gamma0_ms(profile, gamma, b, ctx, gamma0_mode)
        prompt_tokens = int(prompt_len[admitted].sum()) if prefill and admitted else 0
        if prompt_tokens:
            drafts_prompt = drafter and (gamma > 0 or gamma0_mode != "lazy")
            ms += profile.prompt_ms(prompt_tokens, drafts_prompt)
            if drafter and not drafts_prompt:
                lag[admitted] += prompt_len[admitted]
        if drafter and gamma > 0 and lag[idx].any():
            # The catch-up: one drafter pass over the decode tokens and
            # prompts it missed, many tokens a request as in a prefill.
            ms += profile.draft(ctx, 0) + profile.draft_prompt_ms(int(lag[idx].sum()))
            lag[idx] = 0
        ms *= math.exp(noise * noise_rng.standard_normal()) if noise else 1.0
        ms *= slow_start[0] if steps < slow_start[1] else 1.0
        ms *= drift.factor(clock.now - start) if drift is not None else 1.0
        clock.now += ms / 1000.0
        has = verify > 0
        if admission is not None:
            admission.verified(verify, accepted, decision.decided)
        fb = StepFeedback(drafted=tuple(verify[has].tolist()),
                          accepted=tuple(accepted[has].tolist()),
                          committed=int(committed.sum()), width=drafted_width,
                          requests=tuple((idx[has] + run_id).tolist()))
        if decision.decided:
            policy.observe(fb)
        elif prompt_tokens and isinstance(policy, GammaController):
            policy.observe_undecided(replace(state, prefill_tokens=prompt_tokens), fb)
        done[idx] += committed
        if gamma == 0 and gamma0_mode == "lazy":
            lag[idx] += committed
        pending[idx] = gamma
        pending_w[idx] = drafted_width = decision.width
        progress += int(committed.sum())
        # The schedule advances by the committed tokens, but a step that
        # crosses a change of batch size or acceptance ends there: the
        # tokens it committed past it are not taken from the next segment
        # (else a policy committing more per step, e.g. at a higher gamma,
        # would spend fewer tokens in every segment after a change, such as
        # a bursty load's expensive quiet spells after each burst).
        changes = [c for c in (workload.concurrency.next_change(schedule),
                               workload.rates.next_change(schedule)) if c is not None]
        schedule = min([schedule + int(committed.sum()), *changes])
        started = [r for r in started if done[r] < out_len[r]]
        steps += 1
        label = arm_label(gamma, decision.width)
        gamma_steps[label] = gamma_steps.get(label, 0) + 1
        timeline.append((round(clock.now - start, 4), b, gamma))
    return SimResult(name, workload.name, progress, clock.now - start, steps, gamma_steps, timeline)


# ------------------------------------------------------------------ compare
TARGET = "target"   # the contender without a draft model


def contenders(profile_path: str, profile: LatencyProfile, workload: Workload, max_gamma: int,
               table: Sequence[Sequence[int]] | None, vspec: dict,
               gamma0_mode: str = "sync", max_width: int = 1) -> list[tuple[str, Callable]]:
    """(name, factory(clock, rates_holder) -> StepPolicy) for every policy
    compared. fixed/online/profile are GammaController, as in the engine.
    With max_width > 1 (capped to the widths the workload has rates for):
    a fixed contender per tree arm, `fixed-{gamma}x{width}` (gamma*width <=
    K), and online/profile/oracle choose among tree arms too."""
    max_width = min(max_width, tree_widths(workload))

    def controller(min_width: int = 1, width: int = max_width, **over):
        cfg = VSpecConfig.from_dict({**vspec, **over}, max_gamma)
        return lambda clock, rates: GammaController(cfg, max_gamma, clock=clock,
                                                    min_width=min_width, max_width=width)
    out = [(TARGET, controller(width=1, policy="fixed", min_gamma=0, fixed_gamma=0))]
    out += [(f"fixed-{g}", controller(width=1, policy="fixed", min_gamma=0, fixed_gamma=g))
            for g in range(max_gamma + 1)]
    out += [(f"fixed-{arm_label(g, w)}", controller(w, w, policy="fixed", min_gamma=0,
                                                     fixed_gamma=g))
            for w in range(2, max_width + 1) for g in range(1, max_gamma // w + 1)]
    schedule = table or tuned_table(workload, profile, max_gamma, gamma0_mode=gamma0_mode)
    out.append(("table", lambda clock, rates: StaticTable(schedule, max_gamma)))
    out.append(("online", controller(policy="online")))
    out.append(("profile", controller(policy="profile", profile_path=profile_path)))
    out.append(("oracle", lambda clock, rates: Oracle(profile, max_gamma, lambda: rates[0],
                                                      gamma0_mode, max_width)))
    return out


def compare(workloads: Sequence[Workload], profile_path: str, max_gamma: int,
            table: Sequence[Sequence[int]] | None = None, vspec: dict | None = None,
            seed: int = 0, noise: float = 0.03, gamma0_mode: str = "sync",
            max_width: int = 1) -> list[SimResult]:
    profile = load_profile(profile_path)
    results = []
    for wl in workloads:
        for name, factory in contenders(profile_path, profile, wl, max_gamma, table,
                                        vspec or {}, gamma0_mode, max_width):
            clock, rates = SimClock(), [()]
            policy = factory(clock, rates)
            results.append(simulate(wl, profile, policy, clock, name=name, max_gamma=max_gamma,
                                    seed=seed, noise=noise, gamma0_mode=gamma0_mode,
                                    drafter=name != TARGET,
                                    on_rates=lambda r, h=rates: h.__setitem__(0, r)))
    return results


def ratios(results: Sequence[SimResult]) -> dict[str, dict[str, float]]:
    """Per workload: online / oracle, online / best fixed, oracle / best fixed."""
    out: dict[str, dict[str, float]] = {}
    for wl in dict.fromkeys(r.workload for r in results):
        by = {r.policy: r.tok_s for r in results if r.workload == wl}
        best_fixed = max(v for k, v in by.items() if k.startswith("fixed-"))
        out[wl] = {"online/oracle": by["online"] / by["oracle"],
                   "online/best_fixed": by["online"] / best_fixed,
                   "profile/oracle": by["profile"] / by["oracle"],
                   "table/oracle": by["table"] / by["oracle"]}
    return out


def controller_overhead_us(policy: str = "online", batch: int = 16, steps: int = 2000,
                           max_gamma: int = 4, profile_path: str | None = None) -> float:
    """Wall-clock microseconds of one decide() + observe() at this batch size
    (benchmark helper: printed by the sim, never asserted on)."""
    over = {"policy": policy, "min_gamma": 0}
    if policy == "profile":
        over["profile_path"] = profile_path
    clock = SimClock()
    ctl = GammaController(VSpecConfig.from_dict(over, max_gamma), max_gamma, clock=clock)
    state = BatchState(batch, 8192, 300.0)
    fb = StepFeedback(drafted=tuple([max_gamma] * batch),
                      accepted=tuple(i % (max_gamma + 1) for i in range(batch)),
                      committed=batch * 2)
    start = time.perf_counter()
    for _ in range(steps):
        ctl.decide(state)
        clock.now += 0.01
        ctl.observe(fb)
    return (time.perf_counter() - start) / steps * 1e6
