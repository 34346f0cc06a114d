"""Policy-lag accounting (paper §4.2, appendix D): measured lag, the d_off estimate and the duty cycle. Pure numpy.

* measured lag of a sample = trainer version when it is trained - version of the weights that generated it
  (`policy_lags`; `lag_stats` summarises a batch; `measured_lag` does both). The project's one lag computation:
  the Control Unit (`asp.runtime.control`, `asp.control.metrics`) and the GRPO Training Unit both call it;
* estimate per arriving minibatch (eq. 4): ``d_off ~ Q_arrival + (T_save + T_convert + T_load + T_gen) / T_train``
  with Q_arrival the Training Queue depth in global batches just before it arrived;
* generation duty cycle (D.6): ``eta ~ T_gen / (T_gen + T_load)``.

Paper numbers (D.5): T_save 23.5 s, T_convert 84.6 s, T_load 73.9 s, T_gen 763.3 s, T_train 287.6 s and an
empty queue give d_off ~ (182.0 + 763.3) / 287.6 = 3.29 steps and eta ~ 763.3 / 837.2 = 0.912.

Run the tests with ``python -m pytest tests/rl -q``.
"""

from __future__ import annotations

import numpy as np


def policy_lags(trainer_version: int, versions: np.ndarray) -> np.ndarray:
    """Per-sample policy lag in trainer steps: ``trainer_version - versions``.

    Args:
        trainer_version: version of the weights the trainer updates with this batch.
        versions: (B,) policy version that generated each sample.

    Returns:
        float64 (B,) lags. Example: trainer version 5, versions [5, 4, 3] -> [0.0, 1.0, 2.0].
    """
    return trainer_version - np.asarray(versions, dtype=np.float64)


def lag_stats(lags: np.ndarray) -> tuple[float, float]:
    """(mean, max) of per-sample lags; (NaN, NaN) for an empty batch. Example: [0, 1, 2] -> (1.0, 2.0)."""
    x = np.asarray(lags, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.max())


def measured_lag(trainer_version: int, versions: np.ndarray) -> tuple[float, float]:
    """(mean, max) of ``trainer_version - versions`` (NaN, NaN for an empty batch).

    Example: trainer version 5, sample versions [5, 4, 3] -> lags [0, 1, 2] -> (1.0, 2.0).
    """
    return lag_stats(policy_lags(trainer_version, versions))


def d_off_estimate(
    q_arrival: np.ndarray, t_gen: np.ndarray, *, t_save: float, t_convert: float, t_load: float, t_train: float
) -> np.ndarray:
    """Eq. 4 per minibatch.

    Args:
        q_arrival: (M,) queue depth in global batches just before each minibatch arrived.
        t_gen: (M,) seconds each minibatch took to generate.
        t_save, t_convert, t_load: snapshot export, conversion and actor reload seconds.
        t_train: trainer step seconds (> 0; NaN estimates otherwise).

    Returns:
        (M,) estimated off-policy distance in trainer steps.
    """
    q = np.asarray(q_arrival, dtype=np.float64)
    g = np.asarray(t_gen, dtype=np.float64)
    if not t_train > 0:
        return np.full(q.shape, np.nan)
    return q + (t_save + t_convert + t_load + g) / t_train


def duty_cycle(t_gen: float, t_load: float) -> float:
    """``T_gen / (T_gen + T_load)`` (NaN when both are 0). Example: 763.3, 73.9 -> 0.912."""
    total = t_gen + t_load
    return float(t_gen / total) if total > 0 else float("nan")
