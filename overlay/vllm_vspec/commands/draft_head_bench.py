"""`vllm-vspec bench draft-head`: draft time and acceptance of the draft LM head options.

Prompts: the bundled code and prose prompts, alternately to collecting and
to measuring within each file (so both halves hold both kinds of text),
`--num-prompts` each.

1. Collect: the target's argmax on the collect prompts, two ways, counted
   together: one engine (fixed gamma K) generates for them with
   `target_argmax_trace_path` on (the committed greedy tokens, what
   `vllm-vspec trace active-vocab` reads), and, with `--prompt-argmax` (the
   default), a target-only engine reports its argmax at every prompt
   position (vLLM's prompt logprobs, rank 1): far more contexts than the
   tiny models' repetitive outputs. Active vocabularies of each
   `--fractions` of the vocabulary are built from those counts (specials,
   then by frequency); a list the counts cannot fill is completed with ids
   never seen, smallest first (active_vocab.build_ids' fill), and the
   results say how many.
2. Measure, on the held-out prompts: one engine per variant (full head in the
   model dtype, each active vocabulary, w8a16, w8a8, and the smallest
   vocabulary with w8a8), fixed gamma K, greedy, `--rounds` interleaved
   rounds of all variants. Per variant: vLLM's acceptance counters (mean
   accepted length, per-position acceptance; the same every round, the
   outputs being greedy), the drafter's wall time per step (median of
   `draft_ms` from the draft trace over all rounds, device synchronised, and
   each round's median), whether the outputs equal the full head's (they
   must, strict acceptance), and the head alone: logits + argmax for 1 and
   16 hidden states on this host's CPU (microseconds, median).

Prints a table and writes the results JSON (`-o`). Numbers on a busy host
are noisy: the head microbenchmark is the steadier one.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
MODELS = REPO / "models"


def _variants(fractions: list[float]) -> list[tuple[str, float | None, str]]:
    """(label, vocabulary fraction or None, quantization)."""
    out: list[tuple[str, float | None, str]] = [("full", None, "none")]
    out += [(f"active {f:.0%}", f, "none") for f in fractions]
    out += [("w8a16", None, "w8a16"), ("w8a8", None, "w8a8")]
    if fractions:
        out.append((f"active {min(fractions):.0%} + w8a8", min(fractions), "w8a8"))
    return out


def head_microbench(head, hidden_size: int, batch: int, dtype, repeats: int = 200) -> float:
    """Median microseconds of one greedy head call for `batch` hidden states."""
    import torch

    from vllm_vspec.kernels.draft_head import DraftHead

    x = torch.randn(batch, hidden_size, dtype=dtype)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits, ids = head(x)
        DraftHead.to_full_ids(logits.argmax(-1), ids)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _head_fn(weight, ids, quant: str):
    """A callable hidden -> (logits, ids) for one variant (the full float
    head is a plain matmul, as the host's compute_logits)."""
    import torch

    from vllm_vspec.kernels.draft_head import DraftHead

    if ids is None and quant == "none":
        return lambda x: (torch.nn.functional.linear(x, weight), None)
    head = DraftHead(weight, active_ids=ids, quantization=quant)
    return lambda x: head.logits(x, restricted=True)


PROMPT_FILES = (MODELS / "prompts" / "code.jsonl", MODELS / "prompts" / "prose.jsonl")


def split_prompts(n: int) -> tuple[list[str], list[str]]:
    """(collect, held out): alternate prompts of each file, the files
    interleaved, `n` each."""
    from vllm_vspec.tools import engine_runs

    per_file = [engine_runs.load_prompts([f]) for f in PROMPT_FILES]

    def mix(lists: list[list[str]]) -> list[str]:
        return [p for group in zip(*lists) for p in group]

    return mix([p[0::2] for p in per_file])[:n], mix([p[1::2] for p in per_file])[:n]


def prompt_argmax_counts(llm, prompts: list[str]) -> collections.Counter:
    """Token id -> how often it is the target's argmax at a position of
    `prompts` (every position after the first: vLLM's prompt logprobs)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    counts: collections.Counter = collections.Counter()
    for out in llm.generate(prompts, params, use_tqdm=False):
        for position in out.prompt_logprobs or []:
            if position:   # None at the first position
                counts[next(t for t, lp in position.items() if lp.rank == 1)] += 1
    return counts


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from vllm_vspec.core import active_vocab
    from vllm_vspec.tools.drafters import special_ids_of
    from vllm_vspec.tools import traces
    from vllm_vspec.tools import engine_runs

    out_dir = Path(args.output).with_suffix("")
    out_dir.mkdir(parents=True, exist_ok=True)
    collect, held_out = split_prompts(args.num_prompts)
    k = args.num_speculative_tokens
    spec = {"method": args.method, "model": str(args.draft), "num_speculative_tokens": k}
    fixed = {"policy": "fixed", "min_gamma": k}

    def engine(vspec: dict | None, speculative: bool = True):
        v = engine_runs.Variant("x", spec if speculative else None,
                                {**fixed, **vspec} if speculative else None)
        # In-process (uni executor): the collect step reads the drafter's head.
        return engine_runs.build_llm(args.target, v, args.dtype, args.batch,
                                     distributed_executor_backend="uni")

    argmax = out_dir / "argmax.jsonl"
    argmax.unlink(missing_ok=True)
    llm = engine({"target_argmax_trace_path": str(argmax)})
    try:
        engine_runs.run_batches(llm, collect, args.batch, args.max_tokens)
        weight = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
            .model_runner.drafter.model.lm_head.weight.detach().clone()
    finally:
        engine_runs.shutdown_llm(llm)
    generated = traces.greedy_token_counts(argmax)
    positions: collections.Counter = collections.Counter()
    if args.prompt_argmax:
        llm = engine(None, speculative=False)
        try:
            positions = prompt_argmax_counts(llm, collect)
        finally:
            engine_runs.shutdown_llm(llm)
    counts = generated + positions
    vocab = weight.shape[0]
    specials = special_ids_of(str(args.target))
    id_files: dict[float, tuple[Path, list[int], int]] = {}
    for f in args.fractions:
        ids = active_vocab.build_ids(counts, specials, round(f * vocab), fill_from=vocab)
        path = out_dir / f"active-vocab-{round(f * 100)}.json"
        active_vocab.write_ids(path, ids, specials, vocab, sum(counts.values()), str(argmax))
        unseen = sum(1 for i in ids if i not in counts and i not in specials)
        id_files[f] = (path, ids, unseen)

    variants = _variants(args.fractions)
    results: list[dict[str, Any]] = [{"ms": [], "round_ms": []} for _ in variants]
    reference: list[list[int]] | None = None
    for rnd in range(args.rounds):
        for n, (label, frac, quant) in enumerate(variants):
            trace = out_dir / f"draft-{n}-r{rnd}.jsonl"
            trace.unlink(missing_ok=True)
            vspec: dict[str, Any] = {"draft_trace_path": str(trace)}
            if frac is not None:
                vspec["draft_active_vocab_ids"] = str(id_files[frac][0])
            if quant != "none":
                vspec["draft_lm_head_quantization"] = quant
            llm = engine(vspec)
            try:
                result = engine_runs.run_batches(llm, held_out, args.batch, args.max_tokens)
            finally:
                engine_runs.shutdown_llm(llm)
            if reference is None:
                reference = result.token_ids
            ms = [rec["draft_ms"] for rec in traces.read_jsonl(trace) if rec["gamma"] > 0]
            acc = results[n]
            acc["ms"] += ms
            acc["round_ms"].append(round(statistics.median(ms), 3) if ms else None)
            acc.setdefault("spec", result.spec)
            acc["identical"] = acc.get("identical", True) and result.token_ids == reference

    rows: list[dict[str, Any]] = []
    for (label, frac, quant), acc in zip(variants, results):
        ids = None if frac is None else torch.tensor(id_files[frac][1])
        fn = _head_fn(weight, ids, quant)
        rows.append({
            "variant": label, "ids": vocab if frac is None else len(id_files[frac][1]),
            "unseen_ids": 0 if frac is None else id_files[frac][2],
            "quantization": quant,
            "mean_accepted_length": round(acc["spec"].mean_accepted_length or 0, 3),
            "acceptance_per_position": [round(a, 3) for a in acc["spec"].acceptance_per_position],
            "draft_ms_median": round(statistics.median(acc["ms"]), 3) if acc["ms"] else None,
            "draft_ms_round_medians": acc["round_ms"],
            "head_us_b1": round(head_microbench(fn, weight.shape[1], 1, weight.dtype), 1),
            "head_us_b16": round(head_microbench(fn, weight.shape[1], 16, weight.dtype), 1),
            "identical_to_full": acc["identical"],
        })
    return {"method": args.method, "target": str(args.target), "draft": str(args.draft),
            "k": args.num_speculative_tokens, "batch": args.batch, "max_tokens": args.max_tokens,
            "rounds": args.rounds, "prompts_collect": len(collect),
            "prompts_measured": len(held_out), "dtype": args.dtype,
            "collected_greedy_tokens": sum(generated.values()),
            "collected_prompt_positions": sum(positions.values()),
            "distinct_collected_ids": len(counts), "rows": rows,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['method']} K={result['k']} batch {result['batch']} {result['dtype']}, "
          f"{result['prompts_measured']} held-out prompts x {result['max_tokens']} tokens, "
          f"{result['rounds']} round(s) (vocabularies from {result['collected_greedy_tokens']} "
          f"greedy tokens and {result['collected_prompt_positions']} prompt positions, "
          f"{result['distinct_collected_ids']} distinct ids)")
    print(f"{'variant':<20} {'ids':>5} {'unseen':>6} {'acc.len':>7} {'per position':<28} "
          f"{'draft ms':>8} {'head us b1':>10} {'head us b16':>11} {'exact':>5}")
    for r in result["rows"]:
        pos = " ".join(f"{a:.2f}" for a in r["acceptance_per_position"])
        print(f"{r['variant']:<20} {r['ids']:>5} {r['unseen_ids']:>6} "
              f"{r['mean_accepted_length']:>7.3f} {pos:<28} "
              f"{r['draft_ms_median'] or 0:>8.2f} {r['head_us_b1']:>10.1f} "
              f"{r['head_us_b16']:>11.1f} {'yes' if r['identical_to_full'] else 'NO':>5}")


def add_parser(actions: argparse._SubParsersAction) -> None:
    """`bench`'s action `draft-head`."""
    from vllm_vspec.cli import HelpFormatter
    from vllm_vspec.commands import vocabulary

    p = actions.add_parser("draft-head", formatter_class=HelpFormatter,
                              description=__doc__,
                              help="measure draft time and acceptance of the draft LM head options")
    p.add_argument("--method", choices=("eagle", "draft_model"), default="eagle")
    p.add_argument("--target", type=Path, default=MODELS / "tiny-target")
    p.add_argument("--draft", type=Path, default=None,
                   help="drafter (default: models/tiny-eagle for eagle, models/tiny-draft)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                   help="K, drafted every step (fixed gamma)")
    vocabulary.deprecated(p, "--k", "--num-speculative-tokens", dest="num_speculative_tokens",
                          type=int, metavar="K")
    p.add_argument("--num-prompts", type=int, default=16, metavar="N",
                   help="prompts to collect on and to measure, each (at most 48)")
    vocabulary.deprecated(p, "--prompts", "--num-prompts", dest="num_prompts", type=int,
                          metavar="N")
    p.add_argument("--prompt-argmax", action=argparse.BooleanOptionalAction, default=True,
                   help="also count the target's argmax at every collect prompt position")
    p.add_argument("--rounds", type=int, default=1,
                   help="interleaved rounds of all variants (draft time over all rounds)")
    p.add_argument("--batch", type=int, default=8, help="requests per batch")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", help="model dtype (float32, bfloat16)")
    p.add_argument("--fractions", type=float, nargs="*", default=[0.25, 0.5],
                   help="active vocabulary sizes as fractions of the vocabulary")
    p.add_argument("-o", "--output", default="results/draft-head/result.json",
                   help="results JSON; traces and ids files go next to it")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of a table")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import os

    # The engine core in this process (an explicit setting wins).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if args.draft is None:
        args.draft = MODELS / ("tiny-eagle" if args.method == "eagle" else "tiny-draft")
    result = run(args)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
        print(f"wrote {args.output}")
    return 0 if all(r["identical_to_full"] for r in result["rows"]) else 1


__all__ = ["run", "print_table", "head_microbench"]
