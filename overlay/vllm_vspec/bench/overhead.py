"""The overhead variant set (`vllm-vspec bench serve --variants overhead`).

Turning vspec on must cost nothing by itself: a vspec server held at gamma g
must run as fast as the stock server it stands in for. The set serves, side
by side in the same rounds, each vspec server and its stock counterpart:

- target-only (stock) vs vspec `fixed-0` (gamma 0 every step, K = MAX_GAMMA);
- stock `fixed-g` (num_speculative_tokens g) vs vspec `vspec-fixed-g` (the
  vspec server of the defaults, K = MAX_GAMMA, policy `fixed` at gamma g),
  g = 1..OVERHEAD_GAMMAS, for the draft model and, when its drafter exists,
  for every other method of variants.METHOD_PREFIXES (EAGLE: `eagle-fixed-g`
  vs `eagle-vspec-fixed-g`, its gamma-0 pair `target` vs `eagle-fixed-0`;
  EAGLE-3 `eagle3-*`; MTP `mtp-*` when the target has MTP layers);

and reports each pair's ratio (vspec / stock, of the medians over rounds)
per workload. With `bench --paired` the two servers of a pair are up at
once and take turns in every round (bench/runner.run_paired); the pair's
ratio is then the median of its per-round ratios, and their spread shows
whether a gap is beyond the round-to-round noise. The default workloads of
the set are steady concurrency 1 and 32 (`steady-c1-*`, `steady-c32-*`).

`bench --pair MEASURED/COMPARATOR` pairs any two variants the same way, the
comparator chosen before the run (e.g. `model/fixed-2`: the default
controller against the fixed gamma replay found best); such a pair keeps up
at PAIR_TARGET_RATIO. Pure functions: unit-tested without a server
(tests/unit/test_bench.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from vllm_vspec.bench.variants import MAX_GAMMA, METHOD_PREFIXES, Variant, speculative_config

# The name `--variants` takes for the whole set.
SET_NAME = "overhead"
# Fixed gammas paired with stock draft_model / EAGLE servers of the same K.
OVERHEAD_GAMMAS = 3
# A pair whose vspec server reaches this ratio of its stock twin counts as costing nothing.
TARGET_RATIO = 0.99
# A `--pair` variant reaching this ratio of its comparator counts as keeping up with it.
PAIR_TARGET_RATIO = 0.98


@dataclass(frozen=True)
class Pair:
    stock: str   # variant name of the stock server (a `--pair`'s comparator)
    vspec: str   # variant name of the vspec server standing in for it (a `--pair`'s measured one)
    target: float = TARGET_RATIO   # the median ratio vspec / stock that meets the pair's target

    @property
    def label(self) -> str:
        return f"{self.vspec} / {self.stock}"


def parse_pair(text: str, available: Iterable[str]) -> Pair:
    """`--pair MEASURED/COMPARATOR` as a Pair of two variants that exist
    here; ValueError naming the value and what is allowed otherwise."""
    names = set(available)
    parts = [p.strip() for p in text.split("/")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--pair {text!r}: expected MEASURED/COMPARATOR, two variant names "
                         "joined by '/', e.g. model/fixed-2")
    measured, comparator = parts
    unknown = [n for n in parts if n not in names]
    if unknown:
        raise ValueError(f"--pair {text!r}: no variant {', '.join(unknown)} here; choose from "
                         + ", ".join(sorted(names)))
    if measured == comparator:
        raise ValueError(f"--pair {text!r}: a variant cannot be its own comparator")
    return Pair(stock=comparator, vspec=measured, target=PAIR_TARGET_RATIO)


def vspec_fixed_variants(drafters: dict[str, Path | None]) -> list[Variant]:
    """vspec servers at a fixed gamma 1..OVERHEAD_GAMMAS for every available
    drafter: the defaults' server (K = MAX_GAMMA) with policy `fixed`.
    Family "vspec-fixed": never a "best fixed" choice of the report."""
    out = []
    for method, model in drafters.items():
        if model is None:
            continue
        prefix = METHOD_PREFIXES[method]
        out += [Variant(f"{prefix}vspec-fixed-{g}", "vspec-fixed",
                        speculative_config(method, model, MAX_GAMMA),
                        vspec={"policy": "fixed", "fixed_gamma": g, "min_gamma": 0}, gamma=g)
                for g in range(1, OVERHEAD_GAMMAS + 1)]
    return out


def pairs(available: Iterable[str]) -> list[Pair]:
    """The set's (stock, vspec) pairs whose two variants both exist."""
    names = set(available)
    out = []
    for prefix in METHOD_PREFIXES.values():
        candidates = [Pair("target", f"{prefix}fixed-0")]
        candidates += [Pair(f"{prefix}fixed-{g}", f"{prefix}vspec-fixed-{g}")
                       for g in range(1, OVERHEAD_GAMMAS + 1)]
        out += [p for p in candidates if p.stock in names and p.vspec in names]
    return out


def variant_names(available: Iterable[str]) -> list[str]:
    """Every variant of the set that exists here, each once, stock first
    within a pair (so the rounds interleave each pair's two servers)."""
    return list(dict.fromkeys(n for p in pairs(available) for n in (p.stock, p.vspec)))


def expand(names: list[str], available: Iterable[str]) -> list[str]:
    """`--variants` names with SET_NAME replaced by the set's variants."""
    out: list[str] = []
    for n in names:
        out += variant_names(available) if n == SET_NAME else [n]
    return list(dict.fromkeys(out))


def default_workloads(workload_names: Iterable[str]) -> list[str]:
    """The set's workloads among those built: steady at concurrency 1 and 32."""
    return [w for w in workload_names if w.startswith(("steady-c1-", "steady-c32-"))]


def ratios(table_rows) -> list[dict]:
    """Per workload and pair: both servers' median tokens/s, the ratio
    vspec / stock and whether it meets TARGET_RATIO. `table_rows` are
    report.Row (median tokens/s over rounds per workload and variant)."""
    speed: dict[tuple[str, str], float] = {}
    rounds: dict[tuple[str, str], int] = {}
    for r in table_rows:
        speed[(r.workload, r.variant)] = r.tokens_per_s
        rounds[(r.workload, r.variant)] = len(r.rounds_tokens_per_s) or 1
    out = []
    for workload in dict.fromkeys(r.workload for r in table_rows):
        present = [v for (w, v) in speed if w == workload]
        for p in pairs(present):
            stock, vspec = speed[(workload, p.stock)], speed[(workload, p.vspec)]
            ratio = vspec / stock if stock > 0 else None
            out.append({"workload": workload, "stock": p.stock, "vspec": p.vspec,
                        "stock_tok_s": stock, "vspec_tok_s": vspec, "ratio": ratio,
                        "rounds": min(rounds[(workload, p.stock)], rounds[(workload, p.vspec)]),
                        "target": p.target,
                        "meets_target": ratio is not None and ratio >= p.target - 1e-9})
    return out


def paired_ratios(runs, pairs: Iterable[Pair] = ()) -> list[dict]:
    """Per pair and workload of a paired run (`bench --paired`): the ratio
    vspec / stock of each round (two runs seconds apart on the same two
    servers), their median, lowest and highest, and whether the median
    meets the pair's target (that of `pairs` with the same label, else
    TARGET_RATIO). `runs` are report.Run with `pair` set; rounds where
    either server made no tokens are left out."""
    targets = {p.label: p.target for p in pairs}
    speed: dict[tuple[str, str, str, int], float] = {}
    for r in runs:
        if r.pair is not None:
            speed[(r.pair, r.workload, r.variant, r.repeat)] = r.tokens_per_s
    out = []
    for label in dict.fromkeys(r.pair for r in runs if r.pair is not None):
        vspec, stock = label.split(" / ")
        for workload in dict.fromkeys(r.workload for r in runs if r.pair == label):
            per_round = []
            for repeat in sorted({k[3] for k in speed if k[:2] == (label, workload)}):
                s = speed.get((label, workload, stock, repeat), 0.0)
                v = speed.get((label, workload, vspec, repeat), 0.0)
                if s > 0 and v > 0:
                    per_round.append(v / s)
            if not per_round:
                continue
            median = statistics.median(per_round)
            target = targets.get(label, TARGET_RATIO)
            out.append({"workload": workload, "stock": stock, "vspec": vspec,
                        "round_ratios": per_round, "ratio": median,
                        "low": min(per_round), "high": max(per_round),
                        "rounds": len(per_round), "target": target,
                        "meets_target": median >= target - 1e-9})
    return out


def paired_ratio_table(runs, pairs: Iterable[Pair] = ()) -> str:
    """paired_ratios as GitHub markdown (empty when nothing was paired)."""
    got = paired_ratios(runs, pairs)
    if not got:
        return ""
    return _markdown(("rounds", "median ratio", "lowest", "highest"), got, lambda r: (
        str(r["rounds"]), f"{r['ratio']:.3f}x", f"{r['low']:.3f}x", f"{r['high']:.3f}x"))


def ratio_table(table_rows) -> str:
    """The pairs as GitHub markdown (empty when no pair ran)."""
    got = ratios(table_rows)
    if not got:
        return ""
    return _markdown(("stock tok/s", "vspec tok/s", "ratio"), got, lambda r: (
        f"{r['stock_tok_s']:.1f}", f"{r['vspec_tok_s']:.1f}",
        "-" if r["ratio"] is None else f"{r['ratio']:.3f}x"))


def _markdown(columns: tuple[str, ...], pairs: list[dict], cells) -> str:
    """A pair table: workload, pair, `columns` (right-aligned, `cells(row)`),
    the pair's target ratio and whether it meets it."""
    lines = ["| workload | pair (vspec / stock) | " + " | ".join(columns) + " | target | met |",
             "|---|---|" + "---:|" * len(columns) + "---:|:-:|"]
    for r in pairs:
        lines.append(f"| {r['workload']} | {r['vspec']} / {r['stock']} | "
                     + " | ".join(cells(r)) + f" | {r['target']:.2f}x"
                     + f" | {'yes' if r['meets_target'] else 'NO'} |")
    return "\n".join(lines) + "\n"
