"""History-aware loads: each prompt's expected length from its calibrated prediction and its realized lengths.

An RL run visits every prompt once per pass and samples it n times, so from the second pass on the scheduler can
know far more than the text predictor: what the policy produced for this very prompt a few versions ago.
`LengthHistory` is the per-prompt record the run keeps (visits of (policy version, n samples, mean length), newest
`MAX_VISITS` per prompt; JSON-able for the checkpoint) and `history_loads` the estimator, for a prompt with one
visit:

    load_p = (kappa * c_p + w_p * m_p) / (kappa + w_p),   w_p = 1 / (1 / n_p + delta * a_p)

c_p the calibrated prediction (expected length), m_p the mean of the visit's n_p samples, a_p = current policy
version - the version that produced them (>= 0), kappa = ``prior_samples`` and delta = ``drift_per_version``;
several visits are combined by a Kalman filter of the same model (below).

Why this form: it is the posterior mean of a prompt's current mean length under a Gaussian model in which a
prompt's length scale s_p cancels out. Take the prediction as one noisy guess of the current mean with variance
(s_p * cv_pred)^2, each sample as one with variance (s_p * cv_sample)^2, and the prompt's mean as drifting by a
random walk of variance (s_p * cv_drift)^2 per policy version. A visit of n samples a versions ago then has
variance s_p^2 (cv_sample^2 / n + cv_drift^2 * a); for a single visit, precision-weighting the prediction and the
visit gives the formula above in units of one sample's precision (kappa = cv_sample^2 / cv_pred^2: how many samples
the prediction is worth; delta = cv_drift^2 / cv_sample^2). So the history is trusted more with more samples (w
grows with n up to 1 / (delta * a)) and less as the policy moves on (w falls with a), and a prompt never seen keeps
its prediction. kappa = 0 gives "history only" (the prediction is used only where there is no history).

Several visits share the random walk's steps after the older one, so they are not independent given the current
mean: the exact posterior is a Kalman filter over the visits, oldest first (`history_loads`; mean mu and variance
V in units of one sample's variance: drift to the next visit, V += delta * versions between them; update with the
visit, K = V / (V + 1/n), mu += K (m - mu), V *= 1 - K; drift to now), fused at the end with the prediction as
above, load = (kappa * c + mu / V) / (kappa + 1 / V). With one visit, or with delta = 0, it is the formula above
with w_pj = 1 / (1 / n_pj + delta * a_pj) (`visit_weights`); with more it trusts the newest visit more than
independent weights would, which matters when the policy keeps moving in one direction (the weights of treating
visits as independent kept ranking a run's third pass partly by its first). Working in lengths rather than log
lengths keeps the loads expected token counts, which is what the balancing sums.

Pure: numpy only. Tests: tests/schedule/test_history.py (hand-worked cases and real length streams).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_VISITS = 4  # newest visits kept per prompt; an older one weighs at most 1 / (delta * age) and ages fast


@dataclass(frozen=True, slots=True)
class HistoryEstimator:
    """The estimator's two settings (``runtime.history``; defaults in `asp.config`).

    Attributes:
        prior_samples: kappa, the samples the calibrated prediction is worth (>= 0; 0: history only).
        drift_per_version: delta, the variance a prompt's mean drifts per policy version, in units of one sample's
            variance (>= 0; 0: the policy never changes lengths).
    """

    prior_samples: float
    drift_per_version: float

    def __post_init__(self) -> None:
        for name in ("prior_samples", "drift_per_version"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"history {name} must be a finite number >= 0, got {getattr(self, name)!r}")


def visit_weights(counts: np.ndarray, ages: np.ndarray, drift_per_version: float) -> np.ndarray:
    """Precision of each visit in units of one fresh sample: ``1 / (1 / n + delta * age)``, 0 where n == 0.

    Args:
        counts: (P, V) samples per visit (0 = no visit in that slot).
        ages: (P, V) policy versions since the visit (>= 0).
        drift_per_version: delta.

    Returns:
        (P, V) float64 weights.

    Example: n 8, age 0 -> 8; n 8, age 10, delta 0.1 -> 1 / (0.125 + 1) = 0.889.
    """
    n = np.asarray(counts, dtype=np.float64)
    age = np.maximum(np.asarray(ages, dtype=np.float64), 0.0)
    with np.errstate(divide="ignore"):
        inv = np.where(n > 0, 1.0 / np.maximum(n, 1.0) + drift_per_version * age, np.inf)
    return np.where(n > 0, 1.0 / inv, 0.0)


def history_loads(
    prior: np.ndarray, means: np.ndarray, counts: np.ndarray, ages: np.ndarray, estimator: HistoryEstimator
) -> np.ndarray:
    """Each prompt's load: its prediction shrunk towards its history (see the module docstring).

    The visits are filtered oldest first (a Kalman filter on the random-walk model), then fused with the
    prediction; one visit weighs `visit_weights`.

    Args:
        prior: (P,) calibrated predictions (expected lengths, tokens).
        means: (P, V) mean realized length of each visit (ignored where counts == 0).
        counts: (P, V) samples of each visit.
        ages: (P, V) policy versions since each visit.
        estimator: kappa and delta.

    Returns:
        (P,) float64 loads; a prompt with no visit (or kappa = 0 and no visit) keeps its prediction.
    """
    c = np.asarray(prior, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    age = np.maximum(np.asarray(ages, dtype=np.float64), 0.0)
    m = np.asarray(means, dtype=np.float64)
    order = np.argsort(np.where(n > 0, -age, np.inf), axis=1, kind="stable")  # oldest visit first, none last
    n, age, m = (np.take_along_axis(x, order, axis=1) for x in (n, age, m))
    delta = estimator.drift_per_version
    mu, var = np.zeros(c.size), np.full(c.size, np.inf)  # var inf: no visit yet
    last = np.zeros(c.size)  # age of the visit filtered last
    for j in range(n.shape[1]):
        has = n[:, j] > 0
        noise = 1.0 / np.maximum(n[:, j], 1.0)
        first = ~np.isfinite(var)
        drifted = np.where(first, 0.0, var) + delta * np.maximum(last - age[:, j], 0.0)
        gain = np.where(first, 1.0, drifted / (drifted + noise))
        mu = np.where(has, mu + gain * (m[:, j] - mu), mu)
        var = np.where(has, np.where(first, noise, drifted * noise / (drifted + noise)), var)
        last = np.where(has, age[:, j], last)
    seen = np.isfinite(var)
    precision = np.where(seen, 1.0 / np.where(seen, var + delta * last, 1.0), 0.0)
    num = estimator.prior_samples * c + precision * np.where(seen, mu, 0.0)
    den = estimator.prior_samples + precision
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, num / safe, c)


@dataclass
class LengthHistory:
    """Per-prompt realized lengths of a run: prompt id -> visits ``(policy version, n samples, mean length)``,
    oldest first, the newest `MAX_VISITS` kept."""

    visits: dict[Any, list[tuple[int, int, float]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.visits)

    def add(self, prompt_ids: Sequence[Any], lengths: np.ndarray, versions: Iterable[int]) -> None:
        """Record one trained batch: prompt p's n samples ``lengths[p]`` generated by policy ``versions[p]``.

        Args:
            prompt_ids: (B,) prompt ids.
            lengths: (B, n) response lengths (tokens).
            versions: (B,) generating policy version of each prompt's samples.
        """
        if len(prompt_ids) == 0:
            return
        arr = np.asarray(lengths, dtype=np.float64).reshape(len(prompt_ids), -1)
        for pid, row, version in zip(prompt_ids, arr, versions, strict=True):
            if row.size == 0:
                continue
            visits = self.visits.setdefault(_plain(pid), [])
            visits.append((int(version), int(row.size), float(row.mean())))
            del visits[:-MAX_VISITS]

    def arrays(self, prompt_ids: Sequence[Any], version: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(means, counts, ages), each (P, MAX_VISITS), of `prompt_ids` at policy `version` (zeros: no visit)."""
        shape = (len(prompt_ids), MAX_VISITS)
        means, counts, ages = np.zeros(shape), np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        for row, pid in enumerate(prompt_ids):
            for col, (v, n, m) in enumerate(self.visits.get(_plain(pid), ())):
                means[row, col], counts[row, col], ages[row, col] = m, n, max(version - v, 0)
        return means, counts, ages

    def loads(
        self, prompt_ids: Sequence[Any], prior: np.ndarray, version: int, estimator: HistoryEstimator
    ) -> np.ndarray:
        """`history_loads` of `prompt_ids` (with predictions `prior`, (P,)) at policy `version`."""
        return history_loads(prior, *self.arrays(prompt_ids, version), estimator)

    def state(self) -> list[list[Any]]:
        """JSON-able rows ``[prompt id, version, n, mean]`` (prompt ids keep their type), sorted by prompt id."""
        keys = sorted(self.visits, key=lambda p: (type(p).__name__, p))
        return [[pid, v, n, m] for pid in keys for v, n, m in self.visits[pid]]

    @classmethod
    def from_state(cls, rows: Iterable[Sequence[Any]]) -> LengthHistory:
        """Rebuild from `state()` rows."""
        history = cls()
        for pid, v, n, m in rows:
            history.visits.setdefault(_plain(pid), []).append((int(v), int(n), float(m)))
        return history


def _plain(value: Any) -> Any:
    """numpy scalars -> Python scalars (JSON-able keys)."""
    return value.item() if isinstance(value, np.generic) else value
