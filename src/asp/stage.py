"""Shared entry for the thin `stages/<name>.py` scripts: load typed params, open the stage's MLflow run
(nested under the pipeline's parent run), call `asp.pipeline.<stage>.run`, print a one-line summary.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asp.config import Params, load_params
from asp.env import set_offline_defaults
from asp.tracking import Tracker, open_tracker

StageFn = Callable[[Params, Any, Tracker], dict[str, Any]]


def run_stage(
    name: str,
    fn: StageFn,
    paths: Any,
    params_path: str | Path = "params.yaml",
    resume_run: Callable[[Params, Any], str | None] | None = None,
) -> dict[str, Any]:
    """Run one pipeline stage with tracking; returns its metrics.

    `resume_run(params, paths)` may name the MLflow run of an interrupted earlier attempt that this one
    continues (the `launch` stage when it resumes from its checkpoint); None opens a new run."""
    set_offline_defaults()
    params = load_params(params_path)
    t0 = time.perf_counter()
    previous = resume_run(params, paths) if resume_run is not None else None
    with open_tracker(
        name,
        experiment=params.common.experiment,
        tracking_uri=params.common.tracking_uri,
        tags={"asp.stage": name},
        resume_run_id=previous,
    ) as tracker:
        metrics = fn(params, paths, tracker)
        elapsed = time.perf_counter() - t0
        tracker.log_metrics({f"{name}/stage_wall_s": elapsed})
    shown = ", ".join(f"{k.split('/')[-1]}={_fmt(v)}" for k, v in list(metrics.items())[:8])
    print(f"[{name}] done in {elapsed:.1f}s: {shown}", file=sys.stderr)
    return metrics


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
