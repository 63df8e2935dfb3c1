"""Plot gamma and batch size over time (PNG, matplotlib Agg).

A timeline comes either from the vspec decision trace (x = engine step
since the variant's first measured request: every step, exact) or from
polled /metrics (x = seconds since the variant's first request).

Each variant gets a panel of its own, on its own x axis: variants take
different numbers of steps (and seconds) for the same workload, so one
shared axis would put a workload's label over another phase of every
variant but one. Within a panel, gamma is drawn against the left axis and
batch size against the right one, and each workload's span is shaded and
labelled where that variant served it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

X_LABELS = {"step": "engine step (vspec trace)",
            "s": "seconds since the variant's first request (/metrics, polled)"}

PANEL_HEIGHT_IN = 2.4


@dataclass
class Timeline:
    variant: str
    x_unit: str  # a key of X_LABELS
    x: list[float]
    batch: list[float]
    gamma: list[float | None]  # None where the source has no gamma (stock scheduler)
    spans: list[tuple[str, float, float]]  # (workload, x start, x end)


@dataclass
class Label:
    workload: str
    start: float
    end: float

    @property
    def x(self) -> float:
        """Where the label sits: the middle of the span it names."""
        return (self.start + self.end) / 2


def workload_labels(timeline: Timeline) -> list[Label]:
    """The workload labels of one variant's panel, from its own spans."""
    return [Label(name, a, b) for name, a, b in timeline.spans]


def figure(timelines: list[Timeline], title: str):
    """A matplotlib Figure: one panel per timeline, in the given order.
    Every timeline must use one x unit (the figure names it once)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = {tl.x_unit for tl in timelines}
    if len(units) > 1:
        raise ValueError(f"timelines mix x units {sorted(units)}; plot them separately")
    rows = max(1, len(timelines))
    fig, axes = plt.subplots(rows, 1, figsize=(11, 1 + PANEL_HEIGHT_IN * rows), squeeze=False)
    for ax, tl in zip(axes[:, 0], timelines):
        _panel(ax, tl)
    if timelines:
        axes[-1, 0].set_xlabel(X_LABELS[timelines[0].x_unit])
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _panel(ax, tl: Timeline) -> None:
    ax_b = ax.twinx()
    ax_b.step(tl.x, tl.batch, where="post", color="tab:grey", linewidth=0.8, label="batch size")
    ax_b.set_ylabel("batch size")
    pts = [(x, g) for x, g in zip(tl.x, tl.gamma) if g is not None]
    if pts:
        ax.step([x for x, _ in pts], [g for _, g in pts], where="post", color="tab:blue",
                linewidth=0.8, label="gamma")
    ax.set_ylabel("gamma")
    # Gammas are whole numbers from 0: the axis shows 0..max with room above.
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.2, max((g for _, g in pts), default=1) + 0.4)
    # Gamma on top of the batch line, and the gamma axis' ticks where they belong.
    ax.set_zorder(ax_b.get_zorder() + 1)
    ax.patch.set_visible(False)
    for i, label in enumerate(workload_labels(tl)):
        ax.axvspan(label.start, label.end, alpha=0.08 if i % 2 else 0.16, color="grey")
        ax.text(label.x, 1.01, label.workload, ha="center", va="bottom", fontsize=7,
                transform=ax.get_xaxis_transform())
    ax.set_title(tl.variant + ("" if pts else " (no gamma: stock scheduler)"),
                 loc="left", fontsize=9, pad=12)
    ends = [*tl.x, *(a for _, a, _ in tl.spans), *(b for _, _, b in tl.spans)]
    if ends and max(ends) > min(ends):
        ax.set_xlim(min(ends), max(ends))


def plot_timelines(timelines: list[Timeline], path: Path, title: str) -> Path:
    """Write `figure(timelines, title)` to `path` (PNG) and return it."""
    import matplotlib.pyplot as plt

    fig = figure(timelines, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
