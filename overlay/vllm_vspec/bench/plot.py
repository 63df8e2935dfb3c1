"""Plot gamma and batch size over time (PNG, matplotlib Agg).

Each timeline is drawn against seconds since its variant's first request, so
variants overlay; workload spans of the first timeline are shaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Timeline:
    variant: str
    t0: float  # wall clock of the variant's first request
    times: list[float]  # wall clock
    batch: list[float]
    gamma: list[float | None]  # None where the source has no gamma (stock scheduler)
    spans: list[tuple[str, float, float]]  # (workload, start, end), wall clock


def plot_timelines(timelines: list[Timeline], path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_g, ax_b) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for tl in timelines:
        xs = [t - tl.t0 for t in tl.times]
        pts = [(x, g) for x, g in zip(xs, tl.gamma) if g is not None]
        if pts:
            ax_g.step([x for x, _ in pts], [g for _, g in pts], where="post",
                      label=tl.variant, linewidth=0.8)
        ax_b.plot(xs, tl.batch, label=tl.variant, linewidth=0.8)
    if timelines:
        first = timelines[0]
        for i, (name, a, b) in enumerate(first.spans):
            for ax in (ax_g, ax_b):
                ax.axvspan(a - first.t0, b - first.t0, alpha=0.08 if i % 2 else 0.16,
                           color="grey")
            ax_b.text((a + b) / 2 - first.t0, 0, name, ha="center", va="bottom",
                      fontsize=7, rotation=90)
    ax_g.set_ylabel("gamma (draft tokens / step)")
    ax_b.set_ylabel("batch size (running requests)")
    ax_b.set_xlabel("seconds since the variant's first request")
    ax_g.set_title(title)
    for ax in (ax_g, ax_b):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
