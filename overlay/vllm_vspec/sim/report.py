"""The report of `vllm-vspec sim`, the trace-driven simulator of dynamic gamma.

Compares fixed gamma 0..K, vLLM's static batch-size table, the online and
profile policies and the per-step oracle on the same synthetic or recorded
workloads and latency profile, prints a table of tokens/s and ratios, and
writes sim.json and sim.png. With `--max-width W` and `--tree-rates` it
adds tree arms: a fixed contender per (gamma, width) arm (`fixed-2x2`:
depth 2, width 2) and the adaptive policies and the oracle choose among
them. The simulated engine and the contenders are in
simulator.py; this module is its report (table, plot, named workloads); the
command line is commands/sim.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from vllm_vspec.sim.simulator import (Rates, SimResult, Workload, bursty, per_request,
                                      phase_shift, ratios, steady)


# ------------------------------------------------------------------ report
def table_text(results: Sequence[SimResult]) -> str:
    names = list(dict.fromkeys(r.policy for r in results))
    wls = list(dict.fromkeys(r.workload for r in results))
    by = {(r.workload, r.policy): r for r in results}
    head = f"{'workload':<18}" + "".join(f"{n:>10}" for n in names)
    lines = ["tokens/s", head]
    for wl in wls:
        # A workload without tree rates has no tree contenders: "-".
        lines.append(f"{wl:<18}" + "".join(f"{by[wl, n].tok_s:>10.1f}" if (wl, n) in by
                                           else f"{'-':>10}" for n in names))
    lines.append("")
    rat = ratios(results)
    keys = list(next(iter(rat.values())))
    lines.append(f"{'workload':<18}" + "".join(f"{k:>20}" for k in keys))
    for wl, r in rat.items():
        lines.append(f"{wl:<18}" + "".join(f"{r[k]:>20.3f}" for k in keys))
    return "\n".join(lines)


def plot(results: Sequence[SimResult], path: Path) -> None:
    """Top: throughput relative to the oracle per workload and policy. Below:
    gamma over time (online, oracle, table) and batch size for the (up to
    two) workloads where the oracle's gamma changes most often."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(dict.fromkeys(r.workload for r in results))
    names = list(dict.fromkeys(r.policy for r in results))
    by = {(r.workload, r.policy): r for r in results}

    def switches(wl: str) -> int:
        gammas = [g for _, _, g in by[wl, "oracle"].timeline]
        return sum(a != b for a, b in zip(gammas, gammas[1:]))

    dynamic = sorted(wls, key=switches, reverse=True)[:2]
    fig, axes = plt.subplots(1 + len(dynamic), 1, figsize=(12, 4 + 3.5 * len(dynamic)),
                             squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([w + i * width for w in range(len(wls))],
               [by[wl, n].tok_s / by[wl, "oracle"].tok_s if (wl, n) in by else 0.0
                for wl in wls], width, label=n)
    ax.set_xticks([w + 0.4 - width / 2 for w in range(len(wls))], wls)
    ax.set_ylabel("tokens/s / oracle")
    ax.set_ylim(0.5, 1.05)
    ax.legend(ncol=len(names), fontsize=7)
    for row, wl in enumerate(dynamic, start=1):
        ax = axes[row][0]
        for n, style in (("oracle", "-"), ("online", "--"), ("table", ":")):
            t, _, g = zip(*by[wl, n].timeline)
            ax.step(t, g, style, where="post", label=f"gamma {n}", alpha=0.8)
        t, b, _ = zip(*by[wl, "oracle"].timeline)
        twin = ax.twinx()
        twin.plot(t, b, color="grey", alpha=0.4)
        twin.set_ylabel("batch size (grey)")
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("gamma")
        ax.set_title(wl)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ named workloads
# name -> factory(scale, rates): `scale` multiplies the workload's tokens,
# `rates` are the steady acceptance, a tuple or {tree width: tuple} (phase
# workloads alternate EASY/HARD, linear only).
WORKLOADS: dict[str, Callable[[float, Rates], Workload]] = {
    "steady-b1": lambda s, r: steady(1, r, tokens=int(8192 * s)),
    "steady-b16": lambda s, r: steady(16, r, tokens=int(32768 * s)),
    "steady-b128": lambda s, r: steady(128, r, tokens=int(65536 * s)),
    "phase-b16": lambda s, r: phase_shift(16, tokens=int(65536 * s)),
    "bursty": lambda s, r: bursty(rates=r, tokens=int(98304 * s)),
    # Draws its own rates per request (--rates does not apply).
    "per-request-b1": lambda s, r: per_request(1, tokens=int(16384 * s)),
}
