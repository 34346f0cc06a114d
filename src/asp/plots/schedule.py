"""Figure 7 of the paper for any Schedule: minibatch loads before and after reordering, and group loads.

Pure: builds a `matplotlib.figure.Figure` on the Agg canvas and returns it (no pyplot state, no files). Save
it with `fig.savefig(path)` or log it with a tracker.

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_plot.py -q`.
"""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from asp.schedule.schedule import Schedule
from asp.schedule.validate import as_lengths


def plot_schedule(schedule: Schedule, true_lengths: object | None = None, *, title: str | None = None) -> Figure:
    """Three panels: minibatch loads in sorted order, in dispatch order, and batch-group loads.

    Args:
        schedule: the Schedule to draw.
        true_lengths: optional (n,) true lengths indexed like `schedule.positions`; realized loads are then
            drawn next to the balanced (predicted/calibrated) ones.
        title: optional figure title.

    Returns:
        The Figure (Agg canvas attached).
    """
    fig = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1)
    k = schedule.k
    pred = schedule.minibatch_loads
    sorted_pos = np.argsort(schedule.minibatch_ids, kind="stable")
    series = [("balanced load", pred)]
    if true_lengths is not None:
        true = as_lengths(true_lengths, "true_lengths")[schedule.positions]
        series.append(("realized load", np.add.reduceat(true, schedule.offsets[:-1])))
    for label, loads in series:
        alpha = 0.9 if label == "balanced load" else 0.6
        axes[0].plot(loads[sorted_pos], lw=0.8, alpha=alpha, label=label)
        axes[1].plot(loads, lw=0.8, alpha=alpha, label=label)
        n_full = loads.size // k
        groups = loads[: n_full * k].reshape(n_full, k).sum(axis=1) if n_full else loads[:0]
        axes[2].plot(groups, marker=".", lw=0.8, alpha=alpha, label=label)
    axes[0].set(title="Minibatch loads before reordering (length-sorted)", xlabel="minibatch (sorted)")
    axes[1].set(title="Minibatch loads after reordering (dispatch order)", xlabel="dispatch rank")
    axes[2].set(title=f"Batch-group loads (k = {k}, complete groups)", xlabel="group")
    for ax in axes:
        ax.set_ylabel("tokens")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(loc="upper left", fontsize="small")
    if title:
        fig.suptitle(title)
    return fig
