"""Reading length / prediction files for the scheduler CLI and stage (the only file I/O in asp.schedule).

Accepted: Parquet (.parquet/.pq), CSV (.csv), JSON (.json: a list of records or a {column: [values]} object)
and JSON Lines (.jsonl/.ndjson). Columns: prompt_id (optional; row number if absent), predicted_length,
true_length (optional), or just `length` (treated as the true length). Calibration files: JSON
{"x": [...], "y": [...]} or a CSV/Parquet with columns x, y (or predicted, expected).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd

from asp.errors import UserError


class Lengths(TypedDict):
    """What `read_lengths` reads: (n,) prompt ids and the length columns the file has (None where it has not)."""

    prompt_id: np.ndarray
    predicted_length: np.ndarray | None
    true_length: np.ndarray | None


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a Parquet/CSV/JSON/JSONL file into a DataFrame; UserError on a missing or unreadable file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found; give a Parquet, CSV, JSON or JSONL file of lengths")
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
        if suffix == ".csv":
            return pd.read_csv(path)
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True)
        if suffix == ".json":
            data = json.loads(path.read_text())
            return pd.DataFrame(data)
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: could not be read as {suffix[1:]}: {exc}") from None
    raise UserError(f"{path}: unknown extension {suffix!r}; use .parquet, .csv, .json or .jsonl")


def _numeric(df: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """The column as float64 lengths; UserError naming the first row that is not a number in (0, MAX_LENGTH]."""
    from asp.schedule.validate import MAX_LENGTH, MAX_LENGTH_TEXT

    values = pd.to_numeric(df[column], errors="coerce").to_numpy(np.float64)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(values) | (values <= 0) | (values > MAX_LENGTH))
    if bad.size:
        row = int(bad[0])
        value = df[column].iloc[row]
        value = value.item() if hasattr(value, "item") else value
        raise UserError(
            f"{path}: column {column!r} row {row} (0-based) has value {value!r}; "
            f"lengths must be finite numbers > 0 and <= {MAX_LENGTH_TEXT} tokens ({bad.size} bad rows in all)"
        )
    return values


def read_lengths(path: str | Path, *, need_predictions: bool) -> Lengths:
    """Load prompt ids, predicted and true lengths from a file.

    Args:
        path: the file.
        need_predictions: require a predicted_length column (build, ablation without --tau).

    Returns:
        {"prompt_id": (n,), "predicted_length": (n,) or None, "true_length": (n,) or None}.

    Raises:
        UserError: missing file/columns, empty file, non-numeric, non-positive or huge (> 1e15) lengths,
            duplicate ids.
    """
    path = Path(path)
    df = read_table(path)
    if df.empty:
        raise UserError(f"{path}: no rows; the file must hold at least one prompt")
    true_col = "true_length" if "true_length" in df.columns else "length" if "length" in df.columns else None
    if need_predictions and "predicted_length" not in df.columns:
        raise UserError(f"{path}: needs a 'predicted_length' column; found columns {list(df.columns)}")
    if "predicted_length" not in df.columns and true_col is None:
        raise UserError(f"{path}: needs 'predicted_length', 'true_length' or 'length'; found {list(df.columns)}")
    ids = df["prompt_id"].to_numpy() if "prompt_id" in df.columns else np.arange(len(df))
    if pd.Series(ids).duplicated().any():
        dup = pd.Series(ids)[pd.Series(ids).duplicated()].iloc[0]
        raise UserError(f"{path}: prompt_id {dup!r} appears more than once; ids must be unique")
    pred = _numeric(df, "predicted_length", path) if "predicted_length" in df.columns else None
    true = _numeric(df, true_col, path) if true_col else None
    return {"prompt_id": ids, "predicted_length": pred, "true_length": true}


def read_calibration(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Calibration knots (x, y) from JSON {"x", "y"} or a table with columns x, y / predicted, expected."""
    path = Path(path)
    if path.suffix.lower() == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: invalid JSON: {exc}") from None
        if isinstance(data, dict) and {"x", "y"} <= set(data):
            return np.asarray(data["x"], dtype=np.float64), np.asarray(data["y"], dtype=np.float64)
    df = read_table(path)
    for xc, yc in (("x", "y"), ("predicted", "expected")):
        if {xc, yc} <= set(df.columns):
            return df[xc].to_numpy(np.float64), df[yc].to_numpy(np.float64)
    raise UserError(f"{path}: calibration needs keys/columns x and y (or predicted and expected)")
