"""`evaluate` stage: ranking quality of the predictor on held-out profiled prompts, and its calibration.

Computes Kendall τ, Spearman, MAE (tokens), pairwise ordering accuracy and the error per true-length bucket;
writes metrics/predictor.json and a predicted-versus-true scatter plot; fits a monotone calibration map
(isotonic regression of true mean length on prediction) on all held-out prompts, which the scheduler uses to
balance expected loads (outputs/calibration.json). `predictor/mae_calibrated_tokens` is out of sample: K-fold
cross-fitted over the held-out prompts (`asp.predictor.calibration.cross_fit_calibration`), each prompt
calibrated by a map fitted on the other folds; `predictor/calibration_folds` says K.
`predictor/prompt_length_tau` is the baseline beside it: Kendall τ of the prompt's token count (the predictor's
tokenizer, untruncated) against the true mean length on the same prompts. `predictor/bias_reference` is the drift
detector's calibration reference (`drift.bias_reference: auto` reads it): the load ratio (sum of true / sum of
out-of-fold calibrated lengths, `asp.drift.monitor.bias`) on the held-out prompts; `predictor/median_ratio` is the
median per-prompt ratio beside it (below 1 on right-skewed lengths: why the detector does not use it);
`predictor/kendall_tau_se` and `predictor/bias_reference_se` are their standard errors (`asp.drift.reference`), by
which the detector widens its bands.
Free baselines beside the predictor, from the profile's n samples per held-out prompt (`asp.predictor.metrics.
sample_baselines`): `predictor/history_tau` (the mean of half the samples ranking the mean of the others: what an
earlier visit of the same policy knows, which `runtime.history` schedules on from the second pass) and
`predictor/probe_tau` (one sample ranking the others: a group probe); NaN with one sample per prompt.
`evaluate.min_tau` gates the pipeline: below it the stage fails (or warns, `evaluate.on_fail: warn`); the result
is `gate` in metrics/predictor.json (passed, result, min_tau, on_fail) and `predictor/gate_passed` in MLflow.
A predictor that passes (or is let through with a warning) is logged to the stage's MLflow run and registered in
the MLflow Model Registry as a version of `drift.registry_model` with tags kendall_tau, policy_step 0,
predictor_version 1 and run_id (later versions come from re-profiling during launch, `asp.adaptation.reprofile`).

Run: `asp stage evaluate` (what `dvc repro evaluate` calls).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from asp.config import Params
from asp.drift.monitor import bias, median_ratio
from asp.drift.reference import kendall_tau_se, load_ratio_se
from asp.errors import UserError
from asp.io import write_json
from asp.plots import save_figure
from asp.predictor.calibration import CALIBRATION_FOLDS, cross_fit_calibration, fit_calibration
from asp.predictor.metrics import bucket_errors, kendall_tau, ranking_metrics, sample_baselines
from asp.schedule.min_tau import gate_message
from asp.steps.loaders import load_trained_predictor, profiled_texts
from asp.steps.paths import EvaluatePaths as Paths
from asp.tracking import Tracker, register_predictor

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def scatter_figure(pred: np.ndarray, true: np.ndarray, calibrated: np.ndarray, tau: float) -> Figure:
    """Figure: predicted (raw and out-of-fold calibrated) versus true mean response length, log-log, with y = x."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.scatter(true, pred, s=10, alpha=0.6, label="raw prediction")
    ax.scatter(true, calibrated, s=10, alpha=0.6, label="calibrated (out of fold)")
    lo, hi = max(1.0, float(min(true.min(), pred.min()))), float(max(true.max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="true mean length (tokens)",
        ylabel="predicted length (tokens)",
        title=f"Held-out prompts (Kendall τ = {tau:.3f})",
    )
    ax.legend()
    fig.tight_layout()
    return fig


def gate(tau: float, min_tau: float, on_fail: str) -> None:
    """Fail (or warn) when the held-out τ is below `evaluate.min_tau`."""
    if tau >= min_tau:
        return

    msg = gate_message(tau, min_tau)
    if on_fail == "error":
        raise UserError(msg)
    print(f"warning: {msg}", file=sys.stderr)


def gate_result(tau: float, min_tau: float, on_fail: str) -> dict[str, Any]:
    """The gate's outcome as metrics/predictor.json's ``gate``: passed, result (passed | warned | failed), min_tau,
    on_fail."""
    passed = bool(tau >= min_tau)
    result = "passed" if passed else ("warned" if on_fail == "warn" else "failed")
    return {"passed": passed, "result": result, "min_tau": float(min_tau), "on_fail": on_fail}


def load_heldout(params: Params, paths: Paths) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predicted and profiled true mean lengths (tokens) [n] of the held-out prompts, and their prompt lengths in
    tokens of the predictor's tokenizer (untruncated, no special tokens) [n]."""
    from asp.predictor.train import predict_lengths

    model, tokenizer, meta = load_trained_predictor(paths.predictor, params.predictor)
    text_field = meta.get("text_field", params.predictor.text_field)
    texts, true = profiled_texts(paths.prompts, paths.profile, "heldout", text_field)
    pred = predict_lengths(model, tokenizer, texts, batch_size=params.predict.batch_size)
    ids = tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return pred, true, np.array([len(i) for i in ids], dtype=np.float64)


def score(
    pred: np.ndarray, true: np.ndarray, bucket_edges: list[float]
) -> tuple[dict[str, Any], Any, np.ndarray, list[Any]]:
    """Ranking metrics, the calibration map (fitted on all prompts), the out-of-fold calibrated lengths [n] and
    the per-bucket errors of `pred` against `true`; the calibrated MAE is the out-of-fold one."""
    try:
        scores = ranking_metrics(pred, true)
    except ValueError as exc:
        raise UserError(f"cannot evaluate the predictor on {len(true)} held-out prompts: {exc}") from None
    folds = min(CALIBRATION_FOLDS, len(true))
    out_of_fold = cross_fit_calibration(pred, true, folds)
    metrics = {f"predictor/{k}": float(v) for k, v in scores.items()}
    metrics["predictor/heldout_prompts"] = len(true)
    metrics["predictor/mae_calibrated_tokens"] = float(np.mean(np.abs(out_of_fold - true)))
    metrics["predictor/calibration_folds"] = folds
    metrics["predictor/kendall_tau_se"] = kendall_tau_se(pred, true)
    metrics["predictor/bias_reference"] = bias(out_of_fold, true)
    metrics["predictor/bias_reference_se"] = load_ratio_se(out_of_fold, true)
    metrics["predictor/median_ratio"] = median_ratio(out_of_fold, true)
    return metrics, fit_calibration(pred, true), out_of_fold, bucket_errors(pred, true, bucket_edges)


def heldout_samples(profile_dir: Path) -> list[np.ndarray]:
    """Each profiled held-out prompt's sample lengths in sample order (samples.parquet), by prompt id."""
    path = profile_dir / "samples.parquet"
    if not path.is_file():
        raise UserError(f"{path}: missing. Run the profile stage first (`dvc repro profile`).")
    df = pd.read_parquet(path, columns=["prompt_id", "role", "sample", "length"])
    df = df[df["role"] == "heldout"].sort_values(["prompt_id", "sample"], kind="stable")
    return [g["length"].to_numpy(dtype=np.float64) for _, g in df.groupby("prompt_id", sort=True)]


def free_baselines(paths: Paths) -> dict[str, float]:
    """``predictor/history_tau`` and ``predictor/probe_tau`` of the held-out prompts' own samples."""
    base = sample_baselines(heldout_samples(paths.profile))
    return {"predictor/history_tau": base["history_tau"], "predictor/probe_tau": base["probe_tau"]}


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Evaluate on held-out prompts, fit and save the calibration map, apply the τ gate."""
    evaluation = params.evaluate

    pred, true, prompt_tokens = load_heldout(params, paths)
    metrics, calibration, out_of_fold, buckets = score(pred, true, evaluation.bucket_edges)
    metrics["predictor/prompt_length_tau"] = kendall_tau(prompt_tokens, true)  # NaN when all prompts are as long
    metrics.update(free_baselines(paths))
    tau = metrics["predictor/kendall_tau"]
    outcome = gate_result(tau, evaluation.min_tau, evaluation.on_fail)
    metrics["predictor/gate_passed"] = float(outcome["passed"])
    tracker.log_params({"evaluate": evaluation.model_dump()})
    tracker.log_metrics(metrics)  # the failed run still shows why
    tracker.log_dict({"buckets": buckets}, "bucket_errors.json")
    gate(tau, evaluation.min_tau, evaluation.on_fail)  # before any file: a rejected predictor leaves nothing behind
    write_json(calibration.to_dict(), paths.calibration)
    write_json({**metrics, "gate": outcome, "buckets": buckets}, paths.metrics)
    save_figure(scatter_figure(pred, true, out_of_fold, tau), paths.plot, tracker)
    tracker.log_artifact(paths.calibration)
    register_predictor(
        tracker,
        params.drift.registry_model,
        paths.predictor,
        {
            "kendall_tau": tau,
            "policy_step": 0,
            "predictor_version": 1,
            "gate": outcome["result"],
        },
        artifact_path="predictor",
    )
    return metrics
