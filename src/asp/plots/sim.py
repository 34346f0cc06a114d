"""Figure of the simulator (`asp simulate`, the `simulate` stage): per-step timelines of simulated runs. It returns
a matplotlib figure; `asp.plots.save_figure` writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = ("#332288", "#cc6677", "#117733", "#ddcc77", "#88ccee", "#aa4499")


def timeline_figure(runs: Mapping[str, Sequence[Mapping[str, float]]], title: str = "Simulated run") -> Figure:
    """Iteration time, Training Queue depth and policy lag per trainer step, one line per run (condition).

    Args:
        runs: run label -> per-step metric dicts (`SimResult.iterations`: ``runtime/iteration_time_s``,
            ``runtime/queue_depth_prompts``, ``runtime/policy_lag_mean``, ``step``).
        title: figure title.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    panels = (
        ("runtime/iteration_time_s", "iteration time (s)"),
        ("runtime/queue_depth_prompts", "queue depth (prompts)"),
        ("runtime/policy_lag_mean", "policy lag (steps, mean)"),
    )
    for i, (label, rows) in enumerate(runs.items()):
        steps = [r.get("step", j + 1) for j, r in enumerate(rows)]
        for ax, (key, _) in zip(axes, panels, strict=True):
            ax.plot(steps, [r.get(key, np.nan) for r in rows], "-", lw=1, color=COLORS[i % len(COLORS)], label=label)
    for ax, (_, ylabel) in zip(axes, panels, strict=True):
        ax.set(ylabel=ylabel)
    axes[0].set(title=title)
    if runs:
        axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set(xlabel="trainer step")
    fig.tight_layout()
    return fig
