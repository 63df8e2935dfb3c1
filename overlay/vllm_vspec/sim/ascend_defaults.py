"""What each Ascend graph default costs, simulated (`vllm-vspec sim
--ascend-defaults --profile profiles/ascend-910b-qwen25-14b-draft.json`, or
`python -m vllm_vspec.sim.ascend_defaults`): stock vLLM-Ascend at fixed K against vspec's
online policy under the old and the new defaults, on an Ascend latency
profile. A cost model, not a measurement: nothing here ran on an NPU.

Per-step costs (ms) of a step at gamma g with B requests and batch context
ctx, from the profile's linear models T_target and T_draft:
- draft passes: g passes (a sync gamma-0 step: one, the overlay's `sync`
  mode), each T_draft(ctx + i*B, B). With the draft model's full ACL graph
  (stock; vspec's new default, one graph per gamma) a pass costs
  T_draft with its fixed per-pass term divided by `graph_factor`; eager
  (vspec's old default under dynamic gamma) it costs the profile's T_draft.
  The bundled Ascend profile is an eager derivation (its draft delta is 24
  launch-bound layers); `graph_factor` is an assumption ("several times"
  cheaper per pass), reported with every table, not a
  measured figure.
- verify: T_target(ctx, B * (1 + w)), where w is what the step verifies:
  the previous step's gamma, or K when the scheduler pads the step to keep
  the target's full decode graph (`ascend_pad_verify_width`: a step of at
  most `capture_tokens // (1 + K)` requests; larger steps have no graph to
  keep and verify their gamma). Stock verifies K always. The target's cost
  is the same function with and without a graph here: the profile does not
  separate them, so the padding costs what stock costs and never less.
  A per-width target graph (verify 1 + g with a graph) is not built; the
  `online, verify 1+g` row is what it would give, for comparison only.

The contenders run the engine's own GammaController (policy fixed or
online) through simulator.simulate, on the same workloads and luck; a
request's first step verifies what its prefill step drafted (stock: K;
online: its opening arm, K), as in the engine. Beside them, a bound: the
per-step oracle (simulator.Oracle: the true rates and the new defaults'
true step costs, no learning). Where it drafts K at every step (steady
loads inside the padding range, where each gamma < K saves only graphed
draft passes and verifies 1 + K anyway) it IS stock fixed K, so there a
policy that has to learn its arms can tie stock at best: what it spends
learning (a warm-up sweep per batch-size bucket, then probes of close
neighbours, online.py) is its loss. The ratios are given for several seeds
(the luck of one seed moves them by about a percent).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.controller import GammaController
from vllm_vspec.core.latency import LatencyProfile, LinearLatency, load_profile
from vllm_vspec.sim.simulator import (Oracle, SimClock, SimResult, Workload, bursty,
                                      phase_shift, simulate, steady)

DEFAULT_PROFILE = "profiles/ascend-910b-qwen25-14b-draft.json"
REPO = Path(__file__).resolve().parents[3]
# vLLM-Ascend's capture sizes stop at max_cudagraph_capture_size; 512 tokens
# is an assumed value for the table (set yours with --capture-tokens).
CAPTURE_TOKENS = 512
GRAPH_FACTOR = 4.0


@dataclass(frozen=True)
class AscendCosts(LatencyProfile):
    """A LatencyProfile whose step cost follows one set of graph defaults."""

    k: int = 0
    pad_verify: bool = False
    capture_tokens: int = CAPTURE_TOKENS

    def pads(self, batch: int) -> bool:
        return self.pad_verify and 0 < batch * (1 + self.k) <= self.capture_tokens

    def split_step_ms(self, target_tokens: int, draft: int, batch: int, ctx: float,
                      width: int = 1) -> float:
        if self.pads(batch):
            target_tokens = batch * (1 + self.k)
        return super().split_step_ms(target_tokens, draft, batch, ctx, width)


@dataclass(frozen=True)
class Defaults:
    """One column of the comparison."""

    name: str
    policy: str            # "fixed" (gamma K), "online", or "oracle" (simulator.Oracle)
    draft_graphs: bool     # the draft model replays captured graphs
    pad_verify: bool       # steps inside the capture range verify K
    drafter: bool = True


CONTENDERS = (
    Defaults("target-only", "fixed", True, False, drafter=False),
    Defaults("stock fixed K", "fixed", True, False),
    Defaults("online, old defaults (eager draft, verify 1+K)", "online", False, True),
    Defaults("online, new defaults (draft graph per gamma, verify 1+K)", "online", True, True),
    Defaults("online, draft graphs, verify 1+g (not built)", "online", True, False),
    # A bound, not a contender: the per-step goodput argmax under the true
    # rates and the new defaults' true costs, no noise, no learning.
    Defaults("oracle, new defaults", "oracle", True, True),
)
STOCK, OLD, NEW = CONTENDERS[1].name, CONTENDERS[2].name, CONTENDERS[3].name
ORACLE = CONTENDERS[5].name


def costs(base: LatencyProfile, k: int, draft_graphs: bool, pad_verify: bool,
          graph_factor: float = GRAPH_FACTOR,
          capture_tokens: int = CAPTURE_TOKENS) -> AscendCosts:
    draft = base.draft
    if draft_graphs:
        draft = LinearLatency(draft.alpha, draft.beta, draft.delta / graph_factor)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(LatencyProfile)}
    fields["draft"] = draft
    return AscendCosts(**fields, k=k, pad_verify=pad_verify, capture_tokens=capture_tokens)


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
        seed: int = 0, noise: float = 0.03, vspec: dict | None = None) -> SimResult:
    profile = costs(base, k, contender.draft_graphs, contender.pad_verify, graph_factor,
                    capture_tokens)
    gamma = k if contender.drafter else 0
    clock = SimClock()
    rates: list = [()]
    if contender.policy == "oracle":
        policy = Oracle(profile, k, lambda: rates[0], "sync")
    else:
        over = ({"policy": "fixed", "min_gamma": 0, "fixed_gamma": gamma}
                if contender.policy == "fixed" else {"policy": "online"})
        policy = GammaController(VSpecConfig.from_dict({**(vspec or {}), **over}, k), k,
                                 clock=clock)
    return simulate(workload, profile, policy, clock, name=contender.name, max_gamma=k,
                    seed=seed, noise=noise, gamma0_mode="sync", drafter=contender.drafter,
                    on_rates=lambda r: rates.__setitem__(0, r))


RATIOS = {"new/stock": (NEW, STOCK), "old/stock": (OLD, STOCK),
          "oracle/stock": (ORACLE, STOCK), "new/oracle": (NEW, ORACLE)}


def compare_defaults(profile_path: str = DEFAULT_PROFILE, k: int = 4,
                     graph_factor: float = GRAPH_FACTOR, capture_tokens: int = CAPTURE_TOKENS,
                     scale: float = 1.0, seed: int = 0,
                     workload_list: Sequence[Workload] | None = None,
                     num_seeds: int = 3) -> dict:
    """{workload: {contender: tokens/s}} at `seed`, the ratios of RATIOS at
    seeds seed .. seed + num_seeds - 1 ({workload: {ratio: [per seed]}}: the
    luck of a seed moves them by about a percent), plus the per-step cost
    table."""
    path = Path(profile_path)
    if not path.is_file() and (REPO / profile_path).is_file():   # a checkout, run elsewhere
        path = REPO / profile_path
    base = load_profile(path)
    seeds = list(range(seed, seed + max(1, num_seeds)))
    out: dict = {"profile": profile_path, "k": k, "graph_factor": graph_factor,
                 "capture_tokens": capture_tokens, "seeds": seeds, "tok_s": {}, "ratios": {}}
    for wl in workload_list or workloads(scale):
        per_seed = [{c.name: run(c, wl, base, k, graph_factor, capture_tokens, s).tok_s
                     for c in CONTENDERS} for s in seeds]
        out["tok_s"][wl.name] = per_seed[0]
        out["ratios"][wl.name] = {name: [round(by[a] / by[b], 4) for by in per_seed]
                                  for name, (a, b) in RATIOS.items()}
    out["step_ms"] = step_table(base, k, graph_factor, capture_tokens)
    return out


def step_table(base: LatencyProfile, k: int, graph_factor: float = GRAPH_FACTOR,
               capture_tokens: int = CAPTURE_TOKENS, batches: Sequence[int] = (1, 16, 64, 128),
               context: int = 512) -> dict:
    """{batch: {defaults: [step ms at gamma 0..K]}} for a steady step
    (verifying the gamma it drafts; gamma 0: sync, one draft pass)."""
    columns = {"stock (K-step graph, verify 1+K; runs gamma K only)": (True, False),
               "old vspec (eager draft, pad to 1+K)": (False, True),
               "new vspec (graph per gamma, pad to 1+K)": (True, True),
               "graph per gamma, verify 1+g (not built)": (True, False)}
    table: dict = {}
    for b in batches:
        ctx = float(b * context)
        row = {}
        for i, (name, (graphs, pad)) in enumerate(columns.items()):
            p = costs(base, k, graphs, pad, graph_factor, capture_tokens)
            row[name] = [None if i == 0 and g < k else
                         round(p.split_step_ms(b * (1 + g), max(g, 1), b, ctx), 2)
                         for g in range(k + 1)]
        table[b] = row
    return table


def markdown(result: dict) -> str:
    """The two tables docs/ascend.md carries."""
    names = [c.name for c in CONTENDERS]
    seeds = result.get("seeds", [0])
    lines = [f"profile `{result['profile']}`, K = {result['k']}, graph_factor "
             f"{result['graph_factor']}, capture {result['capture_tokens']} tokens; "
             f"tokens/s at seed {seeds[0]}", "",
             "| workload | target-only | stock fixed K | online, old defaults | "
             "online, new defaults | online, verify 1+g (not built) | oracle, new defaults | "
             "new / stock | old / stock |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for wl, by in result["tok_s"].items():
        cells = " | ".join(f"{by[n]:.0f}" for n in names)
        lines.append(f"| {wl} | {cells} | {by[NEW] / by[STOCK]:.3f} | "
                     f"{by[OLD] / by[STOCK]:.3f} |")
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
    p.add_argument("--capture-tokens", type=int, default=CAPTURE_TOKENS)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-seeds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = compare_defaults(args.profile, args.max_gamma, args.graph_factor,
                              args.capture_tokens, args.scale, args.seed,
                              num_seeds=args.num_seeds)
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
