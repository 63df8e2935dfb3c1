"""What a gamma-0 step costs, in-process: target-only against vspec at gamma 0.

    python -m vllm_vspec.bench.gamma0_overhead                 # batch 1 and 32, 5 rounds
    python -m vllm_vspec.bench.gamma0_overhead --rounds 1 --batch-sizes 1,4 \\
        --requests 2,4 --max-tokens 16                         # a quick check

Three engines, each in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so
no second process shares the cores), float32, greedy, `ignore_eos`:
- `target`: target-only, stock vLLM;
- `spec-path`: a draft-model vspec engine, `fixed` policy at gamma 0, on a
  worker whose runner has no plain-sampling part (`samples_plain` False,
  hosts/vllm/model_runner.py): every step goes through
  vLLM's speculative input path and rejection sampler with zero drafts (what
  stock vLLM's runner does at gamma 0);
- `plain-path`: the same engine on vspec's own worker: steps without drafts
  are sampled the plain way.
Every round builds the three one after the other (one engine alive at a
time), warms each up, then times every batch size: consecutive batches of B
requests that start together and run to completion. The table shows the
median tokens/s over rounds (range in brackets) and each vspec engine's
ratio to target-only; outputs are compared with target-only's. It measures
and asserts nothing; machines are noisy, so use several rounds on an idle
host and read the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from vllm_vspec.tools import engine_runs
from vllm_vspec.hosts.vllm.model_runner import VSpecCPUModelRunner, VSpecGPUModelRunner
from vllm_vspec.hosts.vllm.worker import (CPU_WORKER_CLS, GPU_WORKER_CLS, VSpecCPUWorker,
                                             VSpecGPUWorker)
from vllm_vspec.tools.profile_collect import int_list  # the same flag parsing as `profile`

ENGINES = ("target", "spec-path", "plain-path")
# This module's import path (not __name__, which is "__main__" under -m): the
# engine imports the baseline worker by it.
MODULE = "vllm_vspec.bench.gamma0_overhead"


class SpeculativePathCPUModelRunner(VSpecCPUModelRunner):
    """vspec's CPU runner without plain sampling (the baseline)."""

    samples_plain = False


class SpeculativePathGPUModelRunner(VSpecGPUModelRunner):
    """vspec's GPU runner without plain sampling (the baseline)."""

    samples_plain = False


class SpeculativePathCPUWorker(VSpecCPUWorker):
    runner_cls = SpeculativePathCPUModelRunner


class SpeculativePathGPUWorker(VSpecGPUWorker):
    runner_cls = SpeculativePathGPUModelRunner


def worker_classes() -> dict[str, str]:
    """Engine name -> worker class path on this platform (vspec engines)."""
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    baseline = SpeculativePathCPUWorker if cpu else SpeculativePathGPUWorker
    return {"spec-path": f"{MODULE}.{baseline.__name__}",
            "plain-path": CPU_WORKER_CLS if cpu else GPU_WORKER_CLS}


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch size: median tokens/s (and range) of every engine over the
    rounds, and each vspec engine's ratio of medians to target-only.
    `samples` holds one {"engine", "batch", "tok_s", "identical", "requests"}
    per engine, batch size and round."""
    rows = []
    for batch in sorted({s["batch"] for s in samples}):
        row: dict[str, Any] = {"batch": batch}
        for engine in ENGINES:
            mine = [s for s in samples if s["batch"] == batch and s["engine"] == engine]
            if not mine:
                continue
            tok_s = [s["tok_s"] for s in mine]
            row[engine] = {"median_tok_s": statistics.median(tok_s), "min_tok_s": min(tok_s),
                           "max_tok_s": max(tok_s), "rounds": len(tok_s),
                           "identical": sum(s["identical"] for s in mine),
                           "requests": sum(s["requests"] for s in mine)}
        base = row.get("target", {}).get("median_tok_s")
        for engine in ENGINES[1:]:
            if base and engine in row:
                row[engine]["x_target"] = row[engine]["median_tok_s"] / base
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as GitHub markdown: one line per batch size."""
    head = ("| batch | target tok/s | spec-path tok/s | plain-path tok/s | "
            "spec-path x target | plain-path x target | identical |\n"
            "|---:|---:|---:|---:|---:|---:|---:|\n")
    lines = []
    for row in rows:
        cells = [str(row["batch"])]
        for engine in ENGINES:
            e = row.get(engine)
            cells.append("-" if e is None else
                         f"{e['median_tok_s']:.1f} ({e['min_tok_s']:.1f}-{e['max_tok_s']:.1f})")
        for engine in ENGINES[1:]:
            ratio = row.get(engine, {}).get("x_target")
            cells.append("-" if ratio is None else f"{ratio:.3f}x")
        same = [(row[e]["identical"], row[e]["requests"]) for e in ENGINES[1:] if e in row]
        cells.append(", ".join(f"{i}/{n}" for i, n in same) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def measure_round(args: argparse.Namespace, engine: str, prompts: dict[int, list[str]],
                  reference: dict[int, list[list[int]]]) -> list[dict[str, Any]]:
    """Build `engine`, warm it up, time every batch size, shut it down."""
    if engine == "target":
        variant, overrides = engine_runs.Variant("target"), {}
    else:
        variant = engine_runs.vspec_variant(
            engine, args.draft, args.max_gamma, policy="fixed", fixed_gamma=0, min_gamma=0,
            gamma0_mode=args.gamma0_mode)
        overrides = {"worker_cls": worker_classes()[engine]}
    llm = engine_runs.build_llm(args.target, variant, "float32", max(prompts), **overrides)
    try:
        engine_runs.run_batches(llm, prompts[min(prompts)][:2], 2, 8)  # warm-up
        out = []
        for batch, chunk in prompts.items():
            run = engine_runs.run_batches(llm, chunk, batch, args.max_tokens)
            if engine == "target":
                reference.setdefault(batch, run.token_ids)
            same = engine_runs.count_identical(run.token_ids, reference.get(batch, []))
            out.append({"engine": engine, "batch": batch, "tok_s": run.tokens_per_second,
                        "seconds": run.seconds, "tokens": run.num_tokens,
                        "requests": len(chunk), "identical": same})
        return out
    finally:
        engine_runs.shutdown_llm(llm)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description=__doc__,
        formatter_class=type("F", (argparse.RawDescriptionHelpFormatter,
                                   argparse.ArgumentDefaultsHelpFormatter), {}))
    p.add_argument("--target", type=Path, default=engine_runs.DEFAULT_TARGET,
                   help="target model directory")
    p.add_argument("--draft", type=Path, default=engine_runs.DEFAULT_DRAFT,
                   help="draft model directory (method draft_model)")
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated B")
    p.add_argument("--requests", default="8,64",
                   help="requests per batch size (one count per --batch-sizes entry), "
                        "rounded up to whole batches")
    p.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds (target, spec-path, plain-path, target, ...)")
    p.add_argument("--max-gamma", type=int, default=4,
                   help="num_speculative_tokens of the vspec engines (buffers; gamma stays 0)")
    p.add_argument("--gamma0-mode", choices=("lazy", "sync"), default="lazy",
                   help="the vspec engines' gamma0_mode: lazy skips the draft forward, "
                        "sync runs it over every step's tokens")
    p.add_argument("--out", type=Path, default=Path("results/gamma0-overhead.json"),
                   help="results JSON (the table is printed and also written next to it as .md)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = int_list("--batch-sizes", args.batch_sizes, 1)
    counts = int_list("--requests", args.requests, 1)
    if len(counts) != len(sizes):
        raise SystemExit(f"--requests={args.requests!r} is not allowed: one count per "
                         f"--batch-sizes entry ({len(sizes)})")
    if args.rounds < 1 or args.max_tokens < 1:
        raise SystemExit(f"--rounds={args.rounds} / --max-tokens={args.max_tokens} are not "
                         "allowed: integers >= 1")
    # One process: the engine core steps in this one, as in a timed profile.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    pool = engine_runs.load_prompts(engine_runs.DEFAULT_PROMPT_FILES)
    prompts = {b: engine_runs.prompts_for_batch(pool, b, n) for b, n in zip(sizes, counts)}
    reference: dict[int, list[list[int]]] = {}
    samples: list[dict[str, Any]] = []
    started = time.time()
    for r in range(args.rounds):
        for engine in ENGINES:
            print(f"round {r + 1}/{args.rounds}: {engine}", flush=True)
            for s in measure_round(args, engine, prompts, reference):
                samples.append({**s, "round": r})
    rows = summarize(samples)
    text = table(rows)
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join([f"python -m {MODULE}", *(sys.argv[1:] if argv is None else argv)]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "table": rows, "samples": samples}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(f"results -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
