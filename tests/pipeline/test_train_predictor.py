"""train_predictor stage: MiniLM + LoRA, one epoch on 24 profiled prompts (max_length 32). It trains on the
`profile` prompts only (never the held-out ones), counts truncated prompts, saves a predictor the shared loader
reads back, and logs its curves; too few prompts or a missing profile is a clear error before any training."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.errors import UserError
from asp.pipeline import train_predictor
from asp.predictor.train import predict_lengths
from asp.steps.paths import rebase
from asp.tracking import NullTracker

from .conftest import N_PROFILE, TINY_PREDICTOR, Built, artifact_paths, make_params, read_metrics


def test_trains_on_the_profile_role_only_and_reports_counts(trained_predictor: Built, loaded_predictor: tuple) -> None:
    m = trained_predictor.metrics
    n_val = max(2, round(0.15 * N_PROFILE))  # predictor.val_fraction of the profiled prompts
    assert (m["predictor/train_prompts"], m["predictor/val_prompts"]) == (N_PROFILE - n_val, n_val)  # not + held-out
    assert m["predictor/epochs_run"] == 1 and m["predictor/best_epoch"] == 1
    assert math.isnan(m["predictor/best_val_tau"]) or -1 <= m["predictor/best_val_tau"] <= 1
    _, tokenizer, _ = loaded_predictor
    texts = trained_predictor.extra["frames"]["profile"]["problem"].tolist()
    n_long = sum(len(ids) > TINY_PREDICTOR["max_length"] for ids in tokenizer(texts)["input_ids"])
    assert 0 < n_long < N_PROFILE and m["predictor/truncated_prompts"] == n_long
    assert read_metrics(trained_predictor.paths.metrics) == pytest.approx(m, nan_ok=True)


def test_saved_predictor_loads_and_predicts(trained_predictor: Built, loaded_predictor: tuple) -> None:
    model, tokenizer, meta = loaded_predictor
    assert model.spec.max_length == TINY_PREDICTOR["max_length"] and meta["text_field"] == "problem"
    assert [h["epoch"] for h in meta["history"]] == [1]
    assert meta["predictor/train_prompts"] == trained_predictor.metrics["predictor/train_prompts"]
    texts = trained_predictor.extra["frames"]["heldout"]["problem"].tolist()
    pred = predict_lengths(model, tokenizer, texts, batch_size=64)
    assert pred.shape == (len(texts),) and np.isfinite(pred).all() and (pred > 0).all()
    # the head starts at the mean log target and trains one epoch: predictions stay in the data's range
    true = trained_predictor.extra["stats"]["mean_length"]
    assert true.min() / 3 < np.median(pred) < true.max() * 3


def test_logs_params_curves_and_the_model(trained_predictor: Built) -> None:
    tracker, m = trained_predictor.tracker, trained_predictor.metrics
    run = tracker.client.get_run(tracker.run_id).data
    assert run.params["predictor.max_length"] == "32" and run.params["predictor.epochs"] == "1"
    assert run.metrics["predictor/train_prompts"] == m["predictor/train_prompts"]
    curve = tracker.client.get_metric_history(tracker.run_id, "predictor/train_loss")
    assert [p.step for p in curve] == [1] and np.isfinite(curve[0].value) and curve[0].value > 0
    saved = artifact_paths(tracker, "predictor")
    weights = (
        "predictor/backbone.safetensors" if trained_predictor.params.predictor.lora.r == 0 else "predictor/adapter"
    )
    assert {"predictor/predictor.json", "predictor/head.safetensors", weights} <= saved
    assert trained_predictor.paths.plot.is_file() and f"plots/{trained_predictor.paths.plot.name}" in artifact_paths(
        tracker, "plots"
    )


def _inputs(root: Path, n: int) -> train_predictor.Paths:
    paths = rebase(train_predictor.Paths(), root)
    prompts = pd.DataFrame(
        {"prompt_id": [f"q{i}" for i in range(n)], "problem": [f"Add mod 10: A{i}" for i in range(n)]}
    )
    for d in (paths.prompts, paths.profile):
        d.mkdir(parents=True)
    prompts.to_parquet(paths.prompts / "profile.parquet", index=False)
    stats = pd.DataFrame({"prompt_id": prompts["prompt_id"], "mean_length": 10.0 + np.arange(n)})
    stats.to_parquet(paths.profile / "prompts.parquet", index=False)
    return paths


def test_too_few_prompts_or_no_profile_is_a_clear_error(tmp_path: Path) -> None:
    paths = _inputs(tmp_path, 3)  # 2 go to validation, 1 would be left to train on
    params = make_params({"predictor": TINY_PREDICTOR})
    with pytest.raises(UserError, match=r"only 3 profiled prompts; raise prepare\.profile_prompts"):
        train_predictor.run(params, paths, NullTracker())
    (paths.profile / "prompts.parquet").unlink()
    with pytest.raises(UserError, match=r"prompts\.parquet: missing\. Run the profile stage first"):
        train_predictor.run(params, paths, NullTracker())
    assert not paths.out_dir.exists() and not paths.metrics.exists()
