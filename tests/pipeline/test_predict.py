"""predict stage on the one-epoch MiniLM predictor and the 40 training prompts, with a known calibration map
(expected length = 2 x predicted): one row per training prompt in input order, finite positive lengths that
match evaluate's prediction path at another batch size, calibrated lengths from the map, and exact counts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.errors import UserError
from asp.io import write_json
from asp.pipeline import predict
from asp.predictor.train import predict_lengths
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, NullTracker, end_run

from .conftest import N_TRAIN, TINY_PREDICTOR, Built, make_params

DOUBLE = {"kind": "isotonic", "x": [0.0, 1e6], "y": [0.0, 2e6]}  # calibrated = 2 x predicted
BATCH = 7  # does not divide 40: the last batch is short, and batches differ from evaluate's (64)


def _paths(root: Path, trained: Built) -> predict.Paths:
    paths = rebase(
        predict.Paths(prompts=trained.extra["root"] / "prompts" / "train.parquet", predictor=trained.paths.out_dir),
        root,
    )
    write_json(DOUBLE, paths.calibration)
    return paths


def test_predictions_cover_every_training_prompt(
    tmp_path: Path,
    trained_predictor: Built,
    loaded_predictor: tuple,
    new_tracker: Callable[[str], MlflowTracker],
) -> None:
    paths = _paths(tmp_path, trained_predictor)
    params = make_params({"predictor": TINY_PREDICTOR, "predict": {"batch_size": BATCH}})
    tracker = new_tracker("predict")
    metrics = predict.run(params, paths, tracker)
    end_run(tracker)

    train = trained_predictor.extra["frames"]["train"]
    out = pd.read_parquet(paths.out)
    assert out["prompt_id"].tolist() == train["prompt_id"].tolist() and len(out) == N_TRAIN  # one row each, in order
    pred = out["predicted_length"].to_numpy()
    assert np.isfinite(pred).all() and (pred > 0).all()
    model, tokenizer, _ = loaded_predictor
    # evaluate's path (predict_lengths, batches of 64) gives the same numbers: padding and batching do not leak
    np.testing.assert_allclose(
        pred, predict_lengths(model, tokenizer, train["problem"].tolist(), batch_size=64), rtol=1e-4
    )
    np.testing.assert_allclose(out["calibrated_length"], 2 * pred, rtol=1e-12)

    n_long = sum(len(ids) > TINY_PREDICTOR["max_length"] for ids in tokenizer(train["problem"].tolist())["input_ids"])
    assert n_long > 0 and metrics["predict/truncated_prompts"] == n_long
    assert metrics["predict/prompts"] == N_TRAIN and metrics["predict/prompts_per_s"] > 0
    assert metrics["predict/mean_predicted_length"] == pytest.approx(pred.mean())
    assert json.loads(paths.metrics.read_text()) == pytest.approx(metrics)
    run = tracker.client.get_run(tracker.run_id).data
    assert run.params["predict.batch_size"] == str(BATCH) and run.metrics["predict/prompts"] == N_TRAIN


def test_missing_calibration_is_a_clear_error(tmp_path: Path, trained_predictor: Built) -> None:
    paths = _paths(tmp_path, trained_predictor)
    paths.calibration.unlink()
    with pytest.raises(UserError, match=r"calibration\.json: missing\. Run the evaluate stage first"):
        predict.run(make_params({"predictor": TINY_PREDICTOR}), paths, NullTracker())
    assert not paths.out.exists()
