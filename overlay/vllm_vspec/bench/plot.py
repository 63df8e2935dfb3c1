"""Plot gamma and batch size over time (PNG, matplotlib Agg).

A timeline comes either from the vspec decision trace (x = engine step
since the variant's first measured request: every step, exact) or from
polled /metrics (x = seconds since the variant's first request). Workload
spans of the first timeline are shaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

X_LABELS = {"step": "engine step (vspec trace)",
            "s": "seconds since the variant's first request (/metrics, polled)"}


@dataclass
class Timeline:
    variant: str
    x_unit: str  # a key of X_LABELS
    x: list[float]
    batch: list[float]
    gamma: list[float | None]  # None where the source has no gamma (stock scheduler)
    spans: list[tuple[str, float, float]]  # (workload, x start, x end)


def plot_timelines(timelines: list[Timeline], path: Path, title: str) -> Path:
    """All timelines must share one x unit."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = {tl.x_unit for tl in timelines}
    if len(units) > 1:
        raise ValueError(f"timelines mix x units {sorted(units)}; plot them separately")
    fig, (ax_g, ax_b) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for tl in timelines:
        pts = [(x, g) for x, g in zip(tl.x, tl.gamma) if g is not None]
        if pts:
            ax_g.step([x for x, _ in pts], [g for _, g in pts], where="post",
                      label=tl.variant, linewidth=0.8)
        ax_b.step(tl.x, tl.batch, where="post", label=tl.variant, linewidth=0.8)
    if timelines:
        for i, (name, a, b) in enumerate(timelines[0].spans):
            for ax in (ax_g, ax_b):
                ax.axvspan(a, b, alpha=0.08 if i % 2 else 0.16, color="grey")
            ax_g.text((a + b) / 2, 1.01, name, ha="center", va="bottom", fontsize=7,
                      transform=ax_g.get_xaxis_transform())
        ax_b.set_xlabel(X_LABELS[timelines[0].x_unit])
    ax_g.set_ylabel("gamma (draft tokens / step)")
    ax_b.set_ylabel("batch size (requests)")
    fig.suptitle(title)
    for ax in (ax_g, ax_b):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
