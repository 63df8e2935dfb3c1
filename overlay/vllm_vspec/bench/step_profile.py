"""Where a step's time goes: cProfile one in-process engine, then compare two.

    python -m vllm_vspec.bench.step_profile run target --batch 32 --requests 32 \\
        --out results/prof/target-b32.prof
    python -m vllm_vspec.bench.step_profile run vspec-0 --batch 32 --requests 32 \\
        --out results/prof/vspec0-b32.prof
    python -m vllm_vspec.bench.step_profile compare results/prof/target-b32.prof \\
        results/prof/vspec0-b32.prof

`run` builds one engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
float32, greedy, `ignore_eos`, the bundled deep target), warms it up, runs
the requests twice unprofiled (printing tokens/s), then once under cProfile
and writes the stats. Engines: `target` (target-only), `stock-K` (stock
draft_model, num_speculative_tokens K), `vspec-G` (a vspec draft_model
engine on vspec's worker, policy fixed at gamma G, K = 4 as in the bench's
vspec-fixed-G unless --k is given). Run it under the engine lock on a
shared host.

`compare A B` lists the functions whose CALL COUNTS differ between the two
profiles (what B does that A does not, or more often), largest cumulative
difference first. Call counts are exact whatever the host's load; the
times are cProfile's (inflated for small Python calls, and noisy on a
shared host): read them as where the extra calls are, not as a speed.

`steps A,B,...` times every engine step, unprofiled, of several engines
built side by side in this process and run in interleaved rounds (A, B, C,
then C, B, A, ...), and prints per engine the median decode step (steps
after the first three and before the last two of each round: the prefill
and ramp are out) and the median round, each with its ratio to the first
engine; `--out` writes them as JSON. One process and one memory state for
all engines, rounds seconds apart: it resolves a few tenths of a
millisecond per step, which served pairs on a 2-core host do not (their
rounds scatter by 5-10%). What a step costs here is what it costs after the
forward pass has evicted the CPU caches: vspec's per-step bookkeeping
measured this way costs 10-50x what the same calls cost timed alone
(docs/log/benchmarks.md, "Where a vspec step's time goes").

    python -m vllm_vspec.bench.step_profile steps target,eagle-vspec-0,vspec-0 \
        --rounds 8 --batch 32 --out results/steps-b32.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _variant(name: str, k: int | None):
    from vllm_vspec.tools import engine_runs as er

    if name == "target":
        return er.Variant("target"), {}
    kind, _, value = name.rpartition("-")
    drafters = {"stock": ("draft_model", er.DEFAULT_DRAFT), "vspec": ("draft_model", er.DEFAULT_DRAFT),
                "eagle-stock": ("eagle", er.DEFAULT_EAGLE), "eagle-vspec": ("eagle", er.DEFAULT_EAGLE)}
    if kind not in drafters or not value.isdigit():
        raise SystemExit(f"engine {name!r} is not known: target, stock-K, vspec-G, "
                         f"eagle-stock-K or eagle-vspec-G")
    method, drafter = drafters[kind]
    if kind.endswith("stock"):
        return er.Variant(name, {"method": method, "model": str(drafter),
                                 "num_speculative_tokens": int(value)}), {}
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS, GPU_WORKER_CLS
    from vllm.platforms import current_platform

    worker = CPU_WORKER_CLS if current_platform.is_cpu() else GPU_WORKER_CLS
    return (er.vspec_variant(name, drafter, k or 4, method=method,
                             policy="fixed", fixed_gamma=int(value), min_gamma=0),
            {"worker_cls": worker})


def run(args: argparse.Namespace) -> int:
    import cProfile

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm_vspec.tools import engine_runs as er

    pool = er.load_prompts(er.DEFAULT_PROMPT_FILES)
    prompts = er.prompts_for_batch(pool, args.batch, args.requests)
    variant, overrides = _variant(args.engine, args.k)
    llm = er.build_llm(er.DEFAULT_TARGET, variant, "float32", args.batch, **overrides)
    try:
        er.run_batches(llm, prompts[:2], 2, 8)   # warm-up
        speeds = [er.run_batches(llm, prompts, args.batch, args.max_tokens).tokens_per_second
                  for _ in range(2)]
        prof = cProfile.Profile()
        prof.enable()
        er.run_batches(llm, prompts, args.batch, args.max_tokens)
        prof.disable()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(args.out))
    finally:
        er.shutdown_llm(llm)
    print(f"{args.engine} batch {args.batch}: {', '.join(f'{s:.1f}' for s in speeds)} tok/s "
          f"(unprofiled); profile -> {args.out}")
    return 0


def _timed_round(llm, prompts, params) -> list[float]:
    """Seconds of every engine step of one round (all `prompts` at once)."""
    import time

    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"steps-{time.monotonic_ns()}-{i}", prompt, params)
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return times


# The first steps of a round carry the prefill and the last ones the tail of
# finishing requests; the decode steps between them are what a pair compares.
HEAD_STEPS, TAIL_STEPS = 3, 2


def summarize_steps(rounds: dict[str, list[list[float]]]) -> list[dict]:
    """Per engine (in the given order), from its rounds of step times: the
    median decode step and the median round, each as a ratio to the first
    engine's."""
    import statistics

    rows = []
    for name, runs in rounds.items():
        decode = [t for r in runs for t in r[HEAD_STEPS:len(r) - TAIL_STEPS]]
        rows.append({"engine": name, "rounds": len(runs),
                     "steps_per_round": statistics.median(len(r) for r in runs),
                     "decode_step_ms": 1e3 * statistics.median(decode),
                     "round_s": statistics.median(sum(r) for r in runs)})
    for row in rows:
        row["decode_step_ratio"] = row["decode_step_ms"] / rows[0]["decode_step_ms"]
        row["round_ratio"] = row["round_s"] / rows[0]["round_s"]
    return rows


def format_steps(rows: list[dict]) -> list[str]:
    first = rows[0]["engine"]
    lines = [f"| engine | rounds | steps a round | decode step (ms) | x {first} | round (s) | x {first} |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['engine']} | {r['rounds']} | {r['steps_per_round']:g} | "
              f"{r['decode_step_ms']:.3f} | {r['decode_step_ratio']:.4f} | {r['round_s']:.3f} | "
              f"{r['round_ratio']:.4f} |" for r in rows]
    return lines


def steps(args: argparse.Namespace) -> int:
    import json

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm_vspec.tools import engine_runs as er

    names = args.engines.split(",")
    if len(set(names)) != len(names) or len(names) < 2:
        raise SystemExit(f"steps: give two or more distinct engines, got {args.engines!r}")
    pool = er.load_prompts(er.DEFAULT_PROMPT_FILES)
    prompts = er.prompts_for_batch(pool, args.batch, args.batch)
    params = er.greedy_params(args.max_tokens)
    llms = {}
    rounds: dict[str, list[list[float]]] = {n: [] for n in names}
    try:
        for name in names:
            variant, overrides = _variant(name, args.k)
            llms[name] = er.build_llm(er.DEFAULT_TARGET, variant, "float32", args.batch,
                                      **overrides)
            for _ in range(2):   # warm-up: first shapes, allocator growth, prefix cache
                _timed_round(llms[name], prompts, params)
        for i in range(args.rounds):
            for name in (names if i % 2 == 0 else names[::-1]):
                rounds[name].append(_timed_round(llms[name], prompts, params))
                print(f"round {i + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
    finally:
        for llm in llms.values():
            er.shutdown_llm(llm)
    rows = summarize_steps(rounds)
    print(f"batch {args.batch}, {args.max_tokens} tokens a request, {args.rounds} interleaved "
          f"rounds, medians:")
    print("\n".join(format_steps(rows)))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"batch": args.batch, "max_tokens": args.max_tokens,
                                        "engines": rows, "step_seconds": rounds}, indent=1))
        print(f"-> {args.out}")
    return 0


def _load(path: Path) -> dict[tuple[str, int, str], tuple[int, float, float]]:
    import pstats

    out = {}
    for (f, line, name), (_cc, calls, tt, ct, _callers) in pstats.Stats(str(path)).stats.items():
        short = f.split("site-packages/")[-1].split("overlay/")[-1]
        out[(short, line, name)] = (calls, tt, ct)
    return out


def compare(a: Path, b: Path, limit: int = 60) -> list[str]:
    """Lines for the functions whose call counts differ between profiles."""
    pa, pb = _load(a), _load(b)
    rows = []
    for key in pa.keys() | pb.keys():
        na, _, ca = pa.get(key, (0, 0.0, 0.0))
        nb, _, cb = pb.get(key, (0, 0.0, 0.0))
        if na != nb:
            rows.append((cb - ca, key, na, nb, ca, cb))
    rows.sort(key=lambda r: -abs(r[0]))
    return [f"{d:+9.4f} s  {f}:{line}:{name}  calls {na} -> {nb}  cum {ca:.4f} -> {cb:.4f} s"
            for d, (f, line, name), na, nb, ca, cb in rows[:limit]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_vspec.bench.step_profile",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="profile one engine")
    r.add_argument("engine", help="target, stock-K, vspec-G, eagle-stock-K or eagle-vspec-G")
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--requests", type=int, default=32)
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--k", type=int, default=None,
                   help="num_speculative_tokens of a vspec engine (default 4)")
    r.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("steps", help="decode-step times of engines side by side")
    t.add_argument("engines", help="comma-separated: target, stock-K, vspec-G, eagle-stock-K, eagle-vspec-G; "
                                   "ratios are to the first")
    t.add_argument("--rounds", type=int, default=8)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--max-tokens", type=int, default=64)
    t.add_argument("--k", type=int, default=None,
                   help="num_speculative_tokens of a vspec engine (default 4)")
    t.add_argument("--out", type=Path, default=None, help="JSON results file")
    c = sub.add_parser("compare", help="call-count differences of two profiles")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--limit", type=int, default=60)
    args = p.parse_args(argv)
    if args.cmd == "run":
        return run(args)
    if args.cmd == "steps":
        return steps(args)
    print("\n".join(compare(args.a, args.b, args.limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
