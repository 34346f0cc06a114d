"""Real length streams for the drift tests, from AlpacaEval's real answer lengths (data/alpaca_eval_lengths.json).

What a launch run's drift watch would see, with real lengths (whitespace words of one real answer per prompt and
model, so n = 1 sample per prompt: noisier windows than a run's n = 8):

* the predictor: TF-IDF (word 1-2 grams) ridge on log length of the target model, fitted out of fold (5 folds), so
  every prompt's raw prediction comes from a model that did not see it (held-out Kendall tau ~0.28 on phi-2-sft: a
  cheap, weak predictor; a better one has smaller residuals and quieter windows);
* the evaluate stage: a seeded split of the 805 prompts into EVAL_PROMPTS held-out prompts and the rest (the
  launch prompts). `asp.pipeline.evaluate.score` - the stage's own code - scores the held-out prompts: its
  ``predictor/kendall_tau`` is the tau reference, its ``predictor/bias_reference`` the bias reference, and the
  isotonic calibration map it fits gives the launch prompts their calibrated predictions;
* the stream: windows of 8 minibatches x 16 prompts drawn with replacement from the launch prompts (one policy
  version per 4 minibatches, batch groups of 4), fed to `asp.drift.DriftMonitor` and the detector as `DriftWatch`
  feeds them. Stationary: the realized length is the target model's own answer. Drift: from window `change_at`
  on, the same prompts answered by another model (phi-2-sft -> phi-2-dpo: preference tuning, answers ~55 % longer,
  the ranking much the same).

Print the detector's numbers on these streams: `.venv/bin/python -m tests.drift.real` (benchmarks/drift_real.py
prints them next to the old defaults).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from asp.config import DriftParams
from asp.drift import SETTINGS, DriftDetector, DriftEvent, DriftMonitor, MinibatchObservation

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "alpaca_eval_lengths.json"
SOURCE, DRIFTED = "phi-2-sft", "phi-2-dpo"
EVAL_PROMPTS = 400  # held-out prompts of the evaluate stage (the demo's prepare.heldout_prompts)
MINIBATCHES, PROMPTS = 8, 16  # a window: drift.window minibatches of schedule.b prompts
MINIBATCHES_PER_VERSION = 4
FOLDS = 5


OLD = {  # the drift: defaults before issue 21 (with reference bias 1.0 and the median ratio as the bias)
    "min_prompts": 64,
    "tau_drop": 0.08,
    "bias_tolerance": 0.12,
    "trend": 0.1,
    "trend_min_r2": 0.5,
    "patience": 3,
    "cooldown": 10,
    "action": "reprofile",
}


def params(**changes: object) -> dict[str, object]:
    """The detector's settings at the params' defaults (`asp.config.DriftParams`), with `changes`."""
    defaults = DriftParams()
    return {**{name: getattr(defaults, name) for name in SETTINGS}, **changes}


@cache
def lengths() -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """(instructions, model -> words per answer [805]) from the project's copy of the AlpacaEval lengths."""
    data = json.loads(DATA.read_text())
    rows = data["rows"]
    texts = tuple(str(r["instruction"]) for r in rows)
    return texts, {m: np.array([float(r[f"words:{m}"]) for r in rows]) for m in data["models"]}


@cache
def out_of_fold_predictions(target: str = SOURCE, seed: int = 0) -> np.ndarray:
    """Raw predicted lengths [805]: TF-IDF ridge on log1p(length of `target`), each fold predicted by a model fitted
    on the other folds."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold

    texts, by_model = lengths()
    x = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2).fit_transform(texts)
    y = np.log1p(by_model[target])
    out = np.empty_like(y)
    for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(y):
        out[test] = Ridge(alpha=1.0).fit(x[train], y[train]).predict(x[test])
    return np.expm1(out)


@dataclass(frozen=True)
class Setup:
    """One evaluate / launch split: references from the evaluate stage's code, the launch prompts' predictions."""

    reference_tau: float
    reference_bias: float
    reference_tau_se: float
    reference_bias_se: float
    median_ratio: float  # the held-out out-of-fold median realized / calibrated (the statistic it replaced)
    launch: np.ndarray  # indices of the launch prompts
    raw: np.ndarray  # [805] raw predictions
    calibrated: np.ndarray  # [805] the calibration map of the held-out prompts applied to every prompt


@cache
def setup(split: int, target: str = SOURCE) -> Setup:
    """The evaluate stage on a seeded split (`split`) of the prompts, for a predictor of `target`'s lengths."""
    from asp.pipeline.evaluate import score

    raw = out_of_fold_predictions(target)
    true = lengths()[1][target]
    order = np.random.default_rng(split).permutation(raw.size)
    held, launch = order[:EVAL_PROMPTS], order[EVAL_PROMPTS:]
    metrics, calibration, _, _ = score(raw[held], true[held], [64.0, 256.0])
    return Setup(
        metrics["predictor/kendall_tau"],
        metrics["predictor/bias_reference"],
        metrics["predictor/kendall_tau_se"],
        metrics["predictor/bias_reference_se"],
        metrics["predictor/median_ratio"],
        launch,
        raw,
        np.maximum(calibration(raw), 1.0),
    )


def stream(
    split: int,
    windows: int,
    seed: int = 0,
    change_at: int | None = None,
    source: str = SOURCE,
    drifted: str = DRIFTED,
) -> Iterator[dict[str, float]]:
    """Monitor metrics of `windows` windows of the launch prompts of `split`, realized by `source`'s answers, from
    window `change_at` on (None: never) by `drifted`'s."""
    s = setup(split, source)
    by_model = lengths()[1]
    rng = np.random.default_rng(seed)
    monitor = DriftMonitor(MINIBATCHES, group_size=4, cumulative_max_prompts=1024)  # the detector ignores it
    for w in range(windows):
        model = drifted if change_at is not None and w >= change_at else source
        for m in range(MINIBATCHES):
            j = w * MINIBATCHES + m
            ids = rng.choice(s.launch, PROMPTS)
            obs = MinibatchObservation(
                ids.tolist(),
                s.calibrated[ids],
                by_model[model][ids][:, None],
                j // MINIBATCHES_PER_VERSION,
                group_id=j // 4,
            )
            metrics = monitor.add(obs)
        assert metrics is not None
        yield metrics


def detector(split: int, source: str = SOURCE, **changes: object) -> DriftDetector:
    """A fresh detector at the params' defaults (`changes` applied) with the evaluate stage's references of `split`
    and their standard errors."""
    s = setup(split, source)
    return DriftDetector(
        s.reference_tau,
        reference_bias=s.reference_bias,
        reference_tau_se=s.reference_tau_se,
        reference_bias_se=s.reference_bias_se,
        **params(**changes),  # type: ignore[arg-type]
    )


def old_detector(split: int, source: str = SOURCE) -> DriftDetector:
    """The detector before issue 21: the old defaults (`OLD`), reference bias 1.0, references taken as exact; feed it
    `old_metrics` (its bias was the median ratio)."""
    return DriftDetector(setup(split, source).reference_tau, **OLD)  # type: ignore[arg-type]


def old_metrics(metrics: Iterator[dict[str, float]]) -> Iterator[dict[str, float]]:
    """Window metrics as the old monitor reported them: the bias was the median ratio realized / calibrated."""
    for m in metrics:
        yield {**m, "drift/bias_window": m["drift/median_ratio"]}


def events(metrics: Iterator[dict[str, float]], detector: DriftDetector) -> list[DriftEvent]:
    """What `detector` fires on `metrics`."""
    return [e for m in metrics if (e := detector.update(m)) is not None]


def false_alarms(splits: range, windows: int, source: str = SOURCE, **settings: object) -> list[int]:
    """Firings on `windows` stationary windows per split."""
    return [len(events(stream(s, windows, seed=s, source=source), detector(s, source, **settings))) for s in splits]


def delays(splits: range, seeds: range, change_at: int = 10, windows: int = 20, **settings: object) -> list[int]:
    """Windows after the switch to phi-2-dpo until the detector fires (1 = the first drifted window; never:
    windows - change_at + 1), per split x seed; a firing before the switch counts as 0."""
    found = []
    for split in splits:
        for seed in seeds:
            fired = events(stream(split, windows, seed, change_at), detector(split, **settings))
            found.append(fired[0].window_index - change_at + 1 if fired else windows - change_at + 1)
    return [max(0, d) for d in found]


def main() -> None:
    for split in range(3):
        s = setup(split)
        print(
            f"split {split}: evaluate tau {s.reference_tau:.3f}, bias reference {s.reference_bias:.3f} "
            f"(median ratio {s.median_ratio:.3f})"
        )
    print("false alarms per 1,000 stationary windows, splits 0-4:", false_alarms(range(5), 1000))
    found = delays(range(5), range(4))
    print(f"{SOURCE} -> {DRIFTED}: windows to fire over 20 streams: min {min(found)}, max {max(found)}")


if __name__ == "__main__":
    main()
