"""Figure 2 of the paper for planned layouts: iteration time against total and against generation devices.

Pure: builds a `matplotlib.figure.Figure` on the Agg canvas and returns it (no pyplot state, no files). The rows
come from `asp.sim.planner.scaling_curve` (best searched layout per device count) and optionally
`asp.sim.planner.b6_curve` (the B.6 heuristic's layout); each point's marker says its bottleneck
(`asp.sim.planner.bottleneck`) and its label the layout. Save it with `asp.plots.save_figure`.

Run the checks: `.venv/bin/python -m pytest tests/sim/test_planner.py -q`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from asp.sim.planner import Candidate, Cluster, bottleneck, objective_s

Row = tuple[int, Candidate, Mapping[str, float]]
MARKERS = {"generation": "o", "balanced": "D", "training": "s"}


def _series(rows: Sequence[Row], cluster: Cluster | None) -> tuple[list[int], list[int], list[float], list[str]]:
    """(total devices, generation devices, iteration time s, bottleneck) per row."""
    per_actor = cluster.devices_per_actor if cluster is not None else 1
    totals = [int(d) for d, _, _ in rows]
    gens = [c.actors * per_actor for _, c, _ in rows]
    return totals, gens, [objective_s(m) for _, _, m in rows], [bottleneck(m) for _, _, m in rows]


def scaling_figure(
    rows: Sequence[Row],
    b6_rows: Sequence[Row] | None = None,
    *,
    cluster: Cluster | None = None,
    title: str | None = None,
) -> Figure:
    """Two panels: (a) iteration time vs total devices, (b) vs generation devices (log2 x axes).

    Args:
        rows: (total devices, candidate, metrics) per device count, e.g. `scaling_curve`'s.
        b6_rows: the same for the B.6 heuristic (drawn dashed), or None.
        cluster: gives devices per actor for panel (b) (default 1).
        title: optional figure title.

    Returns:
        The Figure (Agg canvas attached). Each series is one line (its points in `ax.lines`) plus one marker
        collection per bottleneck kind present.
    """
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    series = [("searched", rows, "-", "C0", 6)]
    if b6_rows:
        series.append(("B.6 heuristic", b6_rows, "--", "C1", -12))
    ticks: set[int] = set()
    for name, data, style, color, dy in series:
        totals, gens, times, kinds = _series(data, cluster)
        for ax, xs in zip(axes, (totals, gens), strict=True):
            ax.plot(xs, times, style, color=color, lw=1.2, label=name)
            for kind, marker in MARKERS.items():
                pts = [(x, t) for x, t, b in zip(xs, times, kinds, strict=True) if b == kind]
                if pts:
                    ax.scatter(*zip(*pts, strict=True), marker=marker, color=color, zorder=3, s=36)
        for x, t, (_, cand, _) in zip(totals, times, data, strict=True):
            axes[0].annotate(cand.label(), (x, t), textcoords="offset points", xytext=(4, dy), fontsize=7, color=color)
        ticks.update(totals)
    for kind, marker in MARKERS.items():
        axes[1].scatter([], [], marker=marker, color="gray", label=kind if kind == "balanced" else f"{kind}-bound")
    axes[0].set(title="(a) Iteration time vs total devices", xlabel="total devices", ylabel="iteration time (s)")
    axes[1].set(title="(b) Iteration time vs generation devices", xlabel="generation devices")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="upper right", fontsize="small")
    axes[0].set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    if title:
        fig.suptitle(title)
    return fig
