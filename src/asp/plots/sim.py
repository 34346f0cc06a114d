"""Figures of the simulator (`asp simulate`, the `simulate` stage): per-step timelines of simulated runs, and
predicted against measured iteration times. Functions return matplotlib figures; `asp.plots.save_figure`
writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

COLORS = ("#332288", "#cc6677", "#117733", "#ddcc77", "#88ccee", "#aa4499")


def timeline_figure(runs: Mapping[str, Sequence[Mapping[str, float]]], title: str = "Simulated run") -> Any:
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


def validation_figure(rows: Mapping[str, tuple[float, float]], metric: str) -> Any:
    """Predicted (simulated) vs measured bars per condition for one metric.

    Args:
        rows: condition -> (measured, predicted).
        metric: axis label.
    """
    import matplotlib.pyplot as plt

    labels = list(rows)
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(x - 0.2, [rows[c][0] for c in labels], 0.4, label="measured", color=COLORS[0])
    ax.bar(x + 0.2, [rows[c][1] for c in labels], 0.4, label="simulated", color=COLORS[1])
    ax.set(xticks=x, xticklabels=labels, ylabel=metric)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
