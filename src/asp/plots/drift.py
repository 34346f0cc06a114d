"""Figure of the launch run's length-drift history (plots/launch_drift.png; docs/drift.md).

`drift_figure(rows)` takes the `DriftWatch` history rows (``kind`` window / switch / reprofile) and draws two
panels over trainer steps: the window Kendall tau (with the reference and the detector's floor) and the window
mean response length; a vertical line marks every step where an action fired (recalibrate, reprofile) or a
schedule switch was applied, labelled with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ACTION_COLORS = {"warn": "#999933", "recalibrate": "#117733", "reprofile": "#cc6677", "switch": "#332288"}


def _values(rows: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in rows], dtype=float)


def _markers(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, str, str]]:
    """(step, label, color) of every event that acted or warned, and every applied switch."""
    marks = []
    for r in rows:
        if r["kind"] == "window" and r.get("event"):
            action = r.get("action", "warn")
            marks.append((float(r["step"]), f"drift: {action}", ACTION_COLORS.get(action, "#999933")))
        elif r["kind"] == "switch":
            label = f"switch: {r['action']} (plan v{r['plan_version']}, predictor v{r['predictor_version']})"
            marks.append((float(r["step"]), label, ACTION_COLORS["switch"]))
        elif r["kind"] == "reprofile":
            verdict = "accepted" if r.get("accepted") else "rejected"
            marks.append((float(r["step"]), f"re-profile v{r['version']} {verdict}", ACTION_COLORS["reprofile"]))
    return marks


def drift_figure(
    rows: Sequence[Mapping[str, Any]], reference_tau: float | None = None, tau_drop: float | None = None
) -> Figure:
    """Window tau and window mean length vs trainer step, with the actions marked.

    Args:
        rows: the watch's history rows (`DriftWatch.rows`); only ``kind == "window"`` rows are plotted as points.
        reference_tau: the evaluate stage's tau (drawn as a dashed line); None: not drawn.
        tau_drop: the detector's drop (the floor reference_tau - tau_drop is drawn dotted); None: not drawn.

    Returns:
        A matplotlib figure (save it with `asp.plots.save_figure`).
    """
    import matplotlib.pyplot as plt

    windows = [r for r in rows if r["kind"] == "window"]
    steps = _values(windows, "step")
    fig, (ax_tau, ax_len) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax_tau.plot(steps, _values(windows, "drift/tau_window"), "o-", ms=3, color="#4477aa", label="window tau")
    if reference_tau is not None:
        ax_tau.axhline(reference_tau, ls="--", lw=0.8, color="#555555", label="evaluate tau")
        if tau_drop is not None:
            ax_tau.axhline(reference_tau - tau_drop, ls=":", lw=0.8, color="#aa3377", label="detector floor")
    ax_tau.set(ylabel="Kendall tau (window)", title="Length drift during the run")
    ax_len.plot(steps, _values(windows, "drift/mean_length"), "o-", ms=3, color="#cc6677")
    ax_len.set(ylabel="mean response length (tokens)", xlabel="trainer step")
    seen: set[str] = set()
    for step, label, color in _markers(rows):
        for ax in (ax_tau, ax_len):
            ax.axvline(
                step, color=color, lw=1.0, alpha=0.8, label=label if ax is ax_tau and label not in seen else None
            )
        seen.add(label)
    ax_tau.legend(loc="lower left", fontsize=7)
    if not windows:
        ax_tau.text(0.5, 0.5, "no complete window", ha="center", va="center", transform=ax_tau.transAxes)
    fig.tight_layout()
    return fig
