"""What each Ascend graph default costs, simulated (`python -m
vllm_vspec.sim.ascend_defaults`, or `vllm-vspec sim --ascend-defaults --profile
profiles/ascend-910b-qwen25-14b-draft.json` at the default target factor):
stock vLLM-Ascend at fixed K against vspec's default policy under each pin's
defaults, on an Ascend latency profile. A cost model, not a measurement:
nothing here ran on an NPU.

Per-step costs (ms) of a step at gamma g with B requests and batch context
ctx, from the profile's linear models T_target and T_draft:
- draft passes: g passes (a sync gamma-0 step: one, the overlay's `sync`
  mode), each T_draft(ctx + i*B, B). With the draft model's full ACL graph
  (stock; vspec's 0.23 default, one graph per gamma) a pass costs T_draft
  with its fixed per-pass term divided by `graph_factor`; eager (vspec's old
  0.23 default, and vspec on 0.30) it costs the profile's T_draft. The
  bundled Ascend profile is an eager derivation (its draft delta is 24
  launch-bound layers); `graph_factor` is an assumption, reported with
  every table, not a measured figure.
- verify: T_target(ctx, B * (1 + w)), where w is what the step verifies:
  the previous step's gamma, or K when the scheduler pads the step to keep
  the target's full decode graph (`ascend_pad_verify_width`, 0.23: a step
  of at most `capture_tokens // (1 + K)` requests; larger steps have no
  graph to keep and verify their gamma). Stock verifies K always. The
  target's fixed per-step term is divided by `target_graph_factor` when the
  step replays a FULL decode graph: a uniform batch of B * (1 + w) <=
  `capture_tokens` tokens whose width the host captured (1 + K on both
  pins as shipped); any other step runs PIECEWISE or eagerly at the
  profile's cost (an assumption too: piecewise graphs recover part of that
  term).
- per-width target graphs (built on 0.23, off by default,
  `ascend_verify_width_graphs`, not yet run on NPU), as built: the widths
  1 + g that vllm_ascend/vspec/graph_budget.plan_widths admits within the
  default `ascend_width_graph_budget_mib` for the bundled profile's target
  (TARGET_LAYERS decoder layers, WIDTH_GRAPH_REQUESTS request counts) have
  FULL target graphs; a step at a skipped width is padded to the next
  captured one (1 + K), as the scheduler pads it; and after a FULL target
  graph of width 1 + g < 1 + K the draft replays g's graph, captured at
  that width (its g passes, graphed), when the step's gamma fits it (1 to
  g), else it drafts its gamma eagerly at the profile's T_draft (gamma 0
  after width 1: one eager pass). The default draft graph budget fits
  every gamma of the bundled draft.

The contenders run the engine's own GammaController through
simulator.simulate, on the same workloads and luck: stock at policy fixed
K, every vspec contender at the policy a launch that sets none gets (the
config dataclass's `policy`, as VSpecConfig resolves it), and one named
extra row at policy `online`. A request's first step verifies what its
prefill step drafted (stock: K; vspec: its policy's opening arm), as in
the engine. The 0.30.0rc2 pin's default is vspec off, i.e. stock fixed K;
its row is vspec turned on there. The 0.23 defaults hold K on padded
steps, as the engine's scheduler does (VSpecScheduler._decide): inside the
padded range a step drafts K, undecided (the padded verify costs 1 + K
whatever gamma is, so a gamma below K saves only graphed draft passes),
unless the model policy's predictions, priced for a padded step and net of
the fit's error, show a smaller gamma gains (core/padded_gamma.py; never a
probe); the policy decides only the other steps, and every padded step's
output teaches it (its real drafts' acceptance, its time with the B * K
slots verified: KWherePadded, as the engine's scheduler reports them); one
row leaves that rule out.
Beside them, a bound: the per-step oracle (simulator.Oracle: the true rates
and the 0.23 defaults' true step costs, no learning). The ratios are given
for several seeds (the luck of one seed moves them by about a percent).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.latency import LatencyProfile, LinearLatency, load_profile
from vllm_vspec.core.padded_gamma import padded_decision, padded_learner
from vllm_vspec.core.steps import BatchState, Decision, StepFeedback, covering_gamma
from vllm_vspec.sim.simulator import (Oracle, SimClock, SimResult, Workload, bursty,
                                      phase_shift, simulate, steady)

DEFAULT_PROFILE = "profiles/ascend-910b-qwen25-14b-draft.json"
REPO = Path(__file__).resolve().parents[3]
# vLLM-Ascend's capture sizes stop at max_cudagraph_capture_size; 512 tokens
# is an assumed value for the table (set yours with --capture-tokens).
CAPTURE_TOKENS = 512
GRAPH_FACTOR = 4.0
# A FULL target decode graph's fixed per-step cost is the profile's divided
# by this: an assumption (the 14B target's fixed term is about half weight
# reads, which a graph does not save, and half launches).
TARGET_GRAPH_FACTOR = 1.5

# Which verify widths have a FULL target decode graph.
HOST_WIDTH = "1+K"       # the host's one uniform-decode width (both pins as shipped)
EVERY_WIDTH = "1+g"      # every width (target-only: its one width, 1)
BUDGET_WIDTHS = "1+g within the budget"   # per-width graphs as built (0.23, off by default)
# graph_budget.plan_widths' inputs for the bundled profile's target
# (Qwen2.5-14B: 48 decoder layers) at the presets' 48 request counts (vLLM
# 0.23's default capture sizes up to 512 tokens at max_num_seqs 128,
# docs/ascend.md "What the per-gamma draft graphs cost").
TARGET_LAYERS = 48
WIDTH_GRAPH_REQUESTS = 48


def width_gammas(k: int, full_widths: str) -> tuple[int, ...]:
    """The gammas whose verify width 1 + gamma has a FULL target graph."""
    if full_widths == HOST_WIDTH:
        return (k,)
    if full_widths == EVERY_WIDTH:
        return tuple(range(k + 1))
    from vllm_ascend.vspec.graph_budget import plan_widths

    return plan_widths(k, range(1, WIDTH_GRAPH_REQUESTS + 1), TARGET_LAYERS,
                       VSpecConfig.ascend_width_graph_budget_mib).captured


@dataclass(frozen=True)
class AscendCosts(LatencyProfile):
    """A LatencyProfile whose step cost follows one set of graph defaults."""

    k: int = 0
    pad_verify: bool = False
    capture_tokens: int = CAPTURE_TOKENS
    target_graph_factor: float = 1.0
    full_widths: str = HOST_WIDTH
    widths: tuple[int, ...] = ()        # width_gammas(k, full_widths)
    # Per-width target graphs as built: after a FULL target graph of width
    # 1 + g < 1 + K the draft replays g's graph where the step's gamma fits
    # it, else a pass costs this much more (eager; 0 elsewhere).
    eager_draft_extra_ms: float = 0.0

    def pads(self, batch: int) -> bool:
        return self.pad_verify and 0 < batch * (1 + self.k) <= self.capture_tokens

    def verified(self, target_tokens: int, batch: int) -> int:
        """What a padded step verifies: the smallest gamma with a target
        graph at or above the step's (K for a step that is not uniform)."""
        gamma = self.k if target_tokens % batch else target_tokens // batch - 1
        return covering_gamma(self.widths, gamma, self.k)

    def full_target(self, target_tokens: int, batch: int) -> bool:
        """The step replays a FULL target decode graph (module docstring)."""
        if batch <= 0 or not 0 < target_tokens <= self.capture_tokens or target_tokens % batch:
            return False
        return target_tokens // batch - 1 in self.widths

    def split_step_ms(self, target_tokens: int, draft: int, batch: int, ctx: float,
                      width: int = 1) -> float:
        if self.pads(batch):
            target_tokens = batch * (1 + self.verified(target_tokens, batch))
        full = self.full_target(target_tokens, batch)
        eager = 0.0
        if full and self.eager_draft_extra_ms and target_tokens != batch * (1 + self.k):
            own = target_tokens // batch - 1
            if 0 < draft <= own:
                draft = own     # the width's own draft graph: its passes, graphed
            else:
                eager = draft * self.eager_draft_extra_ms
        ms = super().split_step_ms(target_tokens, draft, batch, ctx, width) + eager
        if full:
            ms -= self.target.delta * (1.0 - 1.0 / self.target_graph_factor)
        return ms


@dataclass(frozen=True)
class Defaults:
    """One column of the comparison."""

    name: str
    # None: the default policy (default_policy); "fixed" (gamma K), a named
    # VSpecConfig policy, or "oracle" (simulator.Oracle).
    policy: str | None
    draft_graphs: bool     # the draft model replays captured graphs
    pad_verify: bool       # steps inside the capture range verify K
    drafter: bool = True
    full_widths: str = HOST_WIDTH
    hold_padded: bool = False   # padded steps draft K; the policy decides the others


CONTENDERS = (
    Defaults("target-only", "fixed", True, False, drafter=False, full_widths=EVERY_WIDTH),
    Defaults("stock fixed K", "fixed", True, False),
    Defaults("0.23 old defaults (eager draft, verify 1+K)", None, False, True),
    Defaults("0.23 without K where padded (draft graph per gamma, verify 1+K)", None, True, True),
    Defaults("0.23 defaults (K where padded, draft graph per gamma)", None, True, True,
             hold_padded=True),
    Defaults("0.23 defaults, policy online", "online", True, True, hold_padded=True),
    Defaults("0.30 with vspec on (eager draft, verify 1+g)", None, False, False),
    Defaults("target graph per width, verify 1+g (0.23, opt-in)", None, True, True,
             full_widths=BUDGET_WIDTHS),
    # A bound, not a contender: the per-step goodput argmax under the true
    # rates and the 0.23 defaults' true costs, no noise, no learning.
    Defaults("oracle, 0.23 defaults", "oracle", True, True),
)
(TARGET_ONLY, STOCK, OLD, NEW, HOLD, HOLD_ONLINE, V030, PER_WIDTH,
 ORACLE) = (c.name for c in CONTENDERS)


def default_policy(vspec: dict | None = None) -> str:
    """The product's default policy for these settings: what VSpecConfig
    resolves when no `policy` key is given (a contender without a named one
    runs it)."""
    return VSpecConfig.from_dict({k: v for k, v in (vspec or {}).items() if k != "policy"}).policy


class KWherePadded:
    """Padded steps draft K unless the model policy's predictions show a
    smaller gamma gains (core/padded_gamma.py, as the engine's scheduler
    applies it), undecided (the verify costs 1 + K whatever the gamma); the
    controller decides and learns from every other step. A padded step's
    output teaches the policy as the engine's scheduler reports it
    (observe_undecided with padded_gamma.padded_learner: its real drafts,
    and its time with the B * K slots the padded verify runs)."""

    def __init__(self, controller: GammaController, profile: AscendCosts):
        self.controller, self.profile = controller, profile
        self._padded: BatchState | None = None    # the padded step awaiting its output

    def decide(self, batch: BatchState) -> Decision:
        if self.profile.pads(batch.num_reqs):
            self._padded = batch
            decision = padded_decision(self.controller, lambda: batch, batch.num_reqs,
                                       self.profile.k)
            # simulate() hands only a decided step's output to observe(),
            # which routes a padded one to the controller's undecided path.
            return dataclasses.replace(decision, decided=True)
        self._padded = None
        return self.controller.decide(batch)

    def observe(self, fb: StepFeedback) -> None:
        batch, self._padded = self._padded, None
        if batch is None:
            self.controller.observe(fb)
            return
        self.controller.observe_undecided(batch, fb, padded_learner(
            self.controller, batch.num_reqs * self.profile.k))


def costs(base: LatencyProfile, k: int, draft_graphs: bool, pad_verify: bool,
          graph_factor: float = GRAPH_FACTOR, capture_tokens: int = CAPTURE_TOKENS,
          target_graph_factor: float = TARGET_GRAPH_FACTOR,
          full_widths: str = HOST_WIDTH) -> AscendCosts:
    draft = base.draft
    if draft_graphs:
        draft = LinearLatency(draft.alpha, draft.beta, draft.delta / graph_factor)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(LatencyProfile)}
    fields["draft"] = draft
    # Per-width target graphs as built: draft graphs paired with widths.
    extra = base.draft.delta - draft.delta if full_widths == BUDGET_WIDTHS else 0.0
    return AscendCosts(**fields, k=k, pad_verify=pad_verify, capture_tokens=capture_tokens,
                       target_graph_factor=target_graph_factor, full_widths=full_widths,
                       widths=width_gammas(k, full_widths), eager_draft_extra_ms=extra)


def workloads(scale: float = 1.0) -> list[Workload]:
    """Steady batches inside and outside the padding range, a phase-shifting
    acceptance and a bursty load (simulator.py's synthetic workloads)."""
    def n(tokens: int) -> int:
        return max(1024, int(tokens * scale))
    return [steady(1, tokens=n(8192)), steady(16, tokens=n(32768)), steady(64, tokens=n(65536)),
            steady(128, tokens=n(65536)), phase_shift(16, tokens=n(65536)),
            bursty(tokens=n(98304))]


def run(contender: Defaults, workload: Workload, base: LatencyProfile, k: int,
        graph_factor: float = GRAPH_FACTOR, capture_tokens: int = CAPTURE_TOKENS,
        seed: int = 0, noise: float = 0.03, vspec: dict | None = None,
        target_graph_factor: float = TARGET_GRAPH_FACTOR) -> SimResult:
    profile = costs(base, k, contender.draft_graphs, contender.pad_verify, graph_factor,
                    capture_tokens, target_graph_factor, contender.full_widths)
    gamma = k if contender.drafter else 0
    clock = SimClock()
    rates: list = [()]
    if contender.policy == "oracle":
        policy = Oracle(profile, k, lambda: rates[0], "sync")
    else:
        over = ({"policy": "fixed", "min_gamma": 0, "fixed_gamma": gamma}
                if contender.policy == "fixed" else {"policy": contender.policy or default_policy(vspec)})
        policy = GammaController(VSpecConfig.from_dict({**(vspec or {}), **over}, k), k,
                                 clock=clock)
        if contender.hold_padded:
            policy = KWherePadded(policy, profile)
    return simulate(workload, profile, policy, clock, name=contender.name, max_gamma=k,
                    seed=seed, noise=noise, gamma0_mode="sync", drafter=contender.drafter,
                    on_rates=lambda r: rates.__setitem__(0, r))


RATIOS = {"0.23/stock": (NEW, STOCK), "0.23 K where padded/stock": (HOLD, STOCK),
          "0.23 online/stock": (HOLD_ONLINE, STOCK),
          "0.23 old/stock": (OLD, STOCK), "0.30 on/stock": (V030, STOCK),
          "per width/stock": (PER_WIDTH, STOCK), "oracle/stock": (ORACLE, STOCK)}


def compare_defaults(profile_path: str = DEFAULT_PROFILE, k: int = 4,
                     graph_factor: float = GRAPH_FACTOR, capture_tokens: int = CAPTURE_TOKENS,
                     scale: float = 1.0, seed: int = 0,
                     workload_list: Sequence[Workload] | None = None,
                     num_seeds: int = 3,
                     target_graph_factor: float = TARGET_GRAPH_FACTOR) -> dict:
    """{workload: {contender: tokens/s}} at `seed`, the ratios of RATIOS at
    seeds seed .. seed + num_seeds - 1 ({workload: {ratio: [per seed]}}: the
    luck of a seed moves them by about a percent), plus the per-step cost
    table."""
    path = Path(profile_path)
    if not path.is_file() and (REPO / profile_path).is_file():   # a checkout, run elsewhere
        path = REPO / profile_path
    base = load_profile(path)
    seeds = list(range(seed, seed + max(1, num_seeds)))
    out: dict = {"profile": profile_path, "k": k, "policy": default_policy(),
                 "graph_factor": graph_factor,
                 "target_graph_factor": target_graph_factor,
                 "capture_tokens": capture_tokens, "seeds": seeds, "tok_s": {}, "ratios": {}}
    for wl in workload_list or workloads(scale):
        per_seed = [{c.name: run(c, wl, base, k, graph_factor, capture_tokens, s,
                                 target_graph_factor=target_graph_factor).tok_s
                     for c in CONTENDERS} for s in seeds]
        out["tok_s"][wl.name] = per_seed[0]
        out["ratios"][wl.name] = {name: [round(by[a] / by[b], 4) for by in per_seed]
                                  for name, (a, b) in RATIOS.items()}
    out["step_ms"] = step_table(base, k, graph_factor, capture_tokens,
                                target_graph_factor=target_graph_factor)
    return out


# The per-step cost table's columns: (draft graphs, pad verify, FULL target widths).
STEP_COLUMNS = {
    "stock (K-step graph, verify 1+K; runs gamma K only)": (True, False, HOST_WIDTH),
    "0.23 old defaults (eager draft, pad to 1+K)": (False, True, HOST_WIDTH),
    "0.23 defaults (graph per gamma, pad to 1+K)": (True, True, HOST_WIDTH),
    "0.30 with vspec on (eager draft, verify 1+g)": (False, False, HOST_WIDTH),
    "target graph per width, verify 1+g (0.23, opt-in)": (True, True, BUDGET_WIDTHS),
}


def step_table(base: LatencyProfile, k: int, graph_factor: float = GRAPH_FACTOR,
               capture_tokens: int = CAPTURE_TOKENS, batches: Sequence[int] = (1, 16, 64, 128),
               context: int = 512, target_graph_factor: float = TARGET_GRAPH_FACTOR) -> dict:
    """{batch: {defaults: [step ms at gamma 0..K]}} for a steady step
    (verifying the gamma it drafts; gamma 0: sync, one draft pass)."""
    table: dict = {}
    for b in batches:
        ctx = float(b * context)
        row = {}
        for i, (name, (graphs, pad, widths)) in enumerate(STEP_COLUMNS.items()):
            p = costs(base, k, graphs, pad, graph_factor, capture_tokens, target_graph_factor,
                      widths)
            row[name] = [None if i == 0 and g < k else
                         round(p.split_step_ms(b * (1 + g), max(g, 1), b, ctx), 2)
                         for g in range(k + 1)]
        table[b] = row
    return table


def markdown(result: dict) -> str:
    """The tables docs/ascend.md carries."""
    names = [c.name for c in CONTENDERS]
    seeds = result.get("seeds", [0])
    lines = [f"profile `{result['profile']}`, K = {result['k']}, graph_factor "
             f"{result['graph_factor']}, target_graph_factor "
             f"{result.get('target_graph_factor', 1.0)}, capture {result['capture_tokens']} "
             f"tokens; vspec rows at policy {result.get('policy', default_policy())} (the "
             f"default) unless they name one; tokens/s at seed {seeds[0]}", "",
             "| workload | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for wl, by in result["tok_s"].items():
        lines.append(f"| {wl} | " + " | ".join(f"{by[n]:.0f}" for n in names) + " |")
    if "ratios" in result:
        lines += ["", f"ratios over seeds {seeds[0]}-{seeds[-1]} (min-max):", "",
                  "| workload | " + " | ".join(RATIOS) + " |",
                  "|---|" + "---:|" * len(RATIOS)]
        for wl, by in result["ratios"].items():
            lines.append(f"| {wl} | " + " | ".join(
                f"{min(v):.3f}-{max(v):.3f}" for v in by.values()) + " |")
    lines += ["", "| batch | defaults | " + " | ".join(f"gamma {g}" for g in
                                                       range(result["k"] + 1)) + " |",
              "|---|---|" + "---:|" * (result["k"] + 1)]
    for b, row in result["step_ms"].items():
        for name, values in row.items():
            lines.append(f"| {b} | {name} | " + " | ".join(
                "-" if v is None else f"{v:.1f}" for v in values) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="vllm-vspec sim --ascend-defaults",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--max-gamma", type=int, default=4)
    p.add_argument("--graph-factor", type=float, default=GRAPH_FACTOR)
    p.add_argument("--target-graph-factor", type=float, default=TARGET_GRAPH_FACTOR)
    p.add_argument("--capture-tokens", type=int, default=CAPTURE_TOKENS)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-seeds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = compare_defaults(args.profile, args.max_gamma, args.graph_factor,
                              args.capture_tokens, args.scale, args.seed,
                              num_seeds=args.num_seeds,
                              target_graph_factor=args.target_graph_factor)
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
