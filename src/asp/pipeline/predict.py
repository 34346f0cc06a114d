"""`predict` stage: predicted (and calibrated) response length of every training prompt.

Writes outputs/predictions.parquet (prompt_id, predicted_length, calibrated_length) for the scheduler and
reports prompts/s. With ``predict.actors`` > 1 (or ``runtime``) the prompts are sharded over Ray predictor actors
(`asp.runtime.profile_actors.predict_sharded`: the same batches, so the same predictions); the predictor is then
loaded only in the actors, never in this process.

Run: `asp stage predict` (what `dvc repro predict` calls).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import pandas as pd

from asp.config import Params
from asp.errors import UserError
from asp.io import read_json, write_json, write_parquet
from asp.predictor.calibration import CalibrationMap
from asp.progress import progress_bar
from asp.runtime import RuntimeConfig
from asp.runtime.profile_actors import predict_sharded
from asp.steps.loaders import load_trained_predictor
from asp.steps.paths import PredictPaths as Paths
from asp.tracking import Tracker


def load_inputs(params: Params, paths: Paths) -> tuple[Any, Any, pd.DataFrame, str, Any]:
    """The trained predictor and its tokenizer, the training prompts, their text column and the calibration map."""
    model, tokenizer, meta = load_trained_predictor(paths.predictor, params.predictor)
    prompts, text_field, calibration = load_prompts(params, paths, meta)
    return model, tokenizer, prompts, text_field, calibration


def load_prompts(params: Params, paths: Paths, meta: dict[str, Any]) -> tuple[pd.DataFrame, str, Any]:
    """The training prompts, their text column (the predictor's `meta`, else params) and the calibration map."""
    for path, stage in ((paths.prompts, "prepare"), (paths.calibration, "evaluate")):
        if not path.is_file():
            raise UserError(f"{path}: missing. Run the {stage} stage first (`dvc repro {stage}`).")
    text_field = meta.get("text_field", params.predictor.text_field)
    prompts = pd.read_parquet(paths.prompts, columns=["prompt_id", text_field])
    calibration = CalibrationMap.from_dict(read_json(paths.calibration))
    return prompts, text_field, calibration


def predict_on_actors(params: Params, paths: Paths) -> tuple[pd.DataFrame, Any, np.ndarray, int, float]:
    """`predict.actors` > 1: (prompts, calibration, predicted lengths [n], truncated prompts, seconds predicting),
    the prompts sharded over Ray predictor actors that each load the predictor."""
    from asp.steps.checkpoint import read_predictor_info

    prompts, text_field, calibration = load_prompts(params, paths, read_predictor_info(paths.predictor)["meta"])
    loader = functools.partial(load_trained_predictor, paths.predictor, params.predictor)
    t0 = time.perf_counter()
    with progress_bar(total=len(prompts), desc="predict", unit="prompt") as bar:
        logp, n_truncated = predict_sharded(
            RuntimeConfig.from_params(params),
            params.predict.actors,
            loader,
            prompts[text_field].tolist(),
            params.predict.batch_size,
            progress=bar.update,
        )
    return prompts, calibration, np.maximum(np.expm1(logp), 0.0), n_truncated, time.perf_counter() - t0


def predict_all(model: Any, tokenizer: Any, texts: list[str], batch_size: int) -> tuple[np.ndarray, int]:
    """Predicted mean response lengths (tokens) [n] of `texts`, with a progress bar; and how many were truncated."""
    from asp.predictor.model import pad_token_id
    from asp.predictor.train import predict_encoded

    enc = model.encode(tokenizer, texts)
    with progress_bar(total=len(texts), desc="predict", unit="prompt") as bar:
        logp = predict_encoded(
            model,
            enc,
            batch_size=batch_size,
            pad_id=pad_token_id(tokenizer),
            pad_side=tokenizer.padding_side,
            progress=lambda done, total: bar.update(done - bar.n),
        )
    return np.maximum(np.expm1(logp), 0.0), enc.n_truncated


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Predict every training prompt's length in batches; write Parquet; log prompts/s."""
    if params.predict.actors == 1:
        model, tokenizer, prompts, text_field, calibration = load_inputs(params, paths)
        t0 = time.perf_counter()
        predicted, n_truncated = predict_all(model, tokenizer, prompts[text_field].tolist(), params.predict.batch_size)
        elapsed = time.perf_counter() - t0
    else:
        prompts, calibration, predicted, n_truncated, elapsed = predict_on_actors(params, paths)
    out = pd.DataFrame(
        {"prompt_id": prompts["prompt_id"], "predicted_length": predicted, "calibrated_length": calibration(predicted)}
    )
    write_parquet(out, paths.out)
    metrics = {
        "predict/prompts": len(out),
        "predict/prompts_per_s": len(out) / max(elapsed, 1e-9),
        "predict/truncated_prompts": int(n_truncated),
        "predict/mean_predicted_length": float(predicted.mean()),
    }
    write_json(metrics, paths.metrics)
    tracker.log_params({"predict": params.predict.model_dump()})
    tracker.log_metrics(metrics)
    return metrics
