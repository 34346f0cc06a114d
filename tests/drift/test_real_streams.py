"""The drift detector at the params' defaults on real length streams (tests/drift/real.py: AlpacaEval's real answer
lengths, a TF-IDF ridge predictor fitted out of fold, the references measured by the evaluate stage's code on 400
held-out prompts, windows drawn from the other 405 prompts as `DriftWatch` feeds them):

* stationary (phi-2-sft's own answers): at most one firing per 1,000 windows (measured: 6 in 10 x 1,000 windows,
  `python benchmarks/drift_real.py`), where the old defaults fired 11-74 times per 1,000;
* phi-2-sft -> phi-2-dpo (the same prompts, answers ~55 % longer): caught within 3 windows, never before the switch;
* ``recalibrate`` cures it: the map refitted on the streak's prompts, with the reference re-measured as the watch
  does (`asp.adaptation.watch.DriftWatch._recalibrate`), and the same drifted stream no longer offends.
"""

from __future__ import annotations

import numpy as np

from asp.drift import DriftMonitor, MinibatchObservation
from asp.drift.monitor import bias
from asp.drift.reference import load_ratio_se
from asp.predictor.calibration import cross_fit_calibration, fit_calibration
from tests.drift import real

SPLITS = range(3)


def test_the_data_is_the_projects_copy_and_the_evaluate_references_are_right() -> None:
    assert real.DATA.is_relative_to(real.ROOT / "data") and real.DATA.is_file()
    for split in SPLITS:
        s = real.setup(split)
        assert 0.2 < s.reference_tau < 0.4  # a weak, real predictor
        assert abs(s.reference_bias - 1) < 0.01  # the load ratio of a map that estimates the conditional mean
        assert s.median_ratio < 0.98  # right-skewed lengths: the median ratio sits below 1 (the old statistic)
        assert 0.01 < s.reference_tau_se < 0.05 and 0.01 < s.reference_bias_se < 0.06


def test_stationary_real_stream_fires_at_most_once_per_1000_windows_where_the_old_defaults_fired_dozens() -> None:
    fired, old = 0, 0
    for split in SPLITS:  # 3 x 600 windows (benchmarks/drift_real.py runs 10 x 1,000)
        metrics = list(real.stream(split, 600, seed=split))
        fired += len(real.events(iter(metrics), real.detector(split)))
        old += len(real.events(real.old_metrics(iter(metrics)), real.old_detector(split)))
    assert fired <= 1, fired  # measured: 0 on splits 0-2
    assert old >= 20, old  # measured: 84 (the old defaults on the same windows)


def test_sft_to_dpo_is_caught_within_3_windows() -> None:
    found = real.delays(SPLITS, range(2), change_at=6, windows=10)
    assert all(1 <= d <= 3 for d in found), found


def test_recalibrate_cures_the_bias_it_responds_to() -> None:
    split = 0
    s = real.setup(split)
    dpo = real.lengths()[1][real.DRIFTED]
    rng = np.random.default_rng(7)
    streak = rng.choice(s.launch, real.PROMPTS * real.MINIBATCHES * 3)  # the 3 offending windows' prompts

    def windows(calibrated: np.ndarray, count: int) -> list[dict[str, float]]:
        monitor, out = DriftMonitor(real.MINIBATCHES, group_size=4, cumulative_max_prompts=1024), []
        for j in range(count * real.MINIBATCHES):
            ids = rng.choice(s.launch, real.PROMPTS)
            m = monitor.add(MinibatchObservation(ids.tolist(), calibrated[ids], dpo[ids][:, None], j // 4))
            out += [] if m is None else [m]
        return out

    before = real.detector(split)
    assert all(before.offending(m)[0].keys() >= {"bias"} for m in windows(s.calibrated, 20))
    # what DriftWatch._recalibrate does with the streak's raw predictions and realized lengths
    raw, realized = s.raw[streak], dpo[streak]
    refit = np.maximum(fit_calibration(raw, realized)(s.raw), 1.0)
    out_of_fold = cross_fit_calibration(raw, realized, 5)
    after = real.detector(split)
    after.reference_bias, after.reference_bias_se = bias(out_of_fold, realized), load_ratio_se(out_of_fold, realized)
    metrics = windows(refit, 200)
    offending = [after.offending(m)[0] for m in metrics]
    assert sum("bias" in o for o in offending) <= 0.05 * len(metrics), offending  # measured: 0 of 200
    assert real.events(iter(metrics), after) == []
