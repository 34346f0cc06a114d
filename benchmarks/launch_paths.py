"""The launch stage's paths for a benchmark run: the stage's inputs where `launch.Paths` puts them, its outputs
(launch folder, runtime state, metrics, plots) under a temporary folder, so a benchmark never touches the
pipeline's own outputs. Shared by the benchmarks that run `launch.run` (launch_conditions, sync_vs_async,
partial_rollouts, drift_demo, learning); kept here, not in the launch stage's code, whose hash dvc.lock records.

    with tempfile.TemporaryDirectory() as tmp:
        metrics = launch.run(params, scratch_launch_paths(Path(tmp)), NullTracker())
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from asp.pipeline import launch


def scratch_launch_paths(tmp: Path, base: launch.Paths | None = None, **overrides: Any) -> launch.Paths:
    """`base` (default: `launch.Paths()`) with its outputs under `tmp`: ``launch/``, ``state/``, ``m.json``,
    ``p.png``, ``curve.png``; `overrides`: other fields to replace (e.g. ``drift_plot``)."""
    return replace(
        base if base is not None else launch.Paths(),
        out_dir=tmp / "launch",
        state_dir=tmp / "state",
        metrics=tmp / "m.json",
        plot=tmp / "p.png",
        curve_plot=tmp / "curve.png",
        **overrides,
    )
