"""evaluate stage on the one-epoch MiniLM predictor and 12 profiled held-out prompts (a 13th held-out prompt has no
profile row and is left out). Its metrics equal ones computed here from the predictor's own predictions; the
calibration map is monotone, fitted on all 12 and no worse than raw predictions in squared error; the calibrated MAE
is out of fold (5 folds interleaved by predicted rank, recomputed here with sklearn); the τ gate fires at
min_tau 0.99: an error naming evaluate.min_tau and the measured τ, or only a warning with on_fail: warn."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from sklearn.isotonic import IsotonicRegression

from asp.errors import UserError
from asp.pipeline import evaluate
from asp.predictor.calibration import CalibrationMap, fit_calibration
from asp.predictor.train import predict_lengths
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, NullTracker, end_run

from .conftest import N_HELDOUT, TINY_PREDICTOR, Built, artifact_paths, make_params

EDGES = [16.0, 32.0, 64.0, 128.0]


def _paths(root: Path, trained: Built) -> evaluate.Paths:
    inputs = trained.extra["root"]
    return rebase(
        evaluate.Paths(prompts=inputs / "prompts", profile=inputs / "profile", predictor=trained.paths.out_dir), root
    )


def _params(min_tau: float, on_fail: str) -> Any:
    return make_params(
        {"predictor": TINY_PREDICTOR, "evaluate": {"min_tau": min_tau, "on_fail": on_fail, "bucket_edges": EDGES}}
    )


@pytest.fixture(scope="module")
def evaluated(
    tmp_path_factory: pytest.TempPathFactory, trained_predictor: Built, new_tracker: Callable[[str], MlflowTracker]
) -> Built:
    """evaluate with the gate open (min_tau -1), logged to a real MLflow run."""
    params = _params(-1.0, "error")
    paths = _paths(tmp_path_factory.mktemp("evaluate"), trained_predictor)
    tracker = new_tracker("evaluate")
    metrics = evaluate.run(params, paths, tracker)
    end_run(tracker)
    return Built(params, paths, metrics, tracker, {})


@pytest.fixture(scope="module")
def heldout(trained_predictor: Built, loaded_predictor: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, true) mean lengths of the profiled held-out prompts, predicted here with the loaded model."""
    held = trained_predictor.extra["frames"]["heldout"].merge(trained_predictor.extra["stats"], on="prompt_id")
    model, tokenizer, _ = loaded_predictor
    return predict_lengths(model, tokenizer, held["problem"].tolist(), batch_size=64), held["mean_length"].to_numpy()


def test_metrics_equal_an_independent_computation(evaluated: Built, heldout: tuple[np.ndarray, np.ndarray]) -> None:
    pred, true = heldout
    m = evaluated.metrics
    assert len(true) == N_HELDOUT and m["predictor/heldout_prompts"] == N_HELDOUT and m["predictor/n"] == N_HELDOUT
    assert m["predictor/kendall_tau"] == pytest.approx(stats.kendalltau(pred, true).statistic, abs=1e-6)
    assert m["predictor/spearman"] == pytest.approx(stats.spearmanr(pred, true).statistic, abs=1e-6)
    assert m["predictor/mae_tokens"] == pytest.approx(np.abs(pred - true).mean(), rel=1e-5)
    pairs = list(itertools.combinations(range(len(true)), 2))
    same_order = sum(np.sign(pred[i] - pred[j]) == np.sign(true[i] - true[j]) for i, j in pairs)
    assert m["predictor/pairwise_accuracy"] == pytest.approx(same_order / len(pairs), abs=1e-6)

    written = json.loads(evaluated.paths.metrics.read_text())
    assert {k: v for k, v in written.items() if k not in ("buckets", "gate")} == pytest.approx(m)
    counts, _ = np.histogram(true, bins=EDGES)  # last bucket closed, like numpy's last bin
    assert [b["count"] for b in written["buckets"]] == counts.tolist()


def test_prompt_length_baseline_drift_references_and_gate_are_in_the_metrics(
    evaluated: Built, heldout: tuple[np.ndarray, np.ndarray], loaded_predictor: tuple, trained_predictor: Built
) -> None:
    pred, true = heldout
    m = evaluated.metrics
    held = trained_predictor.extra["frames"]["heldout"].merge(trained_predictor.extra["stats"], on="prompt_id")
    tokens = [len(loaded_predictor[1](t, add_special_tokens=False)["input_ids"]) for t in held["problem"]]
    assert m["predictor/prompt_length_tau"] == pytest.approx(stats.kendalltau(tokens, true).statistic, abs=1e-6)
    out_of_fold = np.empty_like(true)  # the out-of-fold calibrated lengths (5 folds interleaved by predicted rank)
    rank = np.argsort(np.argsort(pred, kind="stable"), kind="stable")
    for f in range(5):
        out_of_fold[rank % 5 == f] = fit_calibration(pred[rank % 5 != f], true[rank % 5 != f])(pred[rank % 5 == f])
    assert m["predictor/bias_reference"] == pytest.approx(true.sum() / out_of_fold.sum(), rel=1e-5)
    assert m["predictor/median_ratio"] == pytest.approx(np.median(true / out_of_fold), rel=1e-5)
    assert 0 < m["predictor/kendall_tau_se"] < 0.5 and 0 < m["predictor/bias_reference_se"] < 0.5
    written = json.loads(evaluated.paths.metrics.read_text())
    assert written["gate"] == {"passed": True, "result": "passed", "min_tau": -1.0, "on_fail": "error"}
    assert m["predictor/gate_passed"] == 1.0
    run = evaluated.tracker.client.get_run(evaluated.tracker.run_id).data
    assert run.metrics["predictor/prompt_length_tau"] == pytest.approx(m["predictor/prompt_length_tau"])
    assert run.metrics["predictor/gate_passed"] == 1.0


def test_free_baselines_from_the_held_out_prompts_own_samples(evaluated: Built, trained_predictor: Built) -> None:
    samples = trained_predictor.extra["samples"]
    held = samples[samples["role"] == "heldout"].sort_values(["prompt_id", "sample"])
    lengths = np.stack([g["length"].to_numpy() for _, g in held.groupby("prompt_id", sort=True)])  # (12, 4)
    m = evaluated.metrics
    history = stats.kendalltau(lengths[:, :2].mean(axis=1), lengths[:, 2:].mean(axis=1)).statistic
    probe = stats.kendalltau(lengths[:, 0], lengths[:, 1:].mean(axis=1)).statistic
    assert m["predictor/history_tau"] == pytest.approx(history, abs=1e-9)
    assert m["predictor/probe_tau"] == pytest.approx(probe, abs=1e-9)
    run = evaluated.tracker.client.get_run(evaluated.tracker.run_id).data
    assert run.metrics["predictor/history_tau"] == pytest.approx(history)


def test_calibration_is_monotone_and_fits_better_than_raw(
    evaluated: Built, heldout: tuple[np.ndarray, np.ndarray]
) -> None:
    pred, true = heldout
    cal = CalibrationMap.from_dict(json.loads(evaluated.paths.calibration.read_text()))  # validates monotone knots
    grid = np.linspace(0.0, 2 * true.max(), 200)
    assert np.all(np.diff(cal(grid)) >= 0)
    calibrated = cal(pred)
    # isotonic least squares: never worse in squared error than the raw predictions (the identity is monotone)
    assert np.mean((calibrated - true) ** 2) <= np.mean((pred - true) ** 2) + 1e-9
    np.testing.assert_allclose(cal.y, fit_calibration(pred, true).y, rtol=1e-5)  # the deployed map: all 12 prompts


def test_calibrated_mae_is_out_of_fold(evaluated: Built, heldout: tuple[np.ndarray, np.ndarray]) -> None:
    pred, true = heldout
    m = evaluated.metrics
    assert m["predictor/calibration_folds"] == 5
    rank = np.argsort(np.argsort(pred, kind="stable"), kind="stable")  # fold of a prompt = its predicted rank mod 5
    out_of_fold = np.empty_like(true)
    for f in range(5):
        held = rank % 5 == f
        iso = IsotonicRegression(out_of_bounds="clip").fit(pred[~held], true[~held])
        out_of_fold[held] = iso.predict(pred[held])
    assert m["predictor/mae_calibrated_tokens"] == pytest.approx(np.abs(out_of_fold - true).mean(), rel=1e-5)
    in_sample = np.abs(fit_calibration(pred, true)(pred) - true).mean()
    assert m["predictor/mae_calibrated_tokens"] > in_sample  # the fit scored on its own prompts looks better


def test_logs_metrics_params_and_artifacts(evaluated: Built) -> None:
    tracker = evaluated.tracker
    run = tracker.client.get_run(tracker.run_id).data
    assert run.metrics["predictor/kendall_tau"] == pytest.approx(evaluated.metrics["predictor/kendall_tau"])
    assert run.params["evaluate.min_tau"] == "-1.0" and run.params["evaluate.on_fail"] == "error"
    assert {"calibration.json", "bucket_errors.json", "plots"} <= artifact_paths(tracker)
    assert evaluated.paths.plot.is_file() and artifact_paths(tracker, "plots") == {
        f"plots/{evaluated.paths.plot.name}"
    }


@pytest.fixture(scope="module")
def gate_error(tmp_path_factory: pytest.TempPathFactory, trained_predictor: Built) -> tuple[evaluate.Paths, str]:
    """evaluate with min_tau 0.99 and on_fail: error: the paths it ran on and its UserError's message."""
    paths = _paths(tmp_path_factory.mktemp("gate_error"), trained_predictor)
    with pytest.raises(UserError) as info:
        evaluate.run(_params(0.99, "error"), paths, NullTracker())
    return paths, str(info.value)


def test_gate_error_names_the_threshold_and_the_measured_tau(
    gate_error: tuple[evaluate.Paths, str], evaluated: Built
) -> None:
    tau = evaluated.metrics["predictor/kendall_tau"]
    assert tau < 0.99  # the one-epoch predictor on noisy targets (the gate must have a reason to fire)
    assert f"held-out Kendall tau {tau:.3f} is below evaluate.min_tau = 0.99" in gate_error[1]
    assert "evaluate.on_fail: warn" in gate_error[1]  # says how to continue anyway


def test_gate_error_writes_nothing_the_next_stage_reads(gate_error: tuple[evaluate.Paths, str]) -> None:
    paths = gate_error[0]
    assert not paths.calibration.exists() and not paths.metrics.exists() and not paths.plot.exists()


def test_gate_warn_continues_with_a_warning(
    tmp_path: Path, trained_predictor: Built, evaluated: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _paths(tmp_path, trained_predictor)
    metrics = evaluate.run(_params(0.99, "warn"), paths, NullTracker())
    tau = evaluated.metrics["predictor/kendall_tau"]
    assert metrics["predictor/kendall_tau"] == pytest.approx(tau, abs=1e-9)  # same predictor, same prompts
    err = capsys.readouterr().err
    assert f"warning: held-out Kendall tau {tau:.3f} is below evaluate.min_tau = 0.99" in err
    written = json.loads(paths.metrics.read_text())
    assert paths.calibration.is_file() and written["predictor/heldout_prompts"] == 12
    assert written["gate"] == {"passed": False, "result": "warned", "min_tau": 0.99, "on_fail": "warn"}
    assert written["predictor/gate_passed"] == 0.0


def test_missing_predictor_is_a_clear_error(tmp_path: Path, trained_predictor: Built) -> None:
    paths = _paths(tmp_path, trained_predictor)
    paths = rebase(evaluate.Paths(prompts=paths.prompts, profile=paths.profile), tmp_path)  # no predictor there
    with pytest.raises(UserError, match="does not exist; run the train_predictor stage first"):
        evaluate.run(_params(-1.0, "error"), paths, NullTracker())
    assert not paths.metrics.exists() and not paths.calibration.exists()
