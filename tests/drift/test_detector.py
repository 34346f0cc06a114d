"""The drift detector: each rule on hand-made window metrics (tau floor, bias band, both widened by the references'
standard errors, trend with R^2, min_prompts, patience, cooldown), its settings being fields of `drift:` in the
params, and on synthetic streams skewed like real lengths (tests/drift/synthetic.py, fixed seeds; the references
measured by the evaluate stage's code): no more than one firing in 1,000 stationary windows, a 20 % length shift
confirmed within K_SHIFT windows and a tau drop of 0.15 within K_TAU windows. Real streams:
tests/drift/test_real_streams.py. `drift:` values that cannot hold make `asp params check` exit 2 naming the
key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asp.drift import SETTINGS, DriftDetector
from tests.drift import synthetic
from tests.drift.synthetic import PARAMS

ROOT = Path(__file__).resolve().parents[2]
K_SHIFT = 9  # windows after a 20 % length shift until the detector fires (measured: median 3, max 9 over 40 streams)
K_TAU = 11  # windows after a tau drop of 0.15 (measured: median 3, max 11 over 20 seeds; patience 3 is the minimum)


def _m(tau: float = 0.8, bias: float = 1.0, change: float = 0.0, r2: float = 0.0, prompts: float = 128) -> dict:
    return {
        "drift/tau_window": tau,
        "drift/bias_window": bias,
        "drift/length_trend_change": change,
        "drift/length_trend_r2": r2,
        "drift/prompts_window": prompts,
    }


def test_each_rule_on_hand_made_windows() -> None:
    d = DriftDetector(0.8, **PARAMS)  # floor 0.8 - 0.1 = 0.7; bias band [1/1.1, 1.1]
    assert d.offending(_m())[0] == {}
    assert d.offending(_m(tau=0.69))[0] == {"tau": 0.69} and d.offending(_m(tau=0.71))[0] == {}
    assert d.offending(_m(bias=1.11))[0] == {"bias": 1.11} and d.offending(_m(bias=1.09))[0] == {}
    assert "bias" in d.offending(_m(bias=0.9))[0] and d.offending(_m(bias=0.91))[0] == {}  # 1 / 1.1 = 0.909
    assert d.offending(_m(change=0.2, r2=0.6))[0] == {"trend": 0.2}
    assert d.offending(_m(change=-0.2, r2=0.6))[0] == {"trend": -0.2}  # shrinking lengths count too
    assert d.offending(_m(change=0.2, r2=0.4))[0] == {}  # a change the line does not explain
    assert d.offending(_m(tau=float("nan"), change=float("nan"), r2=float("nan")))[0] == {}
    assert DriftDetector(None, **PARAMS).offending(_m(tau=-1.0))[0] == {}  # no reference: no tau rule
    assert DriftDetector(0.8, reference_bias=0.9, **PARAMS).offending(_m(bias=0.9))[0] == {}


def test_the_references_standard_errors_widen_the_floor_and_the_band() -> None:
    # floor 0.8 - 0.1 - 2 x 0.05 = 0.6; band factor 1.1 x exp(2 x 0.05) = 1.2157
    d = DriftDetector(0.8, reference_tau_se=0.05, reference_bias_se=0.05, **PARAMS)
    assert d.tau_floor == pytest.approx(0.6) and d.bias_factor == pytest.approx(1.1 * np.exp(0.1))
    assert d.offending(_m(tau=0.65, bias=1.2))[0] == {}  # would offend both with exact references
    assert d.offending(_m(tau=0.59, bias=1.22))[0] == {"tau": 0.59, "bias": 1.22}
    assert "bias" in d.offending(_m(bias=1 / 1.22))[0]
    with pytest.raises(ValueError, match="standard errors"):
        DriftDetector(0.8, reference_tau_se=-0.1, **PARAMS)


def test_patience_min_prompts_and_cooldown() -> None:
    d = DriftDetector(0.8, **{**PARAMS, "patience": 3, "cooldown": 2})
    bad, good = _m(tau=0.5), _m()
    assert [d.update(m) for m in (bad, bad, good, bad, bad)] == [None] * 5  # a clean window resets the streak
    assert d.update(_m(tau=0.5, prompts=10)) is None and d.streak == 2  # too small: ignored, streak kept
    event = d.update(_m(tau=0.5, bias=1.5))
    assert event is not None and event.signals == ("tau", "bias") and event.streak == 3
    assert event.window_index == 6 and event.thresholds["tau"] == pytest.approx(0.7)
    assert "Kendall tau 0.500 < floor 0.700" in event.message and "Action: recalibrate." in event.message
    assert [d.update(bad) for _ in range(2)] == [None, None]  # cooldown: two windows ignored
    assert [d.update(bad) is None for _ in range(3)] == [True, True, False]  # then patience again


def test_settings_are_the_params_section_and_have_no_defaults_of_their_own() -> None:
    from asp.config import DriftParams

    assert set(SETTINGS) <= set(DriftParams.model_fields)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'action'"):
        DriftDetector(0.8, **{k: v for k, v in PARAMS.items() if k != "action"})
    with pytest.raises(ValueError):
        DriftDetector(0.8, **{**PARAMS, "trend_min_r2": 1.5})


def test_stationary_stream_fires_at_most_once_in_1000_windows() -> None:
    metrics = list(synthetic.stream(seed=0, windows=1000))
    taus = np.array([m["drift/tau_window"] for m in metrics])
    assert abs(taus.mean() - synthetic.REFERENCE_TAU) < 0.01  # the reference is the stream's own tau
    fired = synthetic.fired_windows(iter(metrics))
    assert len(fired) <= 1, fired  # measured: 0 (seeds 0-2, python -m tests.drift.synthetic)
    refs = synthetic.references()
    assert abs(refs["reference_bias"] - 1) < 0.03 < 1 - refs["median_ratio"] + 0.01  # skewed: median ratio < 1


@pytest.mark.parametrize(
    ("after", "limit"), [({"scale": 1.2}, K_SHIFT), ({"pred_sigma": synthetic.PRED_SIGMA_DROPPED}, K_TAU)]
)
def test_shift_and_tau_drop_fire_within_k_windows(after: dict, limit: int) -> None:
    delays = synthetic.delays(after, range(4), change_at=8, windows=8 + limit)
    assert max(delays) <= limit and min(delays) >= 1, delays  # fired after the change, never before it


def test_tau_drop_stream_drops_tau_by_015() -> None:
    metrics = list(synthetic.stream(seed=1, windows=60, change_at=30, pred_sigma=synthetic.PRED_SIGMA_DROPPED))
    before = np.mean([m["drift/tau_window"] for m in metrics[:30]])
    after = np.mean([m["drift/tau_window"] for m in metrics[30:]])
    assert before - after == pytest.approx(0.15, abs=0.03)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("drift.tau_drop=-1", "'drift.tau_drop' = -1"),
        ("drift.trend_min_r2=1.5", "'drift.trend_min_r2' = 1.5"),
        ("drift.patience=0", "'drift.patience' = 0"),
        ("drift.window=0", "'drift.window' = 0"),
        ("drift.action=retrain", "'drift.action' = 'retrain'"),
    ],
)
def test_impossible_drift_values_exit_2(setting: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["params", "check", "--params", str(ROOT / "params.yaml"), "--set", setting])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err, err
