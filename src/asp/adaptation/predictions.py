"""`Predictions`: one predictor version's raw and calibrated predicted lengths per prompt, what the drift watch
compares realized lengths with (version 1: outputs/predictions.parquet; later ones: accepted re-profiles).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from asp.predictor.calibration import CalibrationMap

MIN_LOAD = 1.0  # tokens: a calibrated length is at least this (the monitor needs predictions > 0)


@dataclass(frozen=True)
class Predictions:
    """Per-prompt raw and calibrated predicted lengths (tokens) of one predictor version."""

    raw: dict[Hashable, float]
    calibrated: dict[Hashable, float]
    version: int = 1

    @classmethod
    def from_frame(
        cls, frame: pd.DataFrame, version: int = 1, calibration: CalibrationMap | None = None
    ) -> Predictions:
        """From a predictions table (prompt_id, predicted_length[, calibrated_length]); `calibration`, when
        given, recomputes the calibrated lengths; without either the raw ones are used."""
        ids = frame["prompt_id"].tolist()
        raw = frame["predicted_length"].to_numpy(np.float64)
        if calibration is not None:
            cal = calibration(raw)
        elif "calibrated_length" in frame.columns:
            cal = frame["calibrated_length"].to_numpy(np.float64)
        else:
            cal = raw
        cal = np.maximum(cal, MIN_LOAD)
        return cls(dict(zip(ids, raw.tolist(), strict=True)), dict(zip(ids, cal.tolist(), strict=True)), version)

    def recalibrated(self, calibration: CalibrationMap) -> Predictions:
        """The same raw predictions through a new calibration map."""
        ids = list(self.raw)
        cal = np.maximum(calibration(np.array([self.raw[p] for p in ids], dtype=np.float64)), MIN_LOAD)
        return Predictions(self.raw, dict(zip(ids, cal.tolist(), strict=True)), self.version)
