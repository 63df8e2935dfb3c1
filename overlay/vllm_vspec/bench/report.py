"""Report maths (tokens/s, ratios, exactness, gamma counts) and its rendering.

Everything here is a pure function of measured runs, so it is unit-tested
without a server. Ratios are only ever taken between runs of the same
benchmark invocation (the machines are noisy; numbers from different runs do
not compare). With repeats (`bench --repeats N`: every variant served N
times, rounds interleaved), a row's tokens/s is the median over its rounds
and the ratios are ratios of those medians.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from vllm_vspec.bench.loadgen import Completion


@dataclass
class Run:
    """One variant serving one workload."""
    workload: str
    variant: str
    family: str  # Variant.family
    completions: list[Completion]
    repeat: int = 0  # round of `bench --repeats` (0-based)
    # `bench --paired`: the overhead pair (its label) this run was served in
    pair: str | None = None
    # (bucket, arm) -> steps; an arm is a gamma, or (depth, width) for a tree
    gamma_counts: Counter = field(default_factory=Counter)
    gamma_source: str | None = None  # "trace", "metrics" or None
    # controller wall time / decode-step time, from the vspec trace
    controller_overhead: float | None = None
    # vLLM's spec-decode counters over the workload: (drafts verified,
    # accepted tokens per draft position); None when nothing was drafted
    draft_counts: tuple[int, tuple[int, ...]] | None = None

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.completions)

    @property
    def wall_s(self) -> float:
        if not self.completions:
            return 0.0
        return max(c.end for c in self.completions) - min(c.start for c in self.completions)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def errors(self) -> list[str]:
        return [f"{c.key}: {c.error}" for c in self.completions if c.error]


# The fixed choices a "best fixed" ratio is taken over: linear gammas (stock
# vLLM) and fixed EAGLE trees (a user who measured both would pick either).
FIXED_FAMILIES = ("fixed", "tree-fixed")


def accepted_length(runs: list[Run]) -> float | None:
    """Mean tokens a request commits per verify step that checked a draft:
    1 + accepted draft tokens / drafts verified, from vLLM's spec-decode
    counters pooled over `runs` (a tree counts its accepted path: the
    scheduler sees the path's tokens only). None when nothing was drafted."""
    counts = [r.draft_counts for r in runs if r.draft_counts]
    drafts = sum(c[0] for c in counts)
    return 1 + sum(sum(c[1]) for c in counts) / drafts if drafts else None


def arm(key) -> tuple[int, int]:
    """(depth, width) of a gamma_counts arm (a plain gamma is width 1)."""
    return key if isinstance(key, tuple) else (key, 1)


def exact_match(run: Run, reference: Run) -> tuple[int, int, list[str]]:
    """(identical, compared, keys that differ) of run's outputs against the
    reference (target-only) outputs of the same requests."""
    ref = {c.key: c.text for c in reference.completions if not c.error}
    same, differ = 0, []
    for c in run.completions:
        if c.error or c.key not in ref:
            continue
        if c.text == ref[c.key]:
            same += 1
        else:
            differ.append(c.key)
    return same, same + len(differ), differ


def first_difference(a: str, b: str) -> int:
    """Offset of the first differing character (len of the shorter if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def format_gamma_counts(counts: Counter) -> str:
    """"b1: g4 x120, g3 x8 | b32: g2x2 x40" (buckets ascending, arms by
    count, a tree as depth x width; bucket None, all batch sizes together,
    reads "all")."""
    parts = []
    for bucket in sorted({b for b, _ in counts}, key=lambda b: -1 if b is None else b):
        per = sorted(((g, n) for (b, g), n in counts.items() if b == bucket and n),
                     key=lambda gn: (-gn[1], arm(gn[0])))
        if per:
            label = "all" if bucket is None else f"b{bucket}"
            parts.append(f"{label}: " + ", ".join(f"g{_arm_name(g)} x{int(n)}" for g, n in per))
    return " | ".join(parts)


def _arm_name(key) -> str:
    depth, width = arm(key)
    return str(depth) if width == 1 else f"{depth}x{width}"


@dataclass(frozen=True)
class Row:
    workload: str
    variant: str
    tokens_per_s: float
    vs_target: float | None
    vs_best_fixed: float | None
    best_fixed: str | None
    identical: int
    compared: int
    errors: int
    gamma_counts: str
    controller_overhead: float | None = None
    # tokens/s of every round (one entry without repeats)
    rounds_tokens_per_s: tuple[float, ...] = ()
    # ratio to the faster of target-only and the best fixed gamma: 1.00x is
    # what a user who had measured both would have chosen
    vs_best_choice: float | None = None
    family: str = ""  # Variant.family
    accepted_length: float | None = None  # accepted_length() over the rounds


def rows(runs: list[Run]) -> list[Row]:
    """Table rows per (workload, variant), each ratio taken within the
    workload between median tokens/s over rounds; outputs of every round are
    compared with target-only's outputs of the same round (without a
    target-only server, as in a `--pair` of two speculative ones, with the
    first variant's: greedy speculation must reproduce the target's output,
    so any two exact variants agree)."""
    out = []
    for workload in dict.fromkeys(r.workload for r in runs):
        group = [r for r in runs if r.workload == workload]
        by_variant: dict[str, list[Run]] = {}
        for r in group:
            by_variant.setdefault(r.variant, []).append(r)
        speed = {v: statistics.median(r.tokens_per_s for r in rs) for v, rs in by_variant.items()}
        target = next((v for v, rs in by_variant.items() if rs[0].family == "target"), None)
        reference = target if target is not None else next(iter(by_variant))
        targets = {r.repeat: r for r in by_variant[reference]}
        fixed = [v for v, rs in by_variant.items() if rs[0].family in FIXED_FAMILIES]
        best = max(fixed, key=speed.__getitem__) if fixed else None
        choice = max((speed[v] for v in (target, best) if v is not None), default=0.0)
        for v, rs in by_variant.items():
            same = compared = errors = 0
            counts: Counter = Counter()
            for r in rs:
                if r.repeat in targets:
                    s, c, _ = exact_match(r, targets[r.repeat])
                    same, compared = same + s, compared + c
                errors += len(r.errors)
                counts.update(r.gamma_counts)
            shares = [r.controller_overhead for r in rs if r.controller_overhead is not None]
            out.append(Row(
                workload, v, speed[v],
                _ratio(speed[v], speed[target]) if target else None,
                _ratio(speed[v], speed[best]) if best else None,
                best, same, compared, errors, format_gamma_counts(counts),
                statistics.mean(shares) if shares else None,
                tuple(r.tokens_per_s for r in rs),
                _ratio(speed[v], choice) if target and best else None, rs[0].family,
                accepted_length(rs)))
    return out


def acceptance_per_position(runs: list[Run]) -> dict[str, tuple[str, list[float]]]:
    """Per workload: (variant, fraction of drafts whose position i was
    accepted, pooled over rounds) from the fixed gamma that drafted the
    most positions (stock vLLM always drafts K there, so every position is
    measured; vspec's counts mix draft lengths, a tree's count nodes)."""
    out = {}
    for workload in dict.fromkeys(r.workload for r in runs):
        fixed = [r for r in runs if r.workload == workload and r.family == "fixed"
                 and r.draft_counts]
        if not fixed:
            continue
        widest = max(fixed, key=lambda r: len(r.draft_counts[1])).variant
        counts = [r.draft_counts for r in fixed if r.variant == widest]
        drafts = sum(c[0] for c in counts)
        per_pos = [sum(c[1][i] for c in counts if i < len(c[1]))
                   for i in range(max(len(c[1]) for c in counts))]
        out[workload] = (widest, [a / drafts for a in per_pos])
    return out


def robustness_table(table_rows: list[Row], acceptance: dict[str, tuple[str, list[float]]]
                     ) -> str:
    """Markdown, one line per (workload, adaptive variant): the workload's
    acceptance per position, its best fixed gamma and the variant against
    target-only, the best fixed gamma and the faster of the two
    (`acceptance` = acceptance_per_position(runs))."""
    lines = ["| workload | acceptance per position | best fixed | variant | x target "
             "| x best fixed | x best of (target, fixed) |",
             "|---|---|---|---|---:|---:|---:|"]
    for row in table_rows:
        if row.family != "online" or row.vs_best_choice is None:
            continue
        source, rates = acceptance.get(row.workload, ("", []))
        acc = " ".join(f"{x:.2f}" for x in rates) + (f" ({source})" if source else "") or "-"
        lines.append(f"| {row.workload} | {acc} | {row.best_fixed} | {row.variant} | "
                     f"{_times(row.vs_target)} | {_times(row.vs_best_fixed)} | "
                     f"{_times(row.vs_best_choice)} |")
    return "\n".join(lines)


def phase_bounds(runs: list[Run]) -> dict[str, dict]:
    """For every workload of several phases (bursty): the tokens/s had each
    phase been served by its fastest FIXED choice (target-only or a fixed
    gamma), as a ratio to the best fixed variant. It bounds what switching
    between the measured fixed choices could gain here: 1.10x over the best
    fixed gamma needs phases whose best choices differ by that much.

    A phase's time is its span (first request sent to last response), the
    median over rounds per variant; the fastest choice is taken on those
    medians. (Taking the fastest choice round by round instead would pick
    the luckiest of several noisy spans in every phase and inflate the bound.)
    Also returns every variant's median phase spans, vspec ones included, to
    show where a variant gains or loses against that choice.

    When vspec's `fixed-0` ran (target-only steps inside a speculative vspec
    server), also `in_server`: the same bound with the choices an adaptive
    server really has, fixed gammas 0..K of a speculative server (`fixed-0`
    instead of the target-only server, which costs less than gamma 0 does
    in a server that also holds a draft model)."""
    out = {}
    for workload in dict.fromkeys(r.workload for r in runs):
        group = [r for r in runs if r.workload == workload]
        phases = sorted({c.key.split("/")[0] for r in group for c in r.completions}, key=int)
        choices = [r for r in group if r.family == "target" or r.family in FIXED_FAMILIES]
        if len(phases) < 2 or not any(r.family in FIXED_FAMILIES for r in choices):
            continue
        seconds: dict[str, list[float]] = {}
        for variant in dict.fromkeys(r.variant for r in group):
            rounds = [r for r in group if r.variant == variant]
            seconds[variant] = [statistics.median(
                _span([c for c in r.completions if c.key.split("/")[0] == phase])
                for r in rounds) for phase in phases]
        speed = {v: statistics.median(r.tokens_per_s for r in group if r.variant == v)
                 for v in dict.fromkeys(r.variant for r in choices
                                        if r.family in FIXED_FAMILIES)}
        best_fixed = max(speed, key=speed.__getitem__)
        tokens = max(r.tokens for r in choices)

        def bound(candidates: list[str]) -> tuple[float, dict[str, str]]:
            """Tokens/s of the fastest candidate per phase / best fixed (0: unmeasurable)."""
            picks = {phase: min(candidates, key=lambda v: seconds[v][i])
                     for i, phase in enumerate(phases)}
            wall = sum(seconds[v][i] for i, v in enumerate(picks.values()))
            ok = wall > 0 and speed[best_fixed] > 0
            return (tokens / wall / speed[best_fixed] if ok else 0.0), picks

        ratio, picks = bound(list(dict.fromkeys(r.variant for r in choices)))
        if ratio <= 0:
            continue
        out[workload] = {"vs_best_fixed": ratio, "best_fixed": best_fixed,
                         "phase_choices": picks, "phase_seconds": seconds}
        in_server = list(speed) + list(dict.fromkeys(
            r.variant for r in group if r.family == "vspec-fixed"))
        if len(in_server) > len(speed):
            ratio, picks = bound(in_server)
            out[workload]["in_server"] = {"vs_best_fixed": ratio, "phase_choices": picks}
    return out


def _span(completions: list[Completion]) -> float:
    if not completions:
        return 0.0
    return max(c.end for c in completions) - min(c.start for c in completions)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def results_json(runs: list[Run], meta: dict, table_rows: list[Row],
                 bounds: dict[str, dict]) -> dict:
    """Everything measured, with per-request detail, for the results file
    (`table_rows` = rows(runs), `bounds` = phase_bounds(runs))."""
    target_of = {(r.workload, r.repeat): r for r in runs if r.family == "target"}
    table = [row.__dict__ for row in table_rows]
    detail = []
    for r in runs:
        ref = target_of.get((r.workload, r.repeat))
        differ = exact_match(r, ref)[2] if ref else []
        ref_text = {c.key: c.text for c in ref.completions} if ref else {}
        detail.append({
            "workload": r.workload, "variant": r.variant, "family": r.family,
            "repeat": r.repeat, "pair": r.pair,
            "tokens": r.tokens, "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s,
            "errors": r.errors, "gamma_source": r.gamma_source,
            "controller_overhead": r.controller_overhead,
            "draft_counts": ({"drafts": r.draft_counts[0],
                              "accepted_per_position": list(r.draft_counts[1])}
                             if r.draft_counts else None),
            "gamma_counts": [{"bucket": b, "gamma": arm(g)[0], "width": arm(g)[1],
                              "steps": int(n)}
                             for (b, g), n in sorted(r.gamma_counts.items(),
                                                     key=lambda kv: (kv[0][0] or 0, arm(kv[0][1])))],
            "differing_outputs": [
                {"key": k, "first_difference_at_char": first_difference(
                    next(c.text for c in r.completions if c.key == k), ref_text[k])}
                for k in differ],
        })
    acceptance = {w: {"variant": v, "per_position": rates}
                  for w, (v, rates) in acceptance_per_position(runs).items()}
    return {"meta": meta, "table": table, "phase_bounds": bounds,
            "acceptance_per_position": acceptance, "runs": detail}


def _times(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "-"


def _share(share: float | None) -> str:
    return f"{100 * share:.2f}%" if share is not None else "-"


def _length(length: float | None) -> str:
    return f"{length:.2f}" if length is not None else "-"


def _speed(row: Row) -> str:
    """Median tokens/s, with the range over rounds when there are several."""
    r = row.rounds_tokens_per_s
    spread = f" ({min(r):.1f}-{max(r):.1f})" if len(r) > 1 else ""
    return f"{row.tokens_per_s:.1f}{spread}"


def render_table(table_rows: list[Row]):
    """A rich Table of the rows (printed by the CLI)."""
    from rich.table import Table

    t = Table(title="vllm-vspec bench serve (ratios within each workload, same run)")
    numeric = ("tok/s", "x target", "x best fixed", "x best", "accepted len", "identical",
               "ctl time")
    for col in ("workload", "variant") + numeric + ("gamma per bucket",):
        t.add_column(col, justify="right" if col in numeric else "left")
    previous = None
    for row in table_rows:
        if previous is not None and row.workload != previous:
            t.add_section()
        previous = row.workload
        ident = f"{row.identical}/{row.compared}" + (f" ({row.errors} err)" if row.errors else "")
        t.add_row(row.workload, row.variant, _speed(row), _times(row.vs_target),
                  _times(row.vs_best_fixed), _times(row.vs_best_choice),
                  _length(row.accepted_length), ident,
                  _share(row.controller_overhead),
                  row.gamma_counts)
    return t


def bound_lines(bounds: dict[str, dict]) -> list[str]:
    """Per multi-phase workload: the fastest-fixed-choice-per-phase bound, and
    a markdown table of every variant's median seconds per phase (the
    fastest fixed choice of each phase in bold)."""
    out = []
    for w, b in bounds.items():
        picks = b["phase_choices"]
        out.append(f"{w}: the fastest fixed choice per phase (median span over rounds) would "
                   f"give {_times(b['vs_best_fixed'])} the best fixed gamma ({b['best_fixed']}); "
                   f"choices: {', '.join(f'phase {p} {v}' for p, v in picks.items())}")
        if "in_server" in b:
            s = b["in_server"]
            out.append(f"{w}: within one speculative server (fixed gammas 0..K, fixed-0 for "
                       f"target-only) it would give {_times(s['vs_best_fixed'])}; choices: "
                       + ", ".join(f"phase {p} {v}" for p, v in s["phase_choices"].items()))
        lines = ["| variant | " + " | ".join(f"phase {p} s" for p in picks) + " | sum s |",
                 "|---|" + "---:|" * (len(picks) + 1)]
        for variant, spans in b["phase_seconds"].items():
            cells = [f"**{s:.2f}**" if picks[p] == variant else f"{s:.2f}"
                     for p, s in zip(picks, spans)]
            lines.append(f"| {variant} | " + " | ".join(cells) + f" | {sum(spans):.2f} |")
        out.append("\n".join(lines))
    return out


def markdown_table(table_rows: list[Row]) -> str:
    """The same table as GitHub markdown (for docs/log/benchmarks.md). `x best`
    is the ratio to the faster of target-only and the best fixed gamma;
    `accepted len` is accepted_length()."""
    lines = ["| workload | variant | tok/s | x target | x best fixed | x best | accepted len "
             "| identical | ctl time | gamma per bucket |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in table_rows:
        lines.append(f"| {row.workload} | {row.variant} | {_speed(row)} | "
                     f"{_times(row.vs_target)} | {_times(row.vs_best_fixed)} | "
                     f"{_times(row.vs_best_choice)} | {_length(row.accepted_length)} | "
                     f"{row.identical}/{row.compared} | {_share(row.controller_overhead)} | "
                     f"{row.gamma_counts} |")
    return "\n".join(lines)
