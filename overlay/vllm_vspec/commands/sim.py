"""`vllm-vspec sim`: trace-driven simulator of dynamic gamma (the simulator is
sim/simulator.py, its table, plot and named workloads sim/report.py).

Compares fixed gamma 0..K, vLLM's static batch-size table, the online and
profile policies and the per-step oracle on the same synthetic or recorded
workloads and latency profile, prints a table of tokens/s and ratios, and
writes sim.json and sim.png. With --verify-budget it compares per-request
verify budgets instead (sim/budget_sim.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_vspec.commands import vocabulary
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.latency import ProfileError, load_profile
from vllm_vspec.sim import budget_sim
from vllm_vspec.sim.report import WORKLOADS, plot, table_text
from vllm_vspec.sim.simulator import (DRAFT_RATES, GAMMA0_MODES, Rates, compare,
                                      controller_overhead_us, from_trace, ratios)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim", help="simulate gamma policies on acceptance traces and a latency profile",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, help="latency profile JSON (see profiles/)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma list from {', '.join(WORKLOADS)} (default: all)")
    p.add_argument("--trace", action="append", default=[],
                   help="replay a recorded vspec trace JSONL (repeatable)")
    p.add_argument("--max-gamma", type=int, default=4,
                   help="K: gammas 0..K are compared (a tree arm drafts gamma*width <= K "
                        "nodes)")
    p.add_argument("--rates", default=",".join(map(str, DRAFT_RATES)),
                   help="conditional acceptance per draft position for the steady and "
                        "bursty workloads (later positions repeat the last value)")
    p.add_argument("--max-width", type=int, default=1,
                   help="widest tree arm compared (1: linear drafts only); a workload gets "
                        "tree arms up to the widest width it has rates for")
    p.add_argument("--tree-rates", action="append", default=[], metavar="W:R1,R2,...",
                   help="conditional acceptance per depth of width-W trees for the steady "
                        "and bursty workloads (repeatable, one per width 2..--max-width)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every synthetic workload's length (tokens)")
    p.add_argument("--table", default=None,
                   help="static table JSON [[start,end,k],...] (default: tuned per workload)")
    p.add_argument("--vspec", default="{}", help="JSON of vspec settings for online/profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.03, help="log-normal step-time noise sigma")
    p.add_argument("--gamma0-mode", choices=GAMMA0_MODES, default="sync",
                   help="what a gamma-0 step costs: sync = one draft pass over the step's "
                        "tokens (the Ascend overlay, EAGLE, async scheduling); lazy = none, "
                        "then a catch-up pass when drafting resumes (vspec's vLLM runner "
                        "with a draft model)")
    p.add_argument("--output-dir", type=Path, default=Path("results/sim"), metavar="DIR",
                   help="directory for sim.json and sim.png (ascend_defaults.json, "
                        "verify_budget.json with --ascend-defaults, --verify-budget)")
    vocabulary.deprecated(p, "--out", "--output-dir", dest="output_dir", type=Path,
                          metavar="DIR")
    p.add_argument("--ascend-defaults", action="store_true",
                   help="instead: stock vLLM-Ascend at fixed K against the online policy "
                        "under vspec's old and new Ascend graph defaults, with their per-step "
                        "costs (sim/ascend_defaults.py; docs/ascend.md, 'What each default "
                        "costs'); writes ascend_defaults.json")
    p.add_argument("--graph-factor", type=float, default=4.0,
                   help="--ascend-defaults: a graphed draft pass's fixed cost is the "
                        "profile's divided by this (an assumption)")
    p.add_argument("--capture-tokens", type=int, default=512,
                   help="--ascend-defaults: the target's largest captured decode graph, in "
                        "tokens (padding to 1 + K applies up to it)")
    p.add_argument("--verify-budget", action="store_true",
                   help="compare per-request verify budgets instead "
                        "(sim/budget_sim.py): batch-uniform online, every fixed gamma, the "
                        "budget policy (calibrated draft probabilities, online step-cost "
                        "model: core/budget) and the per-request oracle (true acceptance, "
                        "true latency), on requests of heterogeneous acceptance (hetero-bB: "
                        "levels uniform in [0.1, 0.95]) and a control with every request at "
                        "0.8 (uniform-bB), at each of --batches; gamma 0 is sync; writes "
                        "verify_budget.json. --workloads, --trace, --rates, --tree-rates, "
                        "--table, --max-width and --gamma0-mode do not apply")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128,256",
                   help="with --verify-budget: comma list of batch sizes (concurrency)")
    p.add_argument("--signal", choices=sorted(budget_sim.SIGNALS), default="overconfident-noisy",
                   help="with --verify-budget: the drafter's probability q of a slot of true "
                        "acceptance pi: exact (q = pi), noisy (+ N(0, 0.15)), overconfident "
                        "(pi**0.4), overconfident-noisy (both), poor (+ N(0, 0.4))")
    p.add_argument("--token-spread", type=float, default=0.0,
                   help="with --verify-budget: logit spread of a slot's acceptance around its "
                        "request's (0: the oracle knows every slot's acceptance)")
    p.set_defaults(func=_main)


def _rates(flag: str, text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(x) for x in text.split(","))
    except ValueError:
        rates = ()
    if not rates or not all(0.0 <= x <= 1.0 for x in rates):
        raise SystemExit(f"{flag}={text!r}: need comma-separated values in [0, 1]")
    return rates


def _main(args: argparse.Namespace) -> int:
    # Every input checked before the (long) simulation: one line each.
    try:
        profile = load_profile(args.profile)
    except OSError as exc:
        raise SystemExit(f"--profile={args.profile!r} is not allowed: a readable latency "
                         f"profile JSON ({exc.strerror}); see profiles/") from None
    except ProfileError as exc:
        what = exc.allowed if exc.key == "<file>" else f"{exc.key}={exc.value!r} must be {exc.allowed}"
        raise SystemExit(f"--profile={args.profile!r} is not allowed: a latency profile JSON "
                         f"({what}); see profiles/") from None
    try:
        vspec = json.loads(args.vspec)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--vspec={args.vspec!r} is not allowed: a JSON object of vspec "
                         f"settings ({exc})") from None
    if not isinstance(vspec, dict):
        raise SystemExit(f"--vspec={args.vspec!r} is not allowed: a JSON object of vspec "
                         "settings")
    VSpecConfig.from_dict(vspec)  # VSpecConfigError names the key
    if args.verify_budget:
        return _verify_budget(args, vspec)
    if args.ascend_defaults:
        return _ascend_defaults(args)
    try:
        table = json.loads(args.table) if args.table else None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--table={args.table!r} is not allowed: JSON [[start,end,k],...] "
                         f"({exc})") from None
    unknown = [w for w in args.workloads.split(",") if w and w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"--workloads: unknown {unknown}; known: {', '.join(WORKLOADS)}")
    rates: Rates = _rates("--rates", args.rates)
    if args.max_width < 1:
        raise SystemExit(f"--max-width={args.max_width}: need an integer >= 1")
    if args.tree_rates:
        rates = {1: rates}
        for spec in args.tree_rates:
            width, _, values = spec.partition(":")
            if not width.isdigit() or int(width) < 2:
                raise SystemExit(f"--tree-rates={spec!r}: need W:R1,R2,... with W >= 2")
            rates[int(width)] = _rates("--tree-rates", values)
    workloads = [WORKLOADS[w](args.scale, rates) for w in args.workloads.split(",") if w]
    for t in args.trace:
        if not Path(t).is_file():
            raise SystemExit(f"--trace={t!r} is not allowed: a vspec trace JSONL file "
                             "(trace_path writes one)")
    workloads += [from_trace(t) for t in args.trace]
    results = compare(workloads, args.profile, args.max_gamma, table, vspec,
                      args.seed, args.noise, args.gamma0_mode, args.max_width)
    print(f"profile: {profile.name} ({profile.source}) {profile.note}; "
          f"gamma 0: {args.gamma0_mode}")
    print(table_text(results))
    overhead = {p: controller_overhead_us(p, 16, profile_path=args.profile)
                for p in ("online", "profile")}
    step_ms = profile.step_ms(2, 16, 16 * 384.0)
    for p, us in overhead.items():
        print(f"controller overhead ({p}, B16): {us:.1f} us/step = "
              f"{100 * us / 1000 / step_ms:.3f}% of a {step_ms:.1f} ms gamma-2 step")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim.json").write_text(json.dumps({
        "profile": args.profile, "max_gamma": args.max_gamma, "seed": args.seed,
        "gamma0_mode": args.gamma0_mode, "max_width": args.max_width,
        "results": [{"policy": r.policy, "workload": r.workload, "tokens": r.tokens,
                     "seconds": r.seconds, "tok_s": r.tok_s, "steps": r.steps,
                     "gamma_steps": r.gamma_steps} for r in results],
        "ratios": ratios(results), "controller_overhead_us_b16": overhead}, indent=1))
    plot(results, out / "sim.png")
    print(f"wrote {out / 'sim.json'} and {out / 'sim.png'}")
    return 0


def _ascend_defaults(args: argparse.Namespace) -> int:
    from vllm_vspec.sim import ascend_defaults

    if args.graph_factor < 1 or args.capture_tokens < 1:
        raise SystemExit(f"--graph-factor={args.graph_factor} / --capture-tokens="
                         f"{args.capture_tokens}: need a factor >= 1 and tokens >= 1")
    result = ascend_defaults.compare_defaults(args.profile, args.max_gamma, args.graph_factor,
                                              args.capture_tokens, args.scale, args.seed)
    print(ascend_defaults.markdown(result))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ascend_defaults.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'ascend_defaults.json'}")
    return 0


def _verify_budget(args: argparse.Namespace, vspec: dict) -> int:
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise SystemExit(f"--batches={args.batches!r}: need comma-separated integers >= 1")
    if args.token_spread < 0:
        raise SystemExit(f"--token-spread={args.token_spread}: need a value >= 0")
    workloads = []
    for b in batches:
        tokens = max(1, int(budget_sim.default_tokens(b) * args.scale))
        workloads += [budget_sim.hetero(b, args.signal, tokens, args.token_spread),
                      budget_sim.uniform_levels(b, signal=args.signal, tokens=tokens)]
    rows = budget_sim.summary(budget_sim.compare(workloads, args.profile, args.max_gamma, vspec,
                                                 args.seed, args.noise))
    print(f"profile: {args.profile}; signal: {args.signal}; token spread: {args.token_spread}")
    print(budget_sim.table_text(rows))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_budget.json").write_text(json.dumps({
        "profile": args.profile, "max_gamma": args.max_gamma, "seed": args.seed,
        "signal": args.signal, "token_spread": args.token_spread, "rows": rows}, indent=1))
    print(f"wrote {out / 'verify_budget.json'}")
    return 0
