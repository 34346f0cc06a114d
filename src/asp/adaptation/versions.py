"""The predictor versions of a launch run: ``<state_dir>/predictors/v<k>/``, one per re-profile attempt.

v1 is the pipeline's predictor (outputs/predictor, not stored here), so the first re-profile is v2, accepted or
not. An accepted version holds profile.parquet, predictor/, calibration.json, predictions.parquet (every training
prompt), rest.parquet (the C4 schedule of the prompts remaining then), full.parquet (the C4 schedule of all
training prompts) and report.json; a rejected one only profile.parquet and report.json (accepted false).
`latest_accepted` reads the newest accepted version back (the drift watch applies it when a run resumes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from asp.config import Params
from asp.io import read_json
from asp.predictor.calibration import CalibrationMap
from asp.runtime import WorkPlan
from asp.schedule import schedule_to_frame
from asp.steps.scheduling import schedule_predictions

VERSIONS_DIR = "predictors"
REPORT = "report.json"
VERSION_RE = re.compile(r"v(\d+)")


class Accepted(NamedTuple):
    """The newest accepted version: the plan of the remaining prompts, the plan for later passes, the predictions
    (prompt_id, predicted_length, calibrated_length) and the calibration map."""

    version: int
    rest: WorkPlan | None
    full: WorkPlan
    predictions: pd.DataFrame
    calibration: CalibrationMap | None


def version_dir(state_dir: Path, version: int) -> Path:
    return Path(state_dir) / VERSIONS_DIR / f"v{version}"


def versions(state_dir: Path) -> dict[int, dict[str, Any]]:
    """Version number -> report of every ``predictors/v<k>`` under `state_dir` (accepted or not)."""
    root = Path(state_dir) / VERSIONS_DIR
    found = {}
    for d in root.iterdir() if root.is_dir() else []:
        m = VERSION_RE.fullmatch(d.name)
        if m and (d / REPORT).is_file():
            found[int(m.group(1))] = read_json(d / REPORT)
    return found


def newest_accepted_version(state_dir: Path) -> int:
    """The newest accepted version (1: only the pipeline's predictor)."""
    return max([k for k, r in versions(state_dir).items() if r.get("accepted")], default=1)


def latest_accepted(state_dir: Path) -> Accepted | None:
    """The newest accepted re-profile under `state_dir`, read back; None when there is none."""
    version = newest_accepted_version(state_dir)
    if version == 1:
        return None
    d = version_dir(state_dir, version)
    rest = WorkPlan.from_frame(pd.read_parquet(d / "rest.parquet")) if (d / "rest.parquet").is_file() else None
    return Accepted(
        version,
        rest,
        WorkPlan.from_frame(pd.read_parquet(d / "full.parquet")),
        pd.read_parquet(d / "predictions.parquet"),
        CalibrationMap.from_dict(read_json(d / "calibration.json")),
    )


def schedule_frame(params: Params, preds: pd.DataFrame, calibration: CalibrationMap | None) -> pd.DataFrame:
    """The C4 schedule (`schedule:` params, calibrated loads) of `preds`' prompts in the schedule Parquet layout."""
    return schedule_to_frame(schedule_predictions(params, preds, calibration, condition="C4"))
