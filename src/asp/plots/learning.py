"""Learning-curve figures: held-out reward against the trainer step and against the run's elapsed wall-clock.

    from asp.plots.learning import learning_curve_figure
    save_figure(learning_curve_figure({"C4": points}), "plots/learning_curve.png", tracker)

Each curve is a list of points (``step``, ``elapsed_s``, ``reward``, optional ``reward_se`` drawn as a band), one
curve per label (the launch stage draws one run; benchmarks/learning.py the mean of each condition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = ("#332288", "#117733", "#cc6677", "#ddcc77", "#88ccee", "#aa4499")


def learning_curve_figure(
    curves: Mapping[str, Sequence[Mapping[str, float]]], title: str = "Held-out reward", target: float | None = None
) -> Figure:
    """Two panels: reward vs trainer step and reward vs elapsed seconds (iteration time only, no evaluation); a
    dashed line at `target` (e.g. the sync baseline's final reward) when given."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for i, (label, points) in enumerate(curves.items()):
        pts = sorted(points, key=lambda p: p["step"])
        reward = np.asarray([p["reward"] for p in pts], dtype=float)
        se = np.asarray([p.get("reward_se", np.nan) for p in pts], dtype=float)
        color = COLORS[i % len(COLORS)]
        for ax, key in zip(axes, ("step", "elapsed_s"), strict=True):
            x = np.asarray([p[key] for p in pts], dtype=float)
            ax.plot(x, reward, "o-", ms=3, color=color, label=label)
            if np.isfinite(se).any():
                ax.fill_between(x, reward - se, reward + se, color=color, alpha=0.2, lw=0)
    for ax in axes:
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=0.8, label="target")
        ax.grid(alpha=0.3)
    axes[0].set(xlabel="trainer step", ylabel="held-out reward (mean, band: ± 1 SE)", title=title)
    axes[1].set(xlabel="elapsed wall-clock (s, iteration time; evaluation excluded)", title=f"{title} vs time")
    if curves:
        axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig
