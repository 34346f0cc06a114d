"""Figure 7 analogue: a pure function returning a Figure."""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from asp.plots.schedule import plot_schedule
from asp.schedule import build_schedule, synthetic_lengths


def test_plot_schedule_returns_three_panels() -> None:
    true = synthetic_lengths(1000, 0)
    s = build_schedule(range(1000), true, b=8, kappa=1, k=10, iterations=10_000, seed=0, method="asp")
    fig = plot_schedule(s, true, title="demo")
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert len(fig.axes[0].lines) == 2  # balanced and realized loads
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"
    assert len(plot_schedule(s).axes[2].lines) == 1
