"""Generation and training time models: hand-computed values, coefficient recovery, validation, real timings.

Run: ``.venv/bin/python -m pytest tests/sim/test_timemodel.py -q`` (``-s`` prints the fit on the real profile).
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.sim.timemodel import (
    FEATURES,
    FLOOR_S,
    GenerationTimeModel,
    TrainingTimeModel,
    drift_doubtful,
    fit_generation_model,
    fit_training_model,
    speed_drift,
)

REAL_TIMINGS = Path(__file__).resolve().parents[2] / "metrics" / "profile_timings.csv"
COEF = (0.3, 0.01, 2e-4, 1e-4, 2e-7)


def model(form: str, coef=COEF) -> GenerationTimeModel:
    return GenerationTimeModel(form=form, coef=tuple(coef), feature_names=FEATURES[form])


def synthetic_timings(form: str, m: int = 80, noise: float = 0.01, seed: int = 1) -> pd.DataFrame:
    """Minibatches of 8-24 prompts x 4/8 samples timed by `model(form)` with `noise` relative noise."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(8, 25, m)
    n = rng.choice([4, 8], m)
    max_length = rng.integers(20, 400, m)
    total = (prompts * n * max_length * rng.uniform(0.3, 0.9, m)).astype(int)
    prompt_tokens = prompts * rng.integers(20, 200, m)
    wall = model(form).seconds_many(prompts, n, max_length, total, prompt_tokens) * (1 + noise * rng.normal(size=m))
    return pd.DataFrame(
        {
            "minibatch": np.arange(m),
            "wall_s": wall,
            "num_prompts": prompts,
            "n": n,
            "max_new_tokens": 400,
            "total_tokens": total,
            "max_length": max_length,
            "prompt_tokens": prompt_tokens,
        }
    )


def test_seconds_hand_computed():
    # prompts 2, n 4 -> R = 8 rows; S = 10 steps; T = 50; prompt_tokens 20 -> mean prompt p = 10.
    coef = (0.1, 0.01, 0.001, 0.0001, 1e-6)
    # static: [1, S, R*S, n*pt, R*S*(p + S/2)] = [1, 10, 80, 80, 8*10*15 = 1200]
    #   0.1 + 0.1 + 0.08 + 0.008 + 0.0012 = 0.2892
    assert model("static", coef).seconds(2, 4, 10, 50, 20) == pytest.approx(0.2892)
    # continuous: [1, S, T, pt, T*(p + T/(2R))] = [1, 10, 50, 20, 50*(10 + 50/16) = 656.25]
    #   0.1 + 0.1 + 0.05 + 0.002 + 0.00065625 = 0.25265625
    assert model("continuous", coef).seconds(2, 4, 10, 50, 20) == pytest.approx(0.25265625)
    many = model("static", coef).seconds_many(np.array([2, 2]), 4, np.array([10, 0]), 50, 20)
    assert many[0] == pytest.approx(0.2892) and many[1] >= FLOOR_S
    assert model("static", (0.0,) * 5).seconds(1, 1, 1, 1, 1) == FLOOR_S


@pytest.mark.parametrize("form", ["static", "continuous"])
def test_fit_recovers_coefficients(form):
    fitted, report = fit_generation_model(synthetic_timings(form), form, folds=5, seed=0)
    np.testing.assert_allclose(fitted.coef, COEF, rtol=0.15)
    assert report["r2_heldout"] > 0.99 and report["mdape_heldout"] < 0.02
    assert report["minibatches"] == 80 and report["folds"] == 5


def test_fit_is_deterministic_for_a_seed():
    frame = synthetic_timings("static", noise=0.05)
    assert (
        fit_generation_model(frame, "static", seed=3, folds=5)[1]
        == fit_generation_model(frame, "static", seed=3, folds=5)[1]
    )


def test_collinear_rows_split_between_step_and_row_terms():
    frame = synthetic_timings("static").assign(num_prompts=16, n=8)  # rows constant: R*S proportional to S
    frame["wall_s"] = 0.02 * frame["max_length"] + 0.5
    fitted, _ = fit_generation_model(frame, "static", folds=5, seed=0)
    assert fitted.coef[1] > 0 and fitted.coef[2] > 0  # neither term dropped
    t16, t18 = (fitted.seconds(p, 8, 100, 100 * p * 4, 30 * p) for p in (16, 18))
    assert 1.0 < t18 / t16 < 18 / 16 + 1e-9


@pytest.mark.parametrize("form", ["static", "continuous"])
def test_round_trip(form):
    m = model(form)
    assert GenerationTimeModel.from_dict(m.to_dict()) == m
    t = TrainingTimeModel(0.5, 1e-4, 0.2, 0.1, 0.3, step_per_sample_s=0.0)
    assert TrainingTimeModel.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"form": "paged"}, "form"),
        ({"coef": [0.1, -1.0, 0.0, 0.0, 0.0]}, "decode_steps"),
        ({"coef": [0.1, float("nan"), 0.0, 0.0, 0.0]}, "decode_steps"),
        ({"coef": [0.1, 0.2]}, "5 values"),
        ({"feature_names": ["a", "b", "c", "d", "e"]}, "feature_names"),
        ({"extra": 1}, "extra"),
        ({"coef": 0.5}, "coef must be a list"),
    ],
)
def test_generation_from_dict_rejects(change, message):
    with pytest.raises(ValueError, match=message):
        GenerationTimeModel.from_dict({**model("static").to_dict(), **change})


def test_training_from_dict_rejects():
    good = TrainingTimeModel(0.5, 1e-4, 0.0, 0.0, 0.0, step_per_sample_s=0.0).to_dict()
    with pytest.raises(ValueError, match="save_s"):
        TrainingTimeModel.from_dict({**good, "save_s": -1})
    with pytest.raises(ValueError, match="load_s"):
        TrainingTimeModel.from_dict({**good, "load_s": float("inf")})
    with pytest.raises(ValueError, match="missing keys \\['convert_s'\\]"):
        TrainingTimeModel.from_dict({k: v for k, v in good.items() if k != "convert_s"})


def test_fit_generation_rejects_bad_frames():
    frame = synthetic_timings("static", m=20)
    with pytest.raises(ValueError, match="max_length"):
        fit_generation_model(frame.drop(columns="max_length"), "static", folds=5, seed=0)
    with pytest.raises(ValueError, match="at least 7"):
        fit_generation_model(frame.head(6), "static", folds=5, seed=0)
    with pytest.raises(ValueError, match="at least 10"):
        fit_generation_model(frame.head(9), "static", folds=10, seed=0)
    with pytest.raises(ValueError, match="row 3"):
        fit_generation_model(
            frame.assign(wall_s=np.where(frame.index == 3, 0.0, frame.wall_s)), "static", folds=5, seed=0
        )
    with pytest.raises(ValueError, match="form"):
        fit_generation_model(frame, "paged", folds=5, seed=0)


def real_profile_timings() -> pd.DataFrame:
    """metrics/profile_timings.csv, a profile-stage output committed to git: the working copy, or (while a profile
    run is rewriting it) the committed one. Never skipped: a checkout without it fails here."""
    if REAL_TIMINGS.exists():
        return pd.read_csv(REAL_TIMINGS)
    root = REAL_TIMINGS.parents[1]
    shown = subprocess.run(
        ["git", "show", f"HEAD:{REAL_TIMINGS.relative_to(root).as_posix()}"], cwd=root, capture_output=True, text=True
    )
    assert shown.returncode == 0, f"{REAL_TIMINGS} is absent and not committed: {shown.stderr.strip()}"
    return pd.read_csv(io.StringIO(shown.stdout))


def test_speed_drift_hand_worked():
    predicted = np.full(10, 2.0)
    # five parts of two rows; the last ran 20 % slower than the others: 1.2 / 1.0 - 1
    measured = predicted * np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.2])
    assert speed_drift(measured, predicted) == pytest.approx(0.2)
    assert speed_drift(3.0 * predicted, predicted) == pytest.approx(0.0)  # uniformly slower is not drift
    assert speed_drift(measured[:9], predicted[:9]) == 0.0  # under two rows per part
    # the median of each part: one outlier row in a part of three does not move it
    assert speed_drift(np.array([1, 1, 5, 1, 1, 1.0]), np.ones(6), parts=2) == pytest.approx(0.0)
    assert drift_doubtful(0.2) and not drift_doubtful(0.15) and not drift_doubtful(0.0)  # warned above 15 %


def test_fit_reports_the_profiles_speed_drift():
    steady = synthetic_timings("static", noise=0.01)
    _, report = fit_generation_model(steady, "static", folds=5, seed=0)
    assert report["speed_drift"] < 0.05
    slowed = steady.copy()
    slowed.loc[40:, "wall_s"] *= 1.3  # the machine 30 % slower from the middle of the profile on
    _, report = fit_generation_model(slowed, "static", folds=5, seed=0)
    assert report["speed_drift"] > 0.15


def test_fit_on_real_profile_timings():
    frame = real_profile_timings()
    assert len(frame) >= 7  # enough rows for the fit's folds: a truncated file fails here, not by a skip
    for form in ("static", "continuous"):
        fitted, report = fit_generation_model(frame, form, folds=5, seed=0)
        print(form, {k: round(v, 3) for k, v in report.items()}, fitted.coef)
    fitted, report = fit_generation_model(frame, "static", folds=5, seed=0)
    assert report["r2_heldout"] > 0.5
    row = frame.iloc[0]
    t16 = fitted.seconds(16, 8, row.max_length, row.total_tokens, row.prompt_tokens)
    t18 = fitted.seconds(18, 8, row.max_length, row.total_tokens * 18 / 16, row.prompt_tokens * 18 / 16)
    assert t16 <= t18 < 2 * t16


def synthetic_iterations(steps: int = 60, window: int = 10, seed: int = 0) -> pd.DataFrame:
    """GRPO-like table: per-step time 0.8 s + 2e-4 s/token, reported as a trailing mean of `window` steps."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2_000, 12_000, steps).astype(float)
    per_step = 0.8 + 2e-4 * tokens + rng.normal(0, 0.01, steps)
    save = np.where(np.arange(steps) < 2, 0.0, 0.3)  # 0 until the first export, as the trainer reports it
    return pd.DataFrame(
        {
            "step": np.arange(1, steps + 1),
            "train/t_train_s": pd.Series(per_step).rolling(window, 1).mean(),
            "train/response_tokens": tokens,
            "train/prompts": 16,
            "train/t_save_s": save,
            "train/t_convert_s": 0.05,
            "train/t_load_s": np.where(np.arange(steps) < 3, 0.0, 0.4),
            "runtime/generated_tokens": tokens[::-1],
        }
    ).sample(frac=1.0, random_state=0)  # order restored from `step`


def test_fit_training_model_recovers_step_time():
    fitted, report = fit_training_model(synthetic_iterations(), n_samples=8)
    assert fitted.step_base_s == pytest.approx(0.8, abs=0.05)
    assert fitted.step_per_token_s == pytest.approx(2e-4, rel=0.05)
    assert (fitted.save_s, fitted.convert_s, fitted.load_s) == pytest.approx((0.3, 0.05, 0.4))
    assert fitted.publish_seconds() == pytest.approx(0.35)
    assert fitted.step_seconds(10_000) == pytest.approx(2.8, rel=0.03)
    assert report["r2_in_sample"] > 0.95 and report["steps"] == 60


def test_fit_training_model_rejects_missing_columns():
    with pytest.raises(ValueError, match="train/response_tokens"):
        fit_training_model(synthetic_iterations().drop(columns="train/response_tokens"), n_samples=8)
    with pytest.raises(ValueError, match="at least 3"):
        fit_training_model(synthetic_iterations().head(2), n_samples=8)


def test_simulated_training_model():
    t = TrainingTimeModel.simulated(step_s=0.5, refresh_delay_s=0.2)
    assert t.step_seconds(1e6) == 0.5 and t.publish_seconds() == 0.0 and t.load_s == 0.2


def test_old_training_dicts_load_without_the_per_sample_term():
    old = {"step_base_s": 0.6, "step_per_token_s": 1e-5, "save_s": 0.0, "convert_s": 0.0, "load_s": 0.0}
    t = TrainingTimeModel.from_dict(old)
    assert t.step_per_sample_s == 0.0 and t.step_seconds(1000, samples=128) == pytest.approx(0.61)


def test_step_seconds_hand_worked():
    t = TrainingTimeModel(0.5, 1e-4, 0.2, 0.1, 0.3, step_per_sample_s=2e-3)
    # 0.5 + 1e-4 * 4000 + 2e-3 * 128 = 0.5 + 0.4 + 0.256
    assert t.step_seconds(4000, 128) == pytest.approx(1.156)
    assert t.step_seconds(8000, 256) == pytest.approx(0.5 + 0.8 + 0.512)  # twice the batch: all but the base
    assert TrainingTimeModel.from_dict(t.to_dict()) == t


def _launch(prompts: int, n: int, seed: int, steps: int = 40) -> pd.DataFrame:
    """One launch's iterations: per step 0.3 s + 1e-3 s per sequence + 1e-4 s per token, trailing mean of 10."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(20, 60, steps) * prompts * n * 1.0
    per_step = 0.3 + 1e-3 * prompts * n + 1e-4 * tokens
    return pd.DataFrame(
        {
            "step": np.arange(1, steps + 1),
            "train/t_train_s": pd.Series(per_step).rolling(10, 1).mean(),
            "train/response_tokens": tokens,
            "train/prompts": prompts,
            "train/t_save_s": 0.01,
            "train/t_convert_s": 0.0,
            "train/t_load_s": 0.002,
        }
    )


def test_one_batch_size_prices_a_prompt_token_as_a_response_token():
    # one launch (16 prompts x 8): 0.3 + 0.128 + 1e-4 x tokens per step; tied, tokens' cost also covers 10 prompt
    # tokens per sequence, so per-sequence = per-token x 10 and the fit is exact at the launch's own batch size
    fitted, report = fit_training_model([_launch(16, 8, 0)], n_samples=8, prompt_tokens_per_sample=10.0)
    assert report["samples_varied"] == 0
    assert fitted.step_per_sample_s == pytest.approx(10 * fitted.step_per_token_s)
    for tokens in (16 * 8 * 20, 16 * 8 * 60):
        assert fitted.step_seconds(tokens, 128) == pytest.approx(0.428 + 1e-4 * tokens, rel=0.02)
    untied, _ = fit_training_model([_launch(16, 8, 0)], n_samples=8)
    assert untied.step_per_sample_s == 0.0


def test_fit_training_on_two_batch_sizes_recovers_the_per_sample_term():
    fitted, report = fit_training_model([_launch(16, 8, 0), _launch(32, 8, 1)], n_samples=8)
    assert report["samples_varied"] == 1 and report["launches"] == 2 and report["steps"] == 80
    assert fitted.step_base_s == pytest.approx(0.3, abs=1e-3)
    assert fitted.step_per_sample_s == pytest.approx(1e-3, rel=1e-2)
    assert fitted.step_per_token_s == pytest.approx(1e-4, rel=1e-3)
    # a third batch size, never fitted: 64 x 8 sequences, 40 tokens each -> 0.3 + 0.512 + 2.048
    assert fitted.step_seconds(64 * 8 * 40, 64 * 8) == pytest.approx(2.86, rel=1e-2)


def test_fit_training_on_one_batch_size_leaves_the_per_sample_term_at_zero():
    fitted, report = fit_training_model(_launch(16, 8, 0), n_samples=8)
    assert report["samples_varied"] == 0 and fitted.step_per_sample_s == 0.0
    assert fitted.step_base_s == pytest.approx(0.3 + 1e-3 * 128, abs=1e-3)  # the per-sample cost sits in the base
    with pytest.raises(ValueError, match="one n_samples per table"):
        fit_training_model([_launch(16, 8, 0)], n_samples=[8, 8])
