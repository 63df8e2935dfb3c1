"""`vllm-vspec bench`: benchmarks, one action each.

  vllm-vspec bench serve               every default variant x every workload,
                                       one `vllm serve` per variant
  vllm-vspec bench protocol arc-easy --base-url URL --dataset FILE
                                       a seed-style protocol against a running server
  vllm-vspec bench draft-head          draft time and acceptance of the draft
                                       LM head options (in-process engines)
  ... --dry-run                        (serve, protocol) print what would run, start nothing

`bench serve` shows one progress bar and the tables on the console; each
server's output goes to <output-dir>/logs/, and to the console as well with
--verbose.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from vllm_vspec.bench import overhead, protocols, runner, variants, workloads
from vllm_vspec.commands import vocabulary
from vllm_vspec.bench.loadgen import completion_body
from vllm_vspec.bench.server import SERVED_MODEL_NAME, ServerSpec
from vllm_vspec.cli import HelpFormatter

DEFAULT_TARGET = Path("models/derived/tiny-target-deep")
DEFAULT_DRAFT = Path("models/tiny-draft")
DEFAULT_EAGLE = Path("models/tiny-eagle")
DEFAULT_EAGLE3 = Path("models/tiny-eagle3")
# The MTP checkpoint of the deepened target (`make install` derives it): the
# --target that offers the mtp-* variants.
MTP_TARGET = Path("models/derived/tiny-mimo-deep")
DEFAULT_PROMPTS = Path("models/prompts")
DEFAULT_FAMILIES = ("code", "prose")
DEFAULT_OUT = Path("results/bench")
DEFAULT_LATENCY_PROFILE = Path("profiles/cpu-tiny-draft.json")


def add_parser(subparsers) -> None:
    from vllm_vspec.commands import draft_head_bench

    p = subparsers.add_parser(
        "bench", help="benchmarks: vspec's servers against fixed gamma, a seed protocol, "
                      "draft LM heads",
        description=__doc__, formatter_class=HelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_serve(actions)
    _add_protocol(actions)
    draft_head_bench.add_parser(actions)


def _add_serve(actions) -> None:
    p = actions.add_parser(
        "serve", help="one `vllm serve` per variant (dynamic and fixed gamma, target-only) "
                      "over every workload",
        description=__doc__.split("\n\n")[2] + "\n\nStarts its own servers, one at a time "
                    "(--paired: two), each with vspec or stock speculative decoding.",
        formatter_class=HelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="print the server commands and the request plan, start nothing")
    p.add_argument("--output-dir", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help="directory for results.json, the plot, server logs and traces")
    vocabulary.deprecated(p, "--out", "--output-dir", dest="output_dir", type=Path,
                          metavar="DIR")
    p.add_argument("--verbose", action="store_true",
                   help="show the servers' output on the console too (it always goes to "
                        "<output-dir>/logs/)")
    p.add_argument("--output-len", type=_output_len, default=None, metavar="N|LO:HI",
                   help="completion tokens per request; LO:HI draws each request's length "
                        "uniformly from that range, the same for every variant (unset: "
                        f"{_length_text(workloads.DEFAULT_OUTPUT_LEN)})")
    g = p.add_argument_group("models")
    g.add_argument("--target", type=Path, default=DEFAULT_TARGET,
                   help="target model (the deepened bundled target: `make install` derives it); "
                        "the mtp-* variants exist only for a target with MTP layers, e.g. "
                        f"{MTP_TARGET} (the same target plus one MTP layer), and every ratio "
                        "is then to target-only on that checkpoint")
    g.add_argument("--draft", type=Path, default=DEFAULT_DRAFT,
                   help="draft model for method draft_model")
    g.add_argument("--eagle", type=Path, default=DEFAULT_EAGLE,
                   help="EAGLE head; its variants (eagle-*) exist only if the path does")
    g.add_argument("--eagle3", type=Path, default=DEFAULT_EAGLE3,
                   help="EAGLE-3 head; its variants (eagle3-*) exist only if the path does")
    g.add_argument("--latency-profile", type=Path, default=DEFAULT_LATENCY_PROFILE,
                   help="latency profile of the draft model on this host (`vllm-vspec "
                        "profile collect` writes it); the `profile` variant exists only if it "
                        "does")
    g = p.add_argument_group("variants and workloads")
    g.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                   help="directory of <family>.jsonl prompt files (one JSON object with a "
                        "`prompt` string per line); models/prompts/families holds six "
                        "families of clearly different acceptance (models/prompt_families.py)")
    g.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                   help="comma-separated prompt families (file stems under --prompts) that "
                        "the steady-* and bursty workloads are built over, or 'all' for "
                        "every <family>.jsonl there")
    g.add_argument("--workload", action="append", default=[], metavar="NAME=CONC:FAMILY:N,...",
                   help="define a workload of your own, its phases in order (repeatable), "
                        "e.g. mixed=1:csv:8,32:code:64,1:prose:8")
    g.add_argument("--variants", default=None,
                   help="comma-separated variant names, 'all', or 'overhead' (every vspec "
                        "server beside the stock one it stands in for: target vs fixed-0, "
                        "fixed-g vs vspec-fixed-g, g = 1..3, for each drafter there is: draft "
                        "model, EAGLE, EAGLE-3, MTP with an MTP --target; with each "
                        "pair's ratio; its workloads default to steady-c1-* and steady-c32-*); "
                        "target-only always runs (unset: "
                        f"{','.join(variants.DEFAULT_VARIANTS)}; with --pair: the pairs' "
                        "variants only)")
    g.add_argument("--workloads", default=None,
                   help="comma-separated workload names or 'all' (unset: the --workload "
                        "ones if any are defined, else every built-in one)")
    g.add_argument("--low-concurrency", type=int, default=1,
                   help="requests in flight in steady-c<low> workloads and bursty's low phases")
    g.add_argument("--high-concurrency", type=int, default=32,
                   help="requests in flight in steady-c<high> workloads and bursty's high phases")
    g.add_argument("--requests-low", type=int, default=8,
                   help="requests of a steady low-concurrency workload")
    g.add_argument("--requests-high", type=int, default=64,
                   help="requests of a steady high-concurrency workload")
    g.add_argument("--repeats", type=int, default=1,
                   help="serve every variant this many times, in interleaved rounds; the "
                        "table shows the median tokens/s (and the range) over rounds")
    g.add_argument("--paired", action="store_true",
                   help="overhead pairs only (--variants overhead, or both servers of a pair "
                        "named): start each pair's stock and vspec servers together and "
                        "alternate their turns within every round (after one unmeasured "
                        "warm-up round), so each round gives one "
                        "ratio of two runs seconds apart; the pair's ratio is their median, "
                        "shown with the lowest and highest round")
    g.add_argument("--pair", action="append", default=[], metavar="MEASURED/COMPARATOR",
                   help="serve these two variants as a pair, as --paired does (implies it; "
                        "repeatable), e.g. model/fixed-2: the default controller against the "
                        "fixed gamma chosen in advance (replay's best); the pair's target is "
                        f"a median ratio of {overhead.PAIR_TARGET_RATIO:.2f}x")
    g.add_argument("--static-table", type=json.loads, default=variants.DEFAULT_STATIC_TABLE,
                   help="JSON [[batch_from, batch_to, K], ...] for the static-table variant")
    g.add_argument("--kv-cache-memory-bytes", type=int, default=ServerSpec.kv_cache_memory_bytes,
                   help="KV cache of every server")
    g.add_argument("--dtype", default=ServerSpec.dtype,
                   help="model dtype of every server (float32: greedy outputs comparable "
                        "token for token across variants)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="serve without torch.compile (much faster start-up on CPU; "
                        "step times then differ from compiled serving)")
    p.set_defaults(func=_serving_main)


def _add_protocol(actions) -> None:
    p = actions.add_parser(
        "protocol", help="a seed-style protocol against a running server",
        description="Send a protocol's requests (its prompts, output length and concurrency,\n"
                    "temperature 0) from a local dataset to a running OpenAI-compatible\n"
                    "server, and write the results JSON.",
        formatter_class=HelpFormatter)
    p.add_argument("protocol", choices=sorted(protocols.PROTOCOLS), help="the protocol")
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--dataset", type=Path, required=True, help="local JSONL dataset")
    p.add_argument("--dry-run", action="store_true",
                   help="print the request plan and the first request body, send nothing")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="prompts to send (unset: the protocol's count)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight (unset: the protocol's B)")
    p.add_argument("--output-len", type=_output_len, default=None, metavar="N",
                   help="completion tokens per request (unset: the protocol's own)")
    p.add_argument("--output", type=Path, default=None,
                   help=f"results JSON (unset: {DEFAULT_OUT}/<protocol>.json)")
    # `bench --protocol P --output-dir D` wrote D/P.json.
    vocabulary.deprecated(p, "--output-dir", "--output", dest="output_dir", type=Path,
                          metavar="DIR")
    p.set_defaults(func=_protocol_main)


# ------------------------------------------------------------------ protocol
def _protocol_main(args: argparse.Namespace) -> int:
    proto = protocols.PROTOCOLS[args.protocol]
    n = args.num_prompts or proto.num_prompts
    if args.output_len and args.output_len[0] != args.output_len[1]:
        raise SystemExit(f"bench protocol {proto.name}: --output-len "
                         f"{args.output_len[0]}:{args.output_len[1]} is not allowed: a protocol "
                         "sends one output length, give a single N")
    out_len = args.output_len[0] if args.output_len else proto.output_len
    conc = args.max_concurrency or proto.concurrency
    output = args.output or getattr(args, "output_dir", DEFAULT_OUT) / f"{proto.name}.json"
    requests = protocols.fixed_count(protocols.load_dataset(args.dataset, proto), n, out_len)
    if args.dry_run:
        print(f"protocol {proto.name}: {n} prompts from {args.dataset}, output {out_len} "
              f"tokens, max concurrency {conc}, request rate inf, temperature 0")
        print(f"POST {args.base_url}/v1/completions  (model: first of {args.base_url}/v1/models)")
        print("first request body:", json.dumps(completion_body("<model>", requests[0].prompt,
                                                                out_len)))
        print(f"results -> {output}")
        return 0
    from tqdm import tqdm
    with tqdm(total=n, desc=proto.name, unit="req") as bar:
        result = protocols.run_protocol_sync(proto, args.base_url.rstrip("/"), requests,
                                             out_len, conc, lambda c: bar.update())
    result["dataset"] = str(args.dataset)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{proto.name}: {result['completed']}/{n} completed, "
          f"{result['output_throughput_tok_s']:.1f} output tok/s -> {output}")
    return 0 if result["failed"] == 0 else 1


# --------------------------------------------------------------------- serve
def build_plan(args: argparse.Namespace) -> runner.Plan:
    """Variants, workloads and requests from the arguments (no server started)."""
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: must be at least 1")
    drafters = {"draft_model": args.draft if args.draft.exists() else None,
                "eagle": args.eagle if args.eagle.exists() else None,
                "eagle3": args.eagle3 if args.eagle3.exists() else None,
                "mtp": args.target if mtp_layers(args.target) else None}
    profiles = ({"draft_model": args.latency_profile}
                if drafters["draft_model"] and args.latency_profile.exists() else {})
    available = variants.all_variants(drafters, args.static_table, profiles)
    # The overhead set (bench/overhead.py): its vspec fixed-g servers, and
    # `--variants overhead` for all of its pairs.
    available.update({v.name: v for v in overhead.vspec_fixed_variants(drafters)})
    try:
        named_pairs = [overhead.parse_pair(text, available) for text in args.pair]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    args.paired = args.paired or bool(named_pairs)
    requested = args.variants or ("" if named_pairs else ",".join(variants.DEFAULT_VARIANTS))
    names = (list(available) if requested == "all"
             else overhead.expand(_csv(requested), available))
    unknown = [n for n in names if n not in available]
    if unknown:
        raise SystemExit(_unknown_variants(unknown, available, args))
    chosen = variants.select(available, names)
    named = {p.label for p in named_pairs}
    pairs = named_pairs + [p for p in overhead.pairs(v.name for v in chosen) if p.label not in named]
    if args.paired and not pairs:
        raise SystemExit(f"--paired: --variants {requested} has no overhead pair (a stock "
                         "server and the vspec server standing in for it, e.g. target,fixed-0); "
                         f"use --variants {overhead.SET_NAME}, name both servers of a pair, or "
                         "--pair MEASURED/COMPARATOR")
    if args.paired:   # a paired run serves its pairs' servers only
        chosen = [available[n] for n in dict.fromkeys(n for p in pairs for n in (p.stock, p.vspec))]
    available_families = workloads.families_in(args.prompts)
    built_over = available_families if args.families == "all" else _csv(args.families)
    all_workloads = workloads.build_workloads(args.low_concurrency, args.high_concurrency,
                                              args.requests_low, args.requests_high,
                                              tuple(built_over))
    defined = {}
    for text in args.workload:
        try:
            w = workloads.parse_workload(text)
        except ValueError as e:
            raise SystemExit(f"--workload: {e}") from None
        defined[w.name] = all_workloads[w.name] = w
    if args.workloads is None and not defined and overhead.SET_NAME in _csv(requested):
        wnames = overhead.default_workloads(all_workloads)   # steady, concurrency 1 and 32
    elif args.workloads is None:
        wnames = list(defined or all_workloads)
    else:
        wnames = list(all_workloads) if args.workloads == "all" else _csv(args.workloads)
    unknown = [w for w in wnames if w not in all_workloads]
    if unknown:
        raise SystemExit(f"--workloads {','.join(unknown)} is not known: choose from "
                         f"{', '.join(all_workloads)}")
    chosen_w = [all_workloads[w] for w in wnames]
    families = sorted(set().union(*(w.families for w in chosen_w)))
    missing = [f for f in families if f not in available_families]
    if missing:
        raise SystemExit(f"prompt families {', '.join(missing)}: no {args.prompts}/<family>.jsonl "
                         f"for them; families there: {', '.join(available_families) or 'none'}")
    prompts = {f: workloads.load_prompts(args.prompts / f"{f}.jsonl") for f in families}
    spec = ServerSpec(model=args.target, dtype=args.dtype,
                      max_num_seqs=max(ServerSpec.max_num_seqs, args.high_concurrency),
                      kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                      enforce_eager=args.enforce_eager)
    output_len = args.output_len or workloads.DEFAULT_OUTPUT_LEN
    return runner.Plan(spec, chosen, chosen_w,
                       {w.name: w.requests(prompts, output_len) for w in chosen_w},
                       output_len, args.output_dir, args.repeats, args.verbose,
                       pairs if args.paired else [])


def mtp_layers(target: Path) -> int:
    """MTP layers in a target checkpoint's config (`num_nextn_predict_layers`;
    0 without them or without a readable config)."""
    try:
        config = json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(config.get("num_nextn_predict_layers") or 0) if isinstance(config, dict) else 0


def _unknown_variants(unknown: list[str], available: dict, args: argparse.Namespace) -> str:
    """One line: every variant name there is, and why those that need a
    model or a profile this run lacks are not available."""
    every = variants.all_variants({"draft_model": args.draft, "eagle": args.eagle,
                                   "eagle3": args.eagle3, "mtp": args.target},
                                  args.static_table, {"draft_model": args.latency_profile})
    lacking = [f"{flag} {path}" for flag, path in (("--draft", args.draft),
               ("--eagle", args.eagle), ("--eagle3", args.eagle3),
               ("--latency-profile", args.latency_profile))
               if not path.exists()]
    if not mtp_layers(args.target):
        lacking.append(f"MTP layers in --target {args.target} (mtp-* draft with the target's "
                       f"own MTP layers: pass --target {MTP_TARGET})")
    why = ([f"not found: {', '.join(lacking)} (the variants that need them are "
            "unavailable; run from the repository or pass the paths)"] if lacking else [])
    return (f"--variants {','.join(unknown)} is not available: choose from "
            f"{', '.join(every)} (or 'all')" + ("; here " + "; ".join(why) if why else ""))


def _serving_main(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    if args.dry_run:
        _print_plan(plan, args.paired)
        return 0
    from rich.console import Console
    from rich.progress import Progress

    from vllm_vspec.bench import plot, report

    # Wide enough for the gamma column when the output is a file or a pipe.
    console = Console(width=max(160, shutil.get_terminal_size().columns))
    # A plain `kill` must still stop the servers (background jobs ignore SIGINT).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    started = time.time()
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    results = plan.out_dir / "results.json"
    console.print(f"bench: each server's output goes to {plan.log_dir}/"
                  + (" and here" if plan.verbose else " (--verbose: here too)"))

    def save(runs: list, failures: dict[str, str]) -> tuple[list, list[str]]:
        """results.json and table.md of the runs so far (rewritten after each
        server, so an interrupted bench keeps what it measured); returns the
        table rows and the phase-bound lines."""
        table_rows, bounds = report.rows(runs), report.phase_bounds(runs)
        data = report.results_json(runs, _meta(plan, started, failures), table_rows, bounds)
        pairs = (overhead.paired_ratios(runs, plan.pairs) if args.paired
                 else overhead.ratios(table_rows))
        if pairs:
            data["overhead_pairs"] = pairs
        results.write_text(json.dumps(data, indent=2) + "\n")
        lines = report.bound_lines(bounds)
        if any(v.speculative_config and v.speculative_config["method"] in
               variants.TARGET_DRAFTED for v in plan.variants):
            lines.insert(0, f"target: {plan.spec.model}; the mtp-* variants draft with its own "
                            "MTP layers, so target-only and every ratio here are on that "
                            "checkpoint")
        if pairs and args.paired:
            lines.append("pairs: vspec / the stock server it stands in for (a --pair: measured "
                         "/ comparator), both up at once; median of per-round ratios and its "
                         "target\n\n" + overhead.paired_ratio_table(runs, plan.pairs))
        elif pairs:
            lines.append(f"overhead pairs: vspec / the stock server it stands in for (ratio of "
                         f"median tokens/s over rounds; target >= {overhead.TARGET_RATIO:.2f}x)"
                         "\n\n" + overhead.ratio_table(table_rows))
        robustness = report.robustness_table(table_rows, report.acceptance_per_position(runs))
        if robustness.count("\n") > 1:   # a header only: no adaptive variant ran
            lines.append("per workload: acceptance, best fixed gamma, adaptive variants\n\n"
                         + robustness)
        (plan.out_dir / "table.md").write_text(
            report.markdown_table(table_rows) + "\n" + "".join(f"\n{b}\n" for b in lines))
        return table_rows, lines

    if args.paired:
        pairs = plan.pairs
        total = plan.requests_per_variant * 2 * len(pairs) * (plan.repeats + 1)  # + warm-up

        def serve(advance, done):
            return runner.run_paired(plan, pairs, advance, done)
    else:
        total = plan.total_requests

        def serve(advance, done):
            return runner.run_plan(plan, advance, done)
    if console.is_terminal:
        with Progress(console=console) as progress:
            task = progress.add_task("bench", total=total)
            runs, timelines, failures = serve(
                lambda what: progress.update(task, advance=1, description=what), save)
    else:  # redirected: rich draws no live bar there; one flushed line per phase
        lines = _LineProgress(total, started)
        runs, timelines, failures = serve(
            lines.advance, lambda r, f: (lines.variant_done(r, f), save(r, f)))
    table_rows, bound_lines = save(runs, failures)
    console.print(report.render_table(table_rows))
    for line in bound_lines:
        console.print(line)
    for name, error in failures.items():
        console.print(f"[red]variant {name} did not run:[/red] {error}")
    # The traced (vspec) variants when there are any: every step, exact.
    traced = [t for t in timelines if t.x_unit == "step"]
    png = plot.plot_timelines(traced or timelines, plan.out_dir / "gamma_batch.png",
                              "gamma and batch size over time")
    console.print(f"results: {results}\ntable: {plan.out_dir / 'table.md'}\nplot: {png}")
    return 0 if not failures and not any(r.errors for r in runs) else 1


class _LineProgress:
    """Progress for redirected output: a line when a variant's workload
    starts and when a server is done, flushed at once (a log file or a pipe
    then shows where a bench of many minutes is)."""

    def __init__(self, total: int, started: float):
        self.total, self.started, self.done, self.current = total, started, 0, None
        self._say(f"bench: {total} requests to send; the first server is starting")

    def _say(self, text: str) -> None:
        print(f"[{time.time() - self.started:7.1f} s] {text}", flush=True)

    def advance(self, what: str) -> None:
        self.done += 1
        if what != self.current:
            self.current = what
            self._say(f"{what}: running ({self.done}/{self.total} requests done)")

    def variant_done(self, runs: list, failures: dict[str, str]) -> None:
        self._say(f"server done ({self.done}/{self.total} requests, "
                  f"{len(failures)} variant(s) failed so far)")
        self.current = None


def _meta(plan: runner.Plan, started: float, failures: dict[str, str]) -> dict:
    return {"command": "vllm-vspec " + shlex.join(sys.argv[1:]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": time.time() - started, "host": platform.node(),
            "server": {k: str(v) for k, v in plan.spec.__dict__.items()},
            "output_len": _length_text(plan.output_len), "repeats": plan.repeats,
            "variants": {v.name: v.serve_args(plan.trace_path(v)) for v in plan.variants},
            "workloads": {w.name: [p.__dict__ for p in w.phases] for w in plan.workloads},
            "failed_variants": failures}


def _print_plan(plan: runner.Plan, paired: bool = False) -> None:
    rounds = f" x {plan.repeats} rounds" if plan.repeats > 1 else ""
    if paired:
        labels = [p.label for p in plan.pairs]
        print(f"# {len(labels)} pairs{rounds}, the two servers of a pair up at once and "
              f"taking turns each round: {'; '.join(labels)}")
    print(f"# {len(plan.variants)} servers{rounds}, {'by pairs' if paired else 'one at a time'}; "
          f"each answers {plan.requests_per_variant} requests a round "
          f"(+{runner.WARMUP_REQUESTS} warm-up), output {_length_text(plan.output_len)} tokens "
          "per request, temperature 0")
    for v in plan.variants:
        print(f"\n## variant {v.name}")
        print(shlex.join(plan.argv(v, port=0)).replace("--port 0", "--port <free>"))
    print("\n## workloads (same order on every server)")
    for w in plan.workloads:
        phases = ", ".join(f"{p.num_requests} x {p.family} @ concurrency {p.concurrency}"
                           for p in w.phases)
        print(f"{w.name}: {phases}")
    print(f"\nresults -> {plan.out_dir / 'results.json'}, plot -> "
          f"{plan.out_dir / 'gamma_batch.png'}; server logs -> {plan.log_dir}; "
          f"model name served: {SERVED_MODEL_NAME}")


def _output_len(text: str) -> tuple[int, int]:
    """`N` or `LO:HI` -> (lo, hi) with 1 <= lo <= hi."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, 0)
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed: give a positive integer N, or LO:HI with 1 <= LO <= HI")
    return lo, hi


def _length_text(output_len: tuple[int, int]) -> str:
    lo, hi = output_len
    return str(lo) if lo == hi else f"{lo}:{hi}"


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]
