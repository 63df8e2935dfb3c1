"""`vllm-vspec demo`: target-only vs speculative decoding on the bundled pair.

Runs real vLLM engines (one per variant, reused across batch sizes) with
greedy decoding on the held-out prompts, in rounds (every variant once a
round, a fresh engine each time, the order reversed every other round), and
prints one table: tokens/s and ratio to target-only (medians over rounds,
each ratio taken within its round, with the lowest and highest), mean
accepted length, per-position acceptance, and how many requests produced
exactly the target-only tokens. Each batch starts together and runs to
completion (a closed batch). vspec rows add the gamma
chosen per decode step and `ctl time`, the controller's wall time (decide +
observe + the scheduler adapter's bookkeeping) as a share of the decode steps'.

The console shows one progress bar and the table; the engines' own output
(vLLM's log, warnings, weight loading) goes to --log-file, and to the console
as well with --verbose.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from vllm_vspec.commands import vocabulary
from vllm_vspec.tools import engine_runs
from vllm_vspec.tools.engine_log import engine_output
from vllm_vspec.config import VSpecConfig
from vllm_vspec.tools.engine_runs import Variant
from vllm_vspec.core.trace import overhead_share, read_trace

# Tokens generated per request during the untimed warm-up of each batch shape.
WARMUP_TOKENS = 4

# Rounds by default: a 2-core host's slow spells last minutes, longer than a
# variant's turn, so one round can move any single row by 15%.
DEFAULT_ROUNDS = 3

# Where the engines' output goes without --log-file and --output.
DEFAULT_LOG = Path("results/demo.log")


def default_variants(draft: str | Path, eagle: str | Path | None,
                     gammas: list[int]) -> list[Variant]:
    """What the demo compares. The baseline comes first: every other row is
    checked against its outputs. Add a variant here to show it in the table."""
    k = max(gammas)
    span = f"{VSpecConfig.min_gamma}..{k}"   # the default range
    # The default policy, started cold (no state file from an earlier run).
    policy, cold = VSpecConfig().policy, {"model_state_dir": "off"}
    variants = ([Variant("target-only")] + [engine_runs.draft_model_variant(draft, g) for g in gammas]
                + [engine_runs.vspec_variant(f"vspec {policy} {span}", draft, k, policy=policy,
                                             **cold)])
    if eagle:
        variants.append(engine_runs.vspec_variant(f"eagle vspec {policy} {span}", eagle, k,
                                                  method="eagle", policy=policy, **cold))
    return variants


@dataclass
class Row:
    variant: str
    batch_size: int
    requests: int
    tokens: int
    seconds: float
    tokens_per_second: float
    speedup: float
    mean_accepted_length: float | None
    acceptance_per_position: list[float]
    identical: int
    # vspec rows, from the decision trace: decode steps per gamma chosen, and
    # the controller's time as a share of the decode steps' time
    gamma_steps: dict[int, int] | None = None
    controller_overhead: float | None = None
    # over rounds: how many, and the lowest and highest per-round speedup
    rounds: int = 1
    speedup_low: float | None = None
    speedup_high: float | None = None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed: give comma-separated positive integers, e.g. 1,2,4")
    return values


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a positive integer")
    return int(text)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help=__doc__.splitlines()[0].split(": ", 1)[1],
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=str(engine_runs.DEFAULT_TARGET),
                   help="target model dir (default: the deepened bundled target)")
    p.add_argument("--draft", default=str(engine_runs.DEFAULT_DRAFT),
                   help="draft model dir (default: the bundled draft)")
    p.add_argument("--eagle", default=str(engine_runs.DEFAULT_EAGLE),
                   help="EAGLE head dir for the eagle row, '' to leave it out "
                        "(default: the bundled head; it fits only the bundled target)")
    p.add_argument("--prompts", nargs="+", default=[str(f) for f in engine_runs.DEFAULT_PROMPT_FILES],
                   help="JSONL prompt files (key \"prompt\")")
    p.add_argument("--gammas", type=_int_list, default=[1, 2, 3, 4],
                   help="fixed draft lengths to compare (default 1,2,3,4)")
    p.add_argument("--batch-sizes", type=_int_list, default=[1, 16, 32],
                   help="concurrent requests per batch (default 1,16,32)")
    p.add_argument("--num-prompts", type=_positive_int, default=8, metavar="N",
                   help="requests per batch size, rounded up to whole batches (default 8)")
    p.add_argument("--max-tokens", type=_positive_int, default=64, metavar="N",
                   help="tokens generated per request (default 64)")
    p.add_argument("--rounds", type=_positive_int, default=DEFAULT_ROUNDS, metavar="N",
                   help="times every variant is measured, in interleaved rounds; the table "
                        "shows medians and the lowest-highest ratio (default "
                        f"{DEFAULT_ROUNDS}: one slow spell of a shared host then moves one "
                        "round, not the median)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="engine dtype (default float32: exactness without bf16 near-ties, and "
                        "faster than bf16 on CPUs without native bf16, such as AVX2-only hosts)")
    p.add_argument("--output", type=Path, metavar="PATH", help="also write the results here (JSON)")
    vocabulary.deprecated(p, "--json", "--output", dest="output", type=Path, metavar="PATH")
    p.add_argument("--log-file", type=Path, metavar="PATH",
                   help="where the engines' output goes (default: --output's path with the "
                        f"suffix .log, else {DEFAULT_LOG})")
    p.add_argument("--verbose", action="store_true",
                   help="show the engines' output on the console too")
    p.set_defaults(func=run)


def log_path(args) -> Path:
    """--log-file; else --output's path with the suffix .log; else DEFAULT_LOG."""
    if args.log_file is not None:
        return args.log_file
    return args.output.with_suffix(".log") if args.output is not None else DEFAULT_LOG


def measure(variants: list[Variant], args, pool: list[str], console=None) -> list[Row]:
    """Every variant at every batch size in `args.rounds` rounds, combined
    (combine_rounds). The baseline runs first in every round (the others
    are checked against its outputs); the rest run in reverse order in
    odd rounds, so a drift within a round favours none of them."""
    from tqdm import tqdm

    bar = tqdm(total=args.rounds * len(variants) * len(args.batch_sizes), desc="demo",
               unit="run", file=console)
    trace_dir = Path(tempfile.mkdtemp(prefix="vspec-demo-"))
    rounds = []
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[:1] + variants[:0:-1]
        rounds.append(measure_round(order, args, pool, bar, trace_dir / f"round{r + 1}"))
    bar.close()
    return combine_rounds(rounds)


def measure_round(variants: list[Variant], args, pool: list[str], bar, trace_dir: Path
                  ) -> list[Row]:
    """One round: each variant's engine built, run at every batch size, shut down."""
    rows: list[Row] = []
    baseline: dict[int, engine_runs.BatchRun] = {}
    trace_dir.mkdir(parents=True, exist_ok=True)
    for n, variant in enumerate(variants):
        bar.set_postfix_str(f"{variant.label}: starting engine")
        trace = trace_dir / f"{n}.jsonl"
        variant = _with_trace(variant, trace)
        llm = engine_runs.build_llm(args.target, variant, args.dtype, max(args.batch_sizes))
        try:
            for batch_size in args.batch_sizes:
                bar.set_postfix_str(f"{variant.label}, batch {batch_size}")
                prompts = engine_runs.prompts_for_batch(pool, batch_size, args.num_prompts)
                engine_runs.run_batches(llm, prompts[:batch_size], batch_size, WARMUP_TOKENS)
                seen = _trace_steps(trace)
                run = engine_runs.run_batches(llm, prompts, batch_size, args.max_tokens)
                if variant.is_baseline:
                    baseline[batch_size] = run
                ref = baseline[batch_size]
                rows.append(Row(
                    variant=variant.label, batch_size=batch_size, requests=len(prompts),
                    tokens=run.num_tokens, seconds=round(run.seconds, 3),
                    tokens_per_second=round(run.tokens_per_second, 1),
                    speedup=round(run.tokens_per_second / ref.tokens_per_second, 3),
                    mean_accepted_length=(round(run.spec.mean_accepted_length, 3)
                                          if run.spec.mean_accepted_length else None),
                    acceptance_per_position=[round(a, 3) for a in run.spec.acceptance_per_position],
                    identical=engine_runs.count_identical(run.token_ids, ref.token_ids),
                    **_trace_view(trace, seen)))
                bar.update()
        finally:
            engine_runs.shutdown_llm(llm)
    return rows


def combine_rounds(rounds: list[list[Row]]) -> list[Row]:
    """One row per (variant, batch size) over the rounds, in the first
    round's order: the median tokens/s, the median of the per-round
    speedups (each to the same round's target-only) with the lowest and
    highest, requests and identical outputs summed, steps per gamma
    summed, accepted length, acceptance and controller time averaged over
    the rounds."""
    groups: dict[tuple[str, int], list[Row]] = {}
    for rows in rounds:
        for row in rows:
            groups.setdefault((row.variant, row.batch_size), []).append(row)
    out = []
    for (variant, batch_size), rows in groups.items():
        mean = lambda xs: round(statistics.fmean(xs), 3) if xs else None  # noqa: E731
        accepted = [r.mean_accepted_length for r in rows if r.mean_accepted_length]
        overheads = [r.controller_overhead for r in rows if r.controller_overhead is not None]
        width = max(len(r.acceptance_per_position) for r in rows)
        acceptance = [mean([r.acceptance_per_position[i] for r in rows
                            if i < len(r.acceptance_per_position)]) for i in range(width)]
        steps: Counter = Counter()
        for r in rows:
            steps.update(r.gamma_steps or {})
        speedups = [r.speedup for r in rows]
        out.append(Row(
            variant=variant, batch_size=batch_size, requests=sum(r.requests for r in rows),
            tokens=sum(r.tokens for r in rows), seconds=round(sum(r.seconds for r in rows), 3),
            tokens_per_second=round(statistics.median(r.tokens_per_second for r in rows), 1),
            speedup=round(statistics.median(speedups), 3),
            mean_accepted_length=mean(accepted), acceptance_per_position=acceptance,
            identical=sum(r.identical for r in rows),
            gamma_steps=dict(sorted(steps.items())) if any(r.gamma_steps for r in rows) else None,
            controller_overhead=round(statistics.fmean(overheads), 5) if overheads else None,
            rounds=len(rows), speedup_low=min(speedups), speedup_high=max(speedups)))
    return out


def _with_trace(variant: Variant, trace: Path) -> Variant:
    """vspec variants write their decision trace to `trace`."""
    if variant.vspec is None:
        return variant
    return dataclasses.replace(variant, vspec={**variant.vspec, "trace_path": str(trace)})


def _trace_steps(trace: Path) -> int:
    return len(read_trace(trace)[1]) if trace.exists() else 0


def _trace_view(trace: Path, skip: int) -> dict:
    """Row fields from the trace's step records after the first `skip` (the
    trace is line-buffered and the engine idle, so it is complete): decode
    steps per gamma, and the controller's summed overhead over the summed
    step time."""
    if not trace.exists():
        return {}
    steps = read_trace(trace)[1][skip:]
    counts = Counter(step["gamma"] for step in steps)
    share = overhead_share(steps)
    return dict(gamma_steps=dict(sorted(counts.items())),
                controller_overhead=round(share, 5) if share is not None else None)


def format_table(rows: list[Row]) -> str:
    header = ("variant", "batch", "tok/s", "vs target", "lowest-highest", "mean acc len",
              "acceptance per position", "identical", "steps per gamma", "ctl time")
    lines = [(r.variant, str(r.batch_size), f"{r.tokens_per_second:.1f}", f"{r.speedup:.2f}x",
              f"{r.speedup_low:.2f}-{r.speedup_high:.2f}" if r.rounds > 1 else "-",
              f"{r.mean_accepted_length:.2f}" if r.mean_accepted_length else "-",
              " ".join(f"{a:.2f}" for a in r.acceptance_per_position) or "-",
              f"{r.identical}/{r.requests}",
              " ".join(f"{g}:{n}" for g, n in r.gamma_steps.items()) if r.gamma_steps else "-",
              f"{100 * r.controller_overhead:.2f}%" if r.controller_overhead is not None else "-")
             for r in sorted(rows, key=lambda r: r.batch_size)]
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines])


def run(args) -> int:
    # Engines run in this process: a separate engine-core process would
    # compete with this one, which only waits, for the cores of a small host.
    # An explicit setting wins.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    pool = engine_runs.load_prompts(args.prompts)
    variants = default_variants(args.draft, args.eagle, args.gammas)
    log = log_path(args)
    print(f"demo: the engines' output goes to {log}"
          + (" and here" if args.verbose else " (--verbose: here too)"),
          file=sys.stderr, flush=True)
    try:
        with engine_output(log, args.verbose) as console:
            rows = measure(variants, args, pool, console)
    except BaseException:
        print(f"the demo stopped; the engines' output is in {log}", file=sys.stderr)
        raise
    print(format_table(rows))
    print(f"{args.rounds} round(s): tok/s and vs target are medians over them, each ratio to "
          "the same round's target-only; each batch starts together and runs to completion")
    total = sum(r.requests for r in rows if r.variant != variants[0].label)
    same = sum(r.identical for r in rows if r.variant != variants[0].label)
    verdict = "token-identical to target-only" if same == total else "DIFFER from target-only"
    print(f"greedy outputs: {same}/{total} speculative requests {verdict} ({args.dtype})")
    if same != total and args.dtype != "float32":
        print("bf16 can flip near-ties; rerun with --dtype float32 to check exactness without them")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(dict(
            target=args.target, draft=args.draft, prompts=args.prompts, dtype=args.dtype,
            num_prompts=args.num_prompts, max_tokens=args.max_tokens, rounds=args.rounds,
            rows=[dataclasses.asdict(r) for r in rows]), indent=1) + "\n")
    return 0 if same == total else 1
