"""Length-drift monitor: per-window statistics of what the launch run ingests (docs/drift.md).

Pure numpy/scipy, no I/O. For every ingested minibatch the Control Unit knows the prompts' calibrated
predicted lengths, the realized lengths of all n responses and the policy version that produced them; it
wraps them in a `MinibatchObservation`. `window_stats` summarizes a list of observations:

* tau: Kendall's tau-b between calibrated predictions and realized mean lengths (per prompt);
* bias: the load ratio, sum over prompts of realized mean length / sum of calibrated predicted lengths (1.0 =
  calibrated). The calibration map estimates the conditional *mean* length, so on real, right-skewed lengths this
  ratio sits at 1 while the median of per-prompt ratios sits below it (0.90-0.95 on AlpacaEval); it is also the
  scheduler's unit (a batch group's load is a sum of calibrated predictions). The median ratio is reported as
  median_ratio;
* mean_length: mean realized response length (tokens per sample);
* padding_rate: mean over minibatches of 1 - mean/max sample length (as `MinibatchOutput.padding_rate`);
* group-load CV, realized and scheduled: std / mean of the batch groups' loads (sum over a group's minibatches
  of realized mean lengths, or of calibrated predictions), over groups seen complete in the window.

`length_trend` fits mean response length against policy version by least squares (paper appendix F.7: +1.6 %,
R^2 = 0.013 over 103 versions). `DriftMonitor` accumulates observations and every `window` minibatches returns
a metric dict (`drift/tau_window`, `drift/tau_cumulative`, `drift/bias_window`, `drift/length_trend_slope`,
`drift/length_trend_r2`, ...) that `asp.drift.detector.DriftDetector.update` reads.

Run the tests: `.venv/bin/python -m pytest tests/drift -q`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from asp.predictor.metrics import kendall_tau

NAN = float("nan")
TREND_MIN_VERSIONS = 10  # the monitor reports no trend over fewer policy versions (a line through 3 is noise)
CUMULATIVE_MAX_PROMPTS = 20_000  # default bound on the prompts of the cumulative tau (its cost grows with them)


@dataclass(frozen=True)
class MinibatchObservation:
    """One ingested minibatch as the drift monitor sees it (P prompts, n samples each).

    Attributes:
        prompt_ids: (P,) prompt ids.
        predicted: (P,) calibrated predicted lengths (expected tokens per response), finite, > 0.
        realized: (P, n) realized response lengths (tokens); a flat (P * n,) array is reshaped, sample s
            belonging to prompt s // n (the `MinibatchOutput` layout).
        policy_version: weights version that generated the samples.
        group_id: the scheduled batch group of this minibatch; None when unknown.
        scheduled_load: the load the scheduler assigned; None: the sum of `predicted`.
        padding_rate: realized padding rate; None: 1 - mean / max over all samples.
    """

    prompt_ids: Sequence[Hashable]
    predicted: np.ndarray
    realized: np.ndarray
    policy_version: int
    group_id: int | None = None
    scheduled_load: float | None = None
    padding_rate: float | None = None

    def __post_init__(self) -> None:
        pred = np.asarray(self.predicted, dtype=np.float64).reshape(-1)
        n_prompts = len(self.prompt_ids)
        if pred.size != n_prompts or n_prompts == 0:
            raise ValueError(f"predicted has {pred.size} values for {n_prompts} prompt ids (need >= 1, equal)")
        if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
            raise ValueError("predicted lengths must be finite and > 0")
        real = np.asarray(self.realized, dtype=np.float64)
        if real.ndim == 1 and real.size % n_prompts == 0 and real.size:
            real = real.reshape(n_prompts, -1)
        if real.ndim != 2 or real.shape[0] != n_prompts or real.shape[1] == 0:
            raise ValueError(f"realized must be ({n_prompts}, n) or flat with P * n values; got {real.shape}")
        if not np.all(np.isfinite(real)) or np.any(real < 0):
            raise ValueError("realized lengths must be finite and >= 0")
        object.__setattr__(self, "predicted", pred)
        object.__setattr__(self, "realized", real)

    @property
    def realized_mean(self) -> np.ndarray:
        """(P,) mean realized length per prompt (tokens)."""
        return self.realized.mean(axis=1)

    @property
    def realized_load(self) -> float:
        """Sum over prompts of the realized mean length: the unit the scheduler's loads are in."""
        return float(self.realized_mean.sum())

    @property
    def planned_load(self) -> float:
        """`scheduled_load`, or the sum of calibrated predictions when it was not given."""
        return float(self.predicted.sum()) if self.scheduled_load is None else float(self.scheduled_load)

    @property
    def realized_padding(self) -> float:
        """`padding_rate`, or 1 - mean / max over all samples (0 for all-empty responses)."""
        if self.padding_rate is not None:
            return float(self.padding_rate)
        top = float(self.realized.max())
        return 1.0 - float(self.realized.mean()) / top if top > 0 else 0.0


def cv(values: np.ndarray) -> float:
    """Coefficient of variation std / mean (population std); NaN for fewer than two values or mean 0."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or values.mean() == 0:
        return NAN
    return float(values.std() / values.mean())


def bias(predicted: np.ndarray, realized_mean: np.ndarray) -> float:
    """Load ratio: sum of realized mean lengths / sum of calibrated predicted lengths; NaN when empty.

    What a calibration map that estimates the conditional mean keeps at 1 (isotonic regression does so exactly on
    the prompts it was fitted on), and what the scheduler's group loads are off by.
    """
    predicted = np.asarray(predicted, dtype=np.float64)
    if not predicted.size:
        return NAN
    return float(np.asarray(realized_mean, dtype=np.float64).sum() / predicted.sum())


def median_ratio(predicted: np.ndarray, realized_mean: np.ndarray) -> float:
    """Median over prompts of realized mean / calibrated predicted length; NaN when empty (below 1 on right-skewed
    lengths even where the calibration is right: reported, not a detector signal)."""
    predicted = np.asarray(predicted, dtype=np.float64)
    return float(np.median(np.asarray(realized_mean, dtype=np.float64) / predicted)) if predicted.size else NAN


def group_load_cvs(observations: Sequence[MinibatchObservation], group_size: int | None = None) -> tuple[float, ...]:
    """(realized CV, scheduled CV, groups used) of the batch-group loads among `observations`.

    A group counts when `group_size` of its minibatches are in the list (default: as many as the most complete
    group has); partial groups and observations without a group id are left out.
    """
    members = [o for o in observations if o.group_id is not None]
    counts = Counter(o.group_id for o in observations if o.group_id is not None)
    if not counts:
        return NAN, NAN, 0.0
    need = group_size if group_size is not None else max(counts.values())
    complete = sorted(g for g, c in counts.items() if c == need)
    realized = np.array([sum(o.realized_load for o in members if o.group_id == g) for g in complete])
    planned = np.array([sum(o.planned_load for o in members if o.group_id == g) for g in complete])
    return cv(realized), cv(planned), float(len(complete))


def window_stats(observations: Sequence[MinibatchObservation], group_size: int | None = None) -> dict[str, float]:
    """Summary of a window of ingested minibatches (keys without the `drift/` prefix).

    Args:
        observations: the window's minibatches (>= 1).
        group_size: minibatches per batch group (`schedule.k`); None: the most complete group's count.

    Returns:
        dict with prompts, minibatches, tau (NaN when either side has < 2 distinct values), bias (the load ratio),
        median_ratio, mean_length (tokens per sample), padding_rate, group_load_cv_realized,
        group_load_cv_scheduled (NaN with < 2 complete groups), groups.
    """
    if not observations:
        raise ValueError("window_stats needs at least one observation")
    predicted = np.concatenate([o.predicted for o in observations])
    realized_mean = np.concatenate([o.realized_mean for o in observations])
    samples = sum(o.realized.size for o in observations)
    cv_real, cv_sched, groups = group_load_cvs(observations, group_size)
    return {
        "prompts": float(predicted.size),
        "minibatches": float(len(observations)),
        "tau": kendall_tau(predicted, realized_mean),
        "bias": bias(predicted, realized_mean),
        "median_ratio": median_ratio(predicted, realized_mean),
        "mean_length": float(sum(o.realized.sum() for o in observations) / samples),
        "padding_rate": float(np.mean([o.realized_padding for o in observations])),
        "group_load_cv_realized": cv_real,
        "group_load_cv_scheduled": cv_sched,
        "groups": groups,
    }


def length_trend(mean_length_by_version: Mapping[int, float], min_versions: int = 3) -> tuple[float, float, float]:
    """Least-squares line of mean response length against policy version (paper appendix F.7).

    Args:
        mean_length_by_version: policy version -> mean response length (tokens) of its samples.
        min_versions: fewer versions give NaN (>= 3: two points always fit exactly).

    Returns:
        (slope in tokens per version, relative slope = slope / mean of the means (fraction per version), R^2).
        All NaN with fewer than `min_versions` versions; R^2 = 0 when every mean is equal.

    Example:
        >>> # x - 1.5 = (-1.5, -0.5, 0.5, 1.5), y - 103 = (-3, 1, -1, 3): slope 8 / 5, R^2 = 1.6^2 * 5 / 20
        >>> length_trend({0: 100.0, 1: 104.0, 2: 102.0, 3: 106.0})
        (1.6, 0.015533980582524273, 0.64)
    """
    if len(mean_length_by_version) < max(3, min_versions):
        return NAN, NAN, NAN
    x = np.array(sorted(mean_length_by_version), dtype=np.float64)
    y = np.array([mean_length_by_version[int(v)] for v in x], dtype=np.float64)
    xc, yc = x - x.mean(), y - y.mean()
    slope = float((xc @ yc) / (xc @ xc))
    ss_tot = float(yc @ yc)
    r2 = 0.0 if ss_tot == 0 else float(slope * slope * (xc @ xc) / ss_tot)
    return slope, slope / float(y.mean()), round(r2, 12)


class DriftMonitor:
    """Accumulates ingested minibatches and emits drift metrics every `window` of them.

    Args:
        window: minibatches per window (>= 1).
        group_size: minibatches per batch group (`schedule.k`), for the group-load CVs; None: infer.
        cumulative_max_prompts: the cumulative tau uses at most this many most recent prompts (its cost grows
            with the number of prompts kept).

    `add(observation)` returns None until the window is full, then the window's metric dict: the
    `window_stats` keys as `drift/<key>_window` for tau and bias, `drift/<key>` for the rest, plus
    `drift/tau_cumulative` (all prompts since the start or `reset`, the last `cumulative_max_prompts` at most),
    `drift/length_trend_slope` (tokens / version), `drift/length_trend_relative_slope`,
    `drift/length_trend_change` (relative slope x the span of versions seen: the fractional length change the
    line implies), `drift/length_trend_r2`, `drift/versions` and `drift/window_index` (0-based).
    """

    def __init__(
        self, window: int, group_size: int | None = None, cumulative_max_prompts: int = CUMULATIVE_MAX_PROMPTS
    ) -> None:
        if window < 1 or cumulative_max_prompts < 2:
            raise ValueError(f"window must be >= 1 minibatch and cumulative_max_prompts >= 2; got {window}")
        self.window = window
        self.cumulative_max_prompts = cumulative_max_prompts
        self.group_size = group_size
        self.windows_emitted = 0
        self.reset()

    def reset(self) -> None:
        """Forget the cumulative history (after a re-profile or recalibration); the window count continues."""
        self._pending: list[MinibatchObservation] = []
        self._pred: list[np.ndarray] = []
        self._real: list[np.ndarray] = []
        self._tokens: dict[int, float] = {}
        self._samples: dict[int, int] = {}

    def mean_length_by_version(self) -> dict[int, float]:
        """Policy version -> mean realized length (tokens per sample) since the start or `reset`."""
        return {v: self._tokens[v] / self._samples[v] for v in sorted(self._samples) if self._samples[v]}

    def add(self, observation: MinibatchObservation) -> dict[str, float] | None:
        """Record one ingested minibatch; return the window's metrics when it completes a window."""
        self._pending.append(observation)
        v = int(observation.policy_version)
        self._tokens[v] = self._tokens.get(v, 0.0) + float(observation.realized.sum())
        self._samples[v] = self._samples.get(v, 0) + int(observation.realized.size)
        self._pred.append(observation.predicted)
        self._real.append(observation.realized_mean)
        if len(self._pending) < self.window:
            return None
        metrics = self._emit()
        self._pending = []
        return metrics

    def _cumulative_tau(self) -> float:
        pred, real = np.concatenate(self._pred), np.concatenate(self._real)
        if pred.size > self.cumulative_max_prompts:
            pred, real = pred[-self.cumulative_max_prompts :], real[-self.cumulative_max_prompts :]
            self._pred, self._real = [pred], [real]
        return kendall_tau(pred, real)

    def _emit(self) -> dict[str, float]:
        stats = window_stats(self._pending, self.group_size)
        by_version = self.mean_length_by_version()
        slope, rel, r2 = length_trend(by_version, TREND_MIN_VERSIONS)
        span = float(max(by_version) - min(by_version)) if by_version else 0.0
        out = {f"drift/{k}": v for k, v in stats.items() if k not in ("tau", "bias", "prompts")}
        out |= {
            "drift/window_index": float(self.windows_emitted),
            "drift/prompts_window": stats["prompts"],
            "drift/tau_window": stats["tau"],
            "drift/bias_window": stats["bias"],
            "drift/tau_cumulative": self._cumulative_tau(),
            "drift/length_trend_slope": slope,
            "drift/length_trend_relative_slope": rel,
            "drift/length_trend_change": rel * span,
            "drift/length_trend_r2": r2,
            "drift/versions": float(len(by_version)),
        }
        self.windows_emitted += 1
        return out
