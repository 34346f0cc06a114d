"""Ranking-quality metrics of predicted versus true response lengths (pure numpy/scipy, no I/O).

ASP sorts prompts by predicted length, so order matters most: Kendall's tau (the paper's metric, §3.2 and
appendix F.4), Spearman's rho and pairwise ordering accuracy; MAE in tokens and per-bucket errors show the
scale. ``kendall_tau`` is the project's one Kendall tau (the scheduler's ablation and the training loop use it).
Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_metrics.py -q``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def _as_pair(pred: np.ndarray, true: np.ndarray, minimum: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Validate and convert to float64 1-D arrays of equal length >= `minimum` without NaN/inf."""
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    if p.ndim != 1 or t.ndim != 1 or p.shape != t.shape:
        raise ValueError(f"pred and true must be 1-D arrays of the same length; got shapes {p.shape} and {t.shape}")
    if p.size < minimum:
        raise ValueError(f"ranking metrics need at least {minimum} prompts, got {p.size}")
    for name, arr in (("pred", p), ("true", t)):
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ValueError(
                f"{name} contains {bad.size} NaN/inf value(s), first at index {bad[0]} "
                f"({arr[bad[0]]}); drop or fix those prompts before evaluating"
            )
    return p, t


def _check_not_constant(p: np.ndarray, t: np.ndarray) -> None:
    if np.all(t == t[0]):
        raise ValueError(
            f"all {t.size} true lengths are equal ({t[0]:g}), so Kendall's tau is undefined; "
            "profile more (or more varied) prompts or raise the max-token cap"
        )
    if np.all(p == p[0]):
        raise ValueError(
            f"all {p.size} predicted lengths are equal ({p[0]:g}), so Kendall's tau is undefined; "
            "the predictor has collapsed - train longer, raise the learning rate or check the data"
        )


def kendall_tau(pred: np.ndarray, true: np.ndarray) -> float:
    """Kendall's tau-b (ties handled, O(n log n)); NaN where it is undefined.

    Args:
        pred: [n] predicted lengths (any monotone scale).
        true: [n] true lengths.

    Returns:
        tau-b in [-1, 1]; NaN when n < 2 or either side is constant (no order to compare). Use
        ``ranking_metrics`` for a ValueError that says which side is constant.

    Raises:
        ValueError: shapes differ or NaN/inf values.

    Example:
        >>> round(kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]), 4)  # 6 pairs, one discordant: (5 - 1) / 6
        0.6667
    """
    p, t = _as_pair(pred, true, minimum=0)
    if p.size < 2 or np.all(p == p[0]) or np.all(t == t[0]):
        return float("nan")
    return float(stats.kendalltau(p, t).statistic)


def pairwise_accuracy(pred: np.ndarray, true: np.ndarray, chunk: int = 1024) -> float:
    """Fraction of pairs with distinct true lengths that the prediction orders the same way.

    A pair the prediction ties counts one half. Memory is O(chunk * n).

    Args:
        pred: [n] predicted lengths (any monotone scale).
        true: [n] true lengths.
        chunk: rows compared per step.

    Returns:
        Accuracy in [0, 1].
    """
    p, t = _as_pair(pred, true)
    hits = 0.0
    total = 0
    for start in range(0, p.size, chunk):
        dt = np.sign(t[start : start + chunk, None] - t[None, :])  # [c, n]
        dp = np.sign(p[start : start + chunk, None] - p[None, :])
        mask = dt != 0
        total += int(mask.sum())
        hits += float((dt == dp)[mask].sum()) + 0.5 * float((dp == 0)[mask].sum())
    if total == 0:
        raise ValueError("all true lengths are equal, so no pair has an order; pairwise accuracy is undefined")
    return hits / total


def ranking_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """Kendall tau-b, Spearman rho, MAE (tokens) and pairwise accuracy.

    Args:
        pred: [n] predicted mean response lengths in tokens.
        true: [n] measured mean response lengths in tokens.

    Returns:
        ``{"kendall_tau", "spearman", "mae_tokens", "pairwise_accuracy", "n"}``.

    Raises:
        ValueError: shapes differ, fewer than 2 prompts, NaN/inf values, or all-equal true or predicted lengths.
    """
    p, t = _as_pair(pred, true)
    _check_not_constant(p, t)
    return {
        "kendall_tau": kendall_tau(p, t),
        "spearman": float(stats.spearmanr(p, t).statistic),
        "mae_tokens": float(np.mean(np.abs(p - t))),
        "pairwise_accuracy": pairwise_accuracy(p, t),
        "n": int(p.size),
    }


def bucket_errors(pred: np.ndarray, true: np.ndarray, edges: Sequence[float]) -> list[dict]:
    """Errors per true-length bucket [edges[k], edges[k+1]) (the last bucket includes its upper edge).

    Args:
        pred: [n] predicted lengths in tokens.
        true: [n] true lengths in tokens.
        edges: increasing bucket edges in tokens, at least two (use ``float("inf")`` for an open top).

    Returns:
        One dict per bucket: ``lo, hi, count, mae_tokens, bias_tokens (mean pred - true), mean_true, mean_pred,
        mape`` (mean |pred - true| / max(true, 1)); error fields are None for an empty bucket.
    """
    p, t = _as_pair(pred, true)
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or e.size < 2 or np.any(np.isnan(e)) or np.any(np.diff(e) <= 0):
        raise ValueError(f"bucket edges must be a strictly increasing list of at least 2 numbers, got {list(edges)}")
    out = []
    for k in range(e.size - 1):
        lo, hi = e[k], e[k + 1]
        sel = (t >= lo) & ((t < hi) if k < e.size - 2 else (t <= hi))
        err = p[sel] - t[sel]
        n = int(sel.sum())
        out.append(
            {
                "lo": float(lo),
                "hi": float(hi),
                "count": n,
                "mae_tokens": float(np.mean(np.abs(err))) if n else None,
                "bias_tokens": float(np.mean(err)) if n else None,
                "mean_true": float(np.mean(t[sel])) if n else None,
                "mean_pred": float(np.mean(p[sel])) if n else None,
                "mape": float(np.mean(np.abs(err) / np.maximum(t[sel], 1.0))) if n else None,
            }
        )
    return out


def sample_baselines(samples: Sequence[np.ndarray]) -> dict[str, float]:
    """Kendall tau of the free baselines a user has without any predictor, from each prompt's own n samples.

    * history: the mean of a prompt's first half of samples ranks the mean of its second half (what an earlier
      visit of the same policy would know, with n / 2 samples);
    * probe: a prompt's first sample ranks the mean of its others (Seer's / NeMo-RL's group probe: start one
      response, schedule the group by it).

    Each is scored against the mean of the OTHER samples (never the ones it uses), so its target has fewer
    samples than the predictor's (the mean of all n): a little noisier, which lowers these tau slightly.

    Args:
        samples: per prompt, its (n_p,) sample lengths in sample order; prompts with n_p < 2 are skipped.

    Returns:
        ``{"history_tau", "probe_tau", "prompts"}``; the tau are NaN when fewer than 2 prompts have 2+ samples.

    Example: samples [1, 3], [5, 7], [2, 4]: history = probe = tau([1, 5, 2], [3, 7, 4]) = 1.
    """
    rows = [np.asarray(s, dtype=np.float64) for s in samples if len(s) >= 2]
    if len(rows) < 2:
        return {"history_tau": float("nan"), "probe_tau": float("nan"), "prompts": float(len(rows))}
    half = [r.size // 2 for r in rows]
    first = np.array([r[:h].mean() for r, h in zip(rows, half, strict=True)])
    second = np.array([r[h:].mean() for r, h in zip(rows, half, strict=True)])
    probe = np.array([r[0] for r in rows])
    others = np.array([r[1:].mean() for r in rows])
    return {
        "history_tau": kendall_tau(first, second),
        "probe_tau": kendall_tau(probe, others),
        "prompts": float(len(rows)),
    }
