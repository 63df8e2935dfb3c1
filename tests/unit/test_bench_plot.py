"""The bench plot (bench/plot.py, `gamma_batch.png`) on synthetic timelines,
no engine. Spec: each variant gets its own panel on its own x axis, and a
workload's label sits over the middle of that workload's span in that
variant's panel, however many steps the other variants took for it."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from vllm_vspec.bench.plot import Timeline, figure, plot_timelines

# Two vspec variants over the same two workloads; the slow one takes three
# times the steps, so a shared axis would put its phase boundary (step 300)
# far from the fast one's (step 40).
FAST = Timeline("online", "step", list(range(0, 91)), [1] * 40 + [32] * 51,
                [4] * 40 + [1] * 51, [("steady-c1", 0, 40), ("steady-c32", 40, 90)])
SLOW = Timeline("online-1", "step", list(range(0, 401)), [1] * 300 + [32] * 101,
                [3] * 300 + [2] * 101, [("steady-c1", 0, 300), ("steady-c32", 300, 400)])
STOCK = Timeline("target", "step", [0, 10, 20], [1, 32, 32], [None, None, None],
                 [("steady-c1", 0, 10), ("steady-c32", 10, 20)])


def _panels(fig):
    """The gamma axes of each panel (the twin batch axes share their title-less x)."""
    return [ax for ax in fig.axes if ax.get_title(loc="left")]


def _labels(ax) -> dict[str, float]:
    return {t.get_text(): t.get_position()[0] for t in ax.texts}


@pytest.fixture
def fig():
    f = figure([FAST, SLOW, STOCK], "gamma and batch size over time")
    yield f
    plt.close(f)


def test_each_variant_has_a_panel_of_its_own_in_order(fig):
    titles = [ax.get_title(loc="left") for ax in _panels(fig)]
    assert titles == ["online", "online-1", "target (no gamma: stock scheduler)"]


def test_each_panel_labels_the_workloads_at_its_own_spans(fig):
    fast, slow, stock = _panels(fig)
    assert _labels(fast) == {"steady-c1": 20.0, "steady-c32": 65.0}
    assert _labels(slow) == {"steady-c1": 150.0, "steady-c32": 350.0}
    assert _labels(stock) == {"steady-c1": 5.0, "steady-c32": 15.0}


def test_each_panel_has_its_own_x_axis(fig):
    fast, slow, stock = _panels(fig)
    assert fast.get_xlim() == (0.0, 90.0)
    assert slow.get_xlim() == (0.0, 400.0)
    assert stock.get_xlim() == (0.0, 20.0)


def test_a_panel_draws_gamma_on_its_axis_and_batch_on_the_twin(fig):
    fast = _panels(fig)[0]
    (gamma,) = fast.get_lines()
    assert list(gamma.get_ydata()) == FAST.gamma
    twins = [ax for ax in fig.axes if ax is not fast and ax.bbox.bounds == fast.bbox.bounds]
    (batch,) = twins[0].get_lines()
    assert list(batch.get_ydata()) == FAST.batch


def test_a_stock_panel_draws_batch_size_only(fig):
    stock = _panels(fig)[2]
    assert stock.get_lines() == []


def test_plot_timelines_writes_a_png_and_refuses_mixed_units(tmp_path):
    png = plot_timelines([FAST, SLOW], tmp_path / "plot" / "gamma_batch.png", "t")
    assert png.read_bytes()[:4] == b"\x89PNG"
    polled = Timeline("target", "s", [0.0, 0.5], [1, 2], [None, None], [("w", 0.0, 0.5)])
    with pytest.raises(ValueError, match="mix x units"):
        plot_timelines([FAST, polled], tmp_path / "q.png", "t")
