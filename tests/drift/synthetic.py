"""Synthetic ingested-minibatch streams for the drift tests and docs/drift.md's numbers (fixed seeds).

Model, skewed like real lengths: prompt i has an expected response length mu_i (lognormal across prompts, median
1,000 tokens, log-sd 0.8); each of its n responses is mu_i * scale * exp(z), z ~ N(-s^2 / 2, s), s = SAMPLE_SIGMA
(right-skewed, mean mu_i); the predictor sees a noisy signal log mu_i + e_i, e_i ~ N(0, pred_sigma), and the
calibrated prediction is what an isotonic map converges to, the conditional *mean* E[mu | signal] for the
predictor the map was fitted for (pred_sigma = PRED_SIGMA). So, as on real lengths, the load ratio (sum realized /
sum calibrated: the detector's bias) is 1 while the median per-prompt ratio realized / calibrated sits below 1
(~0.94; 0.91-0.97 on AlpacaEval). The bias reference is measured as the evaluate stage measures it
(`asp.pipeline.evaluate.score` on EVAL_PROMPTS held-out prompts: `reference_bias`). With the defaults the
population Kendall tau of predictions vs realized means is ~0.76 (PRED_SIGMA) and ~0.61 (PRED_SIGMA_DROPPED: a
noisier predictor under the old calibration map): a tau drop of 0.15. `scale` > 1 after a change point is a length
shift.

Print the detector's measured false-alarm count and detection delays:
`.venv/bin/python -m tests.drift.synthetic`.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import numpy as np

from asp.config import DriftParams
from asp.drift import SETTINGS, DriftDetector, DriftEvent, DriftMonitor, MinibatchObservation

PARAMS = {name: getattr(DriftParams(), name) for name in SETTINGS}  # the detector at the params' defaults

MINIBATCHES, PROMPTS, N = 8, 16, 8  # window of 8 minibatches x 16 prompts x 8 samples
SAMPLE_SIGMA = 0.5
MU_LOG, MU_SIGMA = float(np.log(1000.0)), 0.8  # expected lengths across prompts
PRED_SIGMA = 0.25  # population tau ~0.76 = REFERENCE_TAU
PRED_SIGMA_DROPPED = 0.51  # population tau ~0.61: a drop of 0.15
REFERENCE_TAU = 0.76
MINIBATCHES_PER_VERSION = 4  # one trainer step (policy version) per 64 prompts
EVAL_PROMPTS = 400  # held-out prompts the bias reference is measured on (the demo's prepare.heldout_prompts)


def conditional_mean(signal: np.ndarray, pred_sigma: float = PRED_SIGMA) -> np.ndarray:
    """E[mu | log mu + e = signal] for lognormal mu and e ~ N(0, pred_sigma): the calibrated prediction."""
    shrink = MU_SIGMA**2 / (MU_SIGMA**2 + pred_sigma**2)
    variance = shrink * pred_sigma**2
    return np.exp(MU_LOG + shrink * (signal - MU_LOG) + variance / 2)


def prompts(
    rng: np.random.Generator, shape: tuple[int, ...], pred_sigma: float = PRED_SIGMA, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw prediction, calibrated prediction, realized lengths [..., N]) of prompts of `shape`."""
    mu = np.exp(rng.normal(MU_LOG, MU_SIGMA, shape))
    signal = np.log(mu) + rng.normal(0.0, pred_sigma, shape)
    z = rng.normal(-(SAMPLE_SIGMA**2) / 2, SAMPLE_SIGMA, (*shape, N))
    real = np.maximum(1.0, np.round(mu[..., None] * scale * np.exp(z)))
    return np.exp(signal), conditional_mean(signal), real


@cache
def references(seed: int = 12345) -> dict[str, float]:
    """What the evaluate stage (`asp.pipeline.evaluate.score`) measures on EVAL_PROMPTS held-out prompts of the
    stationary stream: the detector's keyword arguments reference_bias, reference_tau_se, reference_bias_se, and
    the held-out median_ratio."""
    from asp.pipeline.evaluate import score

    raw, _, real = prompts(np.random.default_rng(seed), (EVAL_PROMPTS,))
    m = score(raw, real.mean(axis=1), [500.0, 2000.0])[0]
    return {
        "reference_bias": m["predictor/bias_reference"],
        "reference_tau_se": m["predictor/kendall_tau_se"],
        "reference_bias_se": m["predictor/bias_reference_se"],
        "median_ratio": m["predictor/median_ratio"],
    }


def observations(
    rng: np.random.Generator, count: int, start: int, pred_sigma: float = PRED_SIGMA, scale: float = 1.0
) -> list[MinibatchObservation]:
    """`count` minibatches, global indices start.. (policy version = index // MINIBATCHES_PER_VERSION, batch
    group = index // 4)."""
    _, pred, real = prompts(rng, (count, PROMPTS), pred_sigma, scale)
    return [
        MinibatchObservation(
            range(j * PROMPTS, (j + 1) * PROMPTS), pred[i], real[i], j // MINIBATCHES_PER_VERSION, group_id=j // 4
        )
        for i, j in enumerate(range(start, start + count))
    ]


def stream(seed: int, windows: int, change_at: int = 0, **after: float) -> Iterator[dict[str, float]]:
    """Monitor metrics of `windows` windows; from window `change_at` on (when `after` is given) the generator
    runs with `after` (pred_sigma=..., scale=...; ramp=r: scale 1 + r * (windows since the change + 1))."""
    rng = np.random.default_rng(seed)
    monitor = DriftMonitor(MINIBATCHES, group_size=4, cumulative_max_prompts=1024)  # the detector ignores it
    for w in range(windows):
        kwargs = dict(after) if after and w >= change_at else {}
        if "ramp" in kwargs:
            kwargs["scale"] = 1.0 + kwargs.pop("ramp") * (w - change_at + 1)
        for obs in observations(rng, MINIBATCHES, w * MINIBATCHES, **kwargs):
            metrics = monitor.add(obs)
        assert metrics is not None
        yield metrics


def detector(**settings: float) -> DriftDetector:
    """A fresh detector: REFERENCE_TAU, the evaluate stage's `references` and `PARAMS` with `settings` changed."""
    refs = {k: v for k, v in references().items() if k != "median_ratio"}
    return DriftDetector(REFERENCE_TAU, **refs, **{**PARAMS, **settings})  # type: ignore[arg-type]


def events(metrics: Iterator[dict[str, float]], **settings: float) -> list[DriftEvent]:
    """What a fresh `detector(**settings)` fires on `metrics`."""
    detector_ = detector(**settings)
    return [e for m in metrics if (e := detector_.update(m)) is not None]


def fired_windows(metrics: Iterator[dict[str, float]], **settings: float) -> list[int]:
    """Window indices at which a fresh `detector(**settings)` fires."""
    return [e.window_index for e in events(metrics, **settings)]


def offending_rate(metrics: list[dict[str, float]]) -> dict[str, float]:
    """Fraction of windows in which each signal offends (before patience) at default settings."""
    detector_ = detector()
    hits = [detector_.offending(m)[0] for m in metrics]
    return {s: sum(s in h for h in hits) / len(hits) for s in ("tau", "bias", "trend")}


def delays(after: dict[str, float], seeds: range, change_at: int = 20, windows: int = 40) -> list[int]:
    """Windows after the change until the detector fires (1 = the first changed window), per seed."""
    return [fired_windows(stream(s, windows, change_at, **after))[0] - change_at + 1 for s in seeds]


def main() -> None:
    for seed in range(3):
        metrics = list(stream(seed, 1000))
        rates = {k: f"{v:.1%}" for k, v in offending_rate(metrics).items()}
        print(
            f"stationary seed {seed}, 1,000 windows: {len(fired_windows(iter(metrics)))} firing(s); per-window {rates}"
        )
    for name, after in (("20% length shift", {"scale": 1.2}), ("tau drop 0.15", {"pred_sigma": PRED_SIGMA_DROPPED})):
        found = delays(after, range(20))
        print(f"{name}: windows to fire over 20 seeds: min {min(found)}, median {np.median(found)}, max {max(found)}")
    first = events(stream(0, 80, 20, ramp=0.005))[0]
    print(f"ramp +0.5 % per window from window 20, seed 0: {first.message}")


if __name__ == "__main__":
    main()
