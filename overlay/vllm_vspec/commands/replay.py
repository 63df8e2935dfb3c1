"""`vllm-vspec replay`: score gamma policies exactly, on recorded token
streams and measured step costs (overlay/vllm_vspec/replay/).

  record  target-only greedy streams of a prompt set, and the drafter's
          acceptance run (and, where it has them, its draft probabilities)
          at every decode position, on the real engine
  costs   step costs of this host's engines, fitted to the simulator's
          latency model, residuals printed (written beside the recording)
  score   every policy on every workload over the recording: a table of
          tokens/s and ratios, JSON and a gamma-over-time plot

    vllm-vspec replay record --method draft_model --output profiles/replay/draft_model-k4.json.gz
    vllm-vspec replay costs --recording profiles/replay/draft_model-k4.json.gz
    vllm-vspec replay score --recording profiles/replay/draft_model-k4.json.gz

With greedy decoding and strict acceptance the target's output is the same
under every policy, so one recording serves every policy and every
workload, and a score has no run-to-run noise (`--noise` adds seeded
log-normal step-time noise to test robustness).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from vllm_vspec.cli import HelpFormatter, UserError

FAMILIES_DIR = Path(__file__).resolve().parents[3] / "models" / "prompts" / "families"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("replay", help="score gamma policies exactly on recorded streams and measured step costs",
                              description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    r = sub.add_parser("record", help="record streams and acceptance runs on the real engine",
                       formatter_class=HelpFormatter)
    from vllm_vspec.replay.record import METHODS
    r.add_argument("--method", choices=METHODS, default="draft_model", help="speculative method")
    r.add_argument("--prompts", type=Path, nargs="+", default=[FAMILIES_DIR],
                   help="a directory of <family>.jsonl files, or JSONL files (a `prompt` string a line)")
    r.add_argument("--requests-per-family", type=int, default=24,
                   help="prompts taken from each family file, in file order")
    r.add_argument("--num-speculative-tokens", type=int, default=4, help="K: the chain length recorded")
    r.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    r.add_argument("--target", type=Path, default=None,
                   help="target model directory (default: the method's bundled target)")
    r.add_argument("--draft", type=Path, default=None,
                   help="drafter model directory (default: the method's bundled drafter)")
    r.add_argument("--output", type=Path, required=True, help="recording file to write (.json.gz)")
    r.set_defaults(func=run_record)

    c = sub.add_parser("costs", help="measure this host's step costs and fit them",
                       formatter_class=HelpFormatter)
    c.add_argument("--recording", type=Path, required=True, help="recording file (replay record)")
    c.add_argument("--batch-sizes", default="1,8,32", help="comma-separated batch sizes to time")
    c.add_argument("--decode-steps", type=int, default=12,
                   help="timed decode steps per batch size and engine instance")
    c.add_argument("--instances", type=int, default=3,
                   help="times each engine is built, in interleaved rounds (instances of one "
                        "engine can differ by a third at batch 1 on a small host)")
    c.add_argument("--prefill-only", action="store_true",
                   help="time only the engines' prefill steps (what prompt tokens cost) and refit "
                        "with the decode samples already saved beside the recording")
    c.set_defaults(func=run_costs)

    s = sub.add_parser("score", help="score every policy on every workload over a recording",
                       formatter_class=HelpFormatter)
    s.add_argument("--recording", type=Path, required=True, help="recording file (replay record)")
    s.add_argument("--costs", type=Path, default=None,
                   help="latency profile JSON (default: the one `replay costs` wrote beside the recording)")
    from vllm_vspec.replay.score import DEFAULT_POLICIES, DEFAULT_WORKLOADS, shapes
    s.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help=f"comma list of {', '.join(shapes())} (c32v: c32 with every request "
                        "ending after 25-100%% of its recorded tokens, so requests do not end "
                        "together; b16, b32: a closed batch of 16 or 32 requests started "
                        "together, as `make demo` runs them)")
    s.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="vspec policies scored beside target-only, fixed gamma, the static table "
                        "and the oracles (budget: on a recording with draft probabilities)")
    s.add_argument("--requests-low", type=int, default=48, help="requests of the c1 workload")
    s.add_argument("--requests-high", type=int, default=240, help="requests of the c32 workload (c8: half)")
    s.add_argument("--vspec", default="{}", help="JSON table of vspec settings for the vspec policies")
    s.add_argument("--gamma0-mode", choices=("lazy", "sync"), default="lazy",
                   help="what a gamma-0 step costs (lazy: vspec's vLLM worker with a draft model or EAGLE)")
    s.add_argument("--noise", type=float, default=0.0, help="log-normal step-time noise sigma (seeded)")
    s.add_argument("--seed", type=int, default=0, help="seed of the step-time noise")
    s.add_argument("--policy-seeds", type=int, default=1,
                   help="run a policy that draws random numbers (model) with this many seeds "
                        "and report its mean tokens/s (each seed's in replay.json)")
    s.add_argument("--warm", action="store_true",
                   help="score every contender on its second pass over each workload, its policy "
                        "keeping what the first taught it (a server that has served the load "
                        "before, or one started warm); default: a cold start")
    s.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="score every contender on N passes over each workload in a row (after "
                        "the --warm pass), its policy keeping what each taught it: a paired "
                        "bench's rounds, each starting its requests together and draining at its "
                        "end (`bench serve --repeats 8` after its warm-up round: --warm --rounds 8)")
    s.add_argument("--after", default=None, metavar="WORKLOAD",
                   help="every contender first serves this workload (one of "
                        f"{', '.join(shapes())}), untimed, and is scored on the next: a server "
                        "whose load changed (e.g. --after c1 --workloads c32: what it learnt at "
                        "batch 1 meets batch 32); unset: every contender starts on the scored "
                        "workload")
    s.add_argument("--slow-start", default=None, metavar="FACTOR:STEPS",
                   help="each contender's first STEPS steps take FACTOR times their price (a host "
                        "busy at first: does a policy un-learn prices measured then?), e.g. 1.3:150 "
                        "(default: none, every step at its price)")
    s.add_argument("--families", default=None, metavar="NAME,...",
                   help="score only the recorded requests of these prompt families (e.g. code, to "
                        "match a served `bench` workload over the same prompts); default: every "
                        "family, interleaved")
    s.add_argument("--drift", default=None, metavar="SD:SECONDS",
                   help="the host's speed wanders: every step's time times exp(x(t)), x a "
                        "mean-reverting random walk of stationary sd SD and correlation time "
                        "SECONDS (seeded by --seed; the same over time for every contender), on "
                        "top of --noise, e.g. 0.1:10 (default: none, a steady host)")
    s.add_argument("--output-dir", type=Path, default=Path("results/replay"),
                   help="directory for replay.json and replay.png")
    s.set_defaults(func=run_score)


def _prompts(paths: list[Path], per_family: int):
    from vllm_vspec.bench.workloads import load_prompts
    from vllm_vspec.replay.record import Prompt

    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.glob("*.jsonl"))
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"--prompts {path}: no such file or directory")
    if not files:
        raise UserError(f"--prompts {' '.join(map(str, paths))}: no *.jsonl file there")
    return [Prompt(f"{f.stem}/{i}", f.stem, text)
            for f in files for i, text in enumerate(load_prompts(f)[:per_family])]


def run_record(args: argparse.Namespace) -> int:
    from vllm_vspec.replay.record import record

    for flag, value, lo in (("--requests-per-family", args.requests_per_family, 1),
                            ("--num-speculative-tokens", args.num_speculative_tokens, 1),
                            ("--output-len", args.output_len, 2)):
        if value < lo:
            raise UserError(f"{flag}={value} is not allowed: an integer >= {lo}")
    prompts = _prompts(args.prompts, args.requests_per_family)
    print(f"recording {len(prompts)} prompts, {args.method} K={args.num_speculative_tokens}, "
          f"{args.output_len} tokens each", flush=True)
    rec = record(args.method, prompts, k=args.num_speculative_tokens, output_len=args.output_len,
                 target=args.target, drafter=args.draft,
                 prompt_set=",".join(str(p) for p in args.prompts))
    rec.save(args.output)
    disagree = sum(len(r.disagree) for r in rec.requests)
    rates = ", ".join(f"{x:.2f}" for x in rec.mean_rates())
    print(f"{args.output}: {len(rec.requests)} requests, {sum(r.decode_len for r in rec.requests)} "
          f"decode positions, conditional acceptance per position {rates}; "
          f"{disagree} probe/stream disagreements; "
          f"{'with' if rec.missing_draft_probs is None else 'without'} draft probabilities; "
          f"{rec.header['seconds']} s")
    return 0


def run_costs(args: argparse.Namespace) -> int:
    from vllm_vspec.replay import costs
    from vllm_vspec.replay.recording import load
    from vllm_vspec.tools.profile_collect import host_description, int_list

    rec = load(args.recording)
    batches = int_list("--batch-sizes", args.batch_sizes, 1)
    if args.decode_steps < 2:
        raise UserError(f"--decode-steps={args.decode_steps} is not allowed: an integer >= 2")
    kept: list[dict] = []
    kept_note = ""
    if args.prefill_only:
        saved = costs.costs_paths(args.recording)[1]
        if not saved.is_file():
            raise UserError(f"--prefill-only: {saved} not found (run `vllm-vspec replay costs "
                            f"--recording {args.recording}` without it first)")
        doc = json.loads(saved.read_text())
        kept = [s for s in doc["samples"] if s["kind"] != "prefill"]
        kept_note = doc.get("note", "").split("; prefill steps")[0]
    h = rec.header
    prompt_len = round(sum(r.prompt_len for r in rec.requests) / len(rec.requests))
    started = time.time()
    drafter = Path(h["drafter"]) if h.get("drafter") else None
    if args.instances < 1:
        raise UserError(f"--instances={args.instances} is not allowed: an integer >= 1")
    samples = kept + costs.measure(h["method"], Path(h["target"]), drafter, rec.k, batches,
                                   prompt_len, 0 if args.prefill_only else args.decode_steps,
                                   args.instances)
    device = host_description()
    note = (f"measured by `vllm-vspec replay costs` on "
            f"{time.strftime('%Y-%m-%d', time.gmtime(started))}: {h['method']} K={rec.k}, "
            f"target {h['target']}, batches {args.batch_sizes}, prompts of {prompt_len} tokens, "
            f"float32, eager")
    if kept_note:
        note = f"{kept_note}; prefill steps {note.removeprefix('measured by ')}"
    profile = costs.fit(samples, name=f"replay-{h['method']}", device=device, note=note)
    rows = costs.residuals(profile, samples)
    prof_path, samples_path = costs.save(profile, samples, rows, args.recording,
                                         {"device": device, "note": note})
    print(costs.residual_text(rows))
    print(f"profile -> {prof_path}\nsamples and residuals -> {samples_path}")
    return 0


def _pair(option: str, text: str, kinds: tuple, ok, allowed: str) -> tuple:
    """An `A:B` option's value as (kinds[0](A), kinds[1](B)), refused naming
    the option unless both parse and `ok(a, b)`."""
    try:
        a, b = text.split(":")
        out = kinds[0](a), kinds[1](b)
    except ValueError:
        out = None
    if out is None or not ok(*out):
        raise UserError(f"{option}={text!r} is not allowed: {allowed}")
    return out


def _slow_start(text: str | None) -> tuple[float, int]:
    """`--slow-start FACTOR:STEPS` as (factor, steps); (1.0, 0) when not given."""
    if text is None:
        return 1.0, 0
    return _pair("--slow-start", text, (float, int), lambda f, n: f > 0 and n >= 0,
                 "FACTOR:STEPS, a factor > 0 and a whole number of steps >= 0 (e.g. 1.3:150)")


def _only_families(rec, text: str | None):
    """The recording with only the requests of the `--families` named (all when None)."""
    if text is None:
        return rec
    from vllm_vspec.replay.recording import Recording
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = rec.families()
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UserError(f"--families={text!r} is not allowed: a comma list of the recording's "
                        f"families ({', '.join(known)})")
    return Recording(rec.header, [r for r in rec.requests if r.family in names])


def _drift(text: str | None) -> tuple[float, float]:
    """`--drift SD:SECONDS` as (sd, seconds); (0.0, 0.0) when not given."""
    if text is None:
        return 0.0, 0.0
    return _pair("--drift", text, (float, float),
                 lambda sd, tau: sd >= 0 and tau > 0 and math.isfinite(sd) and math.isfinite(tau),
                 "SD:SECONDS, an sd >= 0 and a correlation time > 0 seconds (e.g. 0.1:10)")


def run_score(args: argparse.Namespace) -> int:
    from vllm_vspec.config import POLICIES
    from vllm_vspec.core.latency import load_profile
    from vllm_vspec.replay import score as sc
    from vllm_vspec.replay.costs import costs_paths
    from vllm_vspec.replay.recording import load

    rec = _only_families(load(args.recording), args.families)
    costs = args.costs or costs_paths(args.recording)[0]
    if not Path(costs).is_file():
        raise UserError(f"--costs {costs}: no such file (measure it with `vllm-vspec replay costs "
                        f"--recording {args.recording}`, or pass a latency profile)")
    profile = load_profile(costs)
    all_shapes = sc.shapes(args.requests_low, args.requests_high)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in names if w not in all_shapes]
    if bad or not names:
        raise UserError(f"--workloads={args.workloads!r} is not allowed: a comma list of "
                        f"{', '.join(all_shapes)}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    scorable = [p for p in POLICIES if p not in ("fixed", "cycle")]
    bad = [p for p in policies if p not in scorable]
    if bad:
        raise UserError(f"--policies={args.policies!r} is not allowed: a comma list of "
                        f"{', '.join(scorable)} (fixed gammas, target-only, the table and the "
                        f"oracles are always scored)")
    try:
        vspec = json.loads(args.vspec)
    except json.JSONDecodeError as exc:
        raise UserError(f"--vspec={args.vspec!r} is not allowed: a JSON object ({exc})") from None
    if args.after is not None and args.after not in all_shapes:
        raise UserError(f"--after={args.after!r} is not allowed: one of {', '.join(all_shapes)}")
    if args.rounds < 1:
        raise UserError(f"--rounds={args.rounds} is not allowed: an integer >= 1")
    if args.policy_seeds < 1:
        raise UserError(f"--policy-seeds={args.policy_seeds} is not allowed: an integer >= 1")
    if args.noise < 0:
        raise UserError(f"--noise={args.noise} is not allowed: a sigma >= 0")
    slow_start = _slow_start(args.slow_start)
    drift = _drift(args.drift)
    skipped = sc.unscorable(rec, policies)
    t0 = time.monotonic()
    tty = sys.stderr.isatty()       # a progress line only where it redraws in place
    results = sc.score(rec, profile, str(costs), [all_shapes[n] for n in names], policies=policies,
                       vspec=vspec, gamma0_mode=args.gamma0_mode, noise=args.noise, seed=args.seed,
                       policy_seeds=args.policy_seeds, warm=args.warm, rounds=args.rounds,
                       after=all_shapes[args.after] if args.after else None,
                       slow_start=slow_start, drift=drift,
                       progress=(lambda what: print(f"\r  scoring {what:<24}", end="",
                                                    file=sys.stderr, flush=True)) if tty else None)
    if tty:
        print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    seconds = time.monotonic() - t0
    h = rec.header
    print(f"replay of {args.recording} ({h['method']} K={rec.k}, {len(rec.requests)} requests), "
          f"costs {costs}, noise {args.noise}, seed {args.seed}"
          f"{', warm (second pass)' if args.warm else ''}"
          f"{f', {args.rounds} rounds' if args.rounds > 1 else ''}"
          f"{f', after {args.after}' if args.after else ''}"
          f"{f', slow start {args.slow_start}' if args.slow_start else ''}"
          f"{f', host drift {args.drift}' if args.drift else ''}"
          f"{f', families {args.families}' if args.families else ''}: {seconds:.1f} s\n")
    for name, why in skipped.items():
        print(f"{name}: not scored: {why}\n")
    print(sc.table_text(results))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = {"recording": str(args.recording), "costs": str(costs), "method": h["method"],
            "k": rec.k, "noise": args.noise, "seed": args.seed, "gamma0_mode": args.gamma0_mode,
            "policies": policies, "workloads": names, "vspec": vspec,
            "policy_seeds": args.policy_seeds, "warm": args.warm, "rounds": args.rounds,
            "after": args.after,
            "slow_start": list(slow_start) if args.slow_start else None,
            "drift": list(drift) if args.drift else None, "families": args.families,
            "not_scorable": skipped}
    (args.output_dir / "replay.json").write_text(json.dumps(sc.to_json(results, meta), indent=1) + "\n")
    sc.plot(results, args.output_dir / "replay.png")
    print(f"-> {args.output_dir / 'replay.json'}, {args.output_dir / 'replay.png'}")
    return 0
