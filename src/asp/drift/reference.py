"""How well the evaluate stage knows the drift detector's references: standard errors of the held-out Kendall tau and
of the held-out load ratio (pure numpy).

The detector compares each window with references measured once, on the evaluate stage's held-out prompts (a few
hundred). Their sampling error is of the order of a window's own noise on real lengths (AlpacaEval, one answer per
prompt: ~0.03 in tau and in log load ratio on 400 prompts, against ~0.06 per window of 128 prompts), so a band that
ignores it fires on a stationary stream whenever the reference happens to sit at one end of its error. The detector
widens its tau floor and its bias band by `REFERENCE_Z` of these errors (docs/drift.md has the measurements).

Run the tests: `.venv/bin/python -m pytest tests/drift -q`.
"""

from __future__ import annotations

import math

import numpy as np

from asp.predictor.metrics import kendall_tau

REFERENCE_Z = 2.0  # standard errors of a reference the detector's bands are widened by


def load_ratio_se(predicted: np.ndarray, realized: np.ndarray) -> float:
    """Standard error of log(sum realized / sum predicted) over prompts (delta method of the ratio estimator);
    NaN with fewer than two prompts or a zero sum."""
    p = np.asarray(predicted, dtype=np.float64)
    r = np.asarray(realized, dtype=np.float64)
    n = p.size
    if n < 2 or p.sum() <= 0 or r.sum() <= 0:
        return math.nan
    ratio = r.sum() / p.sum()
    return float(math.sqrt(n / (n - 1) * float(((r - ratio * p) ** 2).sum())) / r.sum())


def kendall_tau_se(predicted: np.ndarray, realized: np.ndarray) -> float:
    """Jackknife standard error of Kendall's tau-b (n leave-one-out taus); NaN with fewer than three prompts or an
    undefined tau."""
    p = np.asarray(predicted, dtype=np.float64)
    r = np.asarray(realized, dtype=np.float64)
    n = p.size
    if n < 3:
        return math.nan
    keep = ~np.eye(n, dtype=bool)
    loo = np.array([kendall_tau(p[keep[i]], r[keep[i]]) for i in range(n)])
    if not np.all(np.isfinite(loo)):
        return math.nan
    return float(math.sqrt((n - 1) / n * float(((loo - loo.mean()) ** 2).sum())))
