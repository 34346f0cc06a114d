"""Length-drift detector: thresholds, patience and cooldown over the monitor's windows (docs/drift.md).

Pure Python, no I/O. `DriftDetector.update(metrics)` reads one window's metric dict from
`asp.drift.monitor.DriftMonitor` and returns a `DriftEvent` when drift is confirmed, else None. A window
offends when any of these holds:

* tau:   drift/tau_window < reference_tau - tau_drop - REFERENCE_Z * reference_tau_se (reference_tau: the
         `evaluate` stage's held-out tau, reference_tau_se its standard error);
* bias:  |log(drift/bias_window / reference_bias)| > log(1 + bias_tolerance) + REFERENCE_Z * reference_bias_se
         (bias: the load ratio realized / calibrated; reference_bias: the evaluate stage's held-out load ratio,
         reference_bias_se the standard error of its log, `asp.drift.reference`);
* trend: |drift/length_trend_change| > trend and drift/length_trend_r2 >= trend_min_r2.

Windows with fewer than `min_prompts` prompts are ignored (they neither offend nor break a streak). After
`patience` offending windows in a row the detector fires once, naming the signals of the firing window, then
ignores `cooldown` windows. The settings (`SETTINGS`) have no defaults here: they are `drift:` in the params
(`asp.config.DriftParams`), whose defaults fire at most once in 1,000 stationary windows of 8 minibatches x 16
prompts, on real AlpacaEval lengths (tests/drift/test_real_streams.py) and on synthetic streams
(tests/drift/test_detector.py), catch phi-2-sft -> phi-2-dpo within 3 windows and confirm a 20 % length shift or a
tau drop of 0.15 within a few windows (docs/drift.md has the measured numbers).

Run the tests: `.venv/bin/python -m pytest tests/drift -q`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from asp.drift.reference import REFERENCE_Z

Action = Literal["warn", "recalibrate", "reprofile", "refit_from_run"]
SIGNALS = ("tau", "bias", "trend")

# The detector's settings: fields of the params' `drift:` section (asp.config.DriftParams holds their defaults).
SETTINGS = ("min_prompts", "tau_drop", "bias_tolerance", "trend", "trend_min_r2", "patience", "cooldown", "action")


@dataclass(frozen=True)
class DriftEvent:
    """A confirmed drift: which signals offended in the firing window, their values and thresholds.

    Attributes:
        window_index: the monitor's `drift/window_index` of the firing window (or the detector's own count).
        signals: offending signals, a subset of SIGNALS in that order.
        values: signal -> measured value (tau: window tau; bias: window bias; trend: implied relative change).
        thresholds: signal -> the bound it crossed (tau: the floor; bias: the factor, the band being
            [1 / factor, factor] x reference_bias; trend: the change bound).
        action: what the run should do (params `drift.action`).
        streak: offending windows in a row when it fired.
    """

    window_index: int
    signals: tuple[str, ...]
    values: dict[str, float]
    thresholds: dict[str, float]
    action: Action
    streak: int

    @property
    def message(self) -> str:
        """One readable line, e.g. for a log or an MLflow tag."""
        parts = [_describe(s, self.values[s], self.thresholds[s]) for s in self.signals]
        return (
            f"length drift at window {self.window_index} ({self.streak} windows in a row): "
            + "; ".join(parts)
            + f". Action: {self.action}."
        )


def _describe(signal: str, value: float, bound: float) -> str:
    if signal == "tau":
        return f"Kendall tau {value:.3f} < floor {bound:.3f}"
    if signal == "bias":
        return f"calibration bias (realized / predicted) {value:.3f} outside [1/{bound:.3f}, {bound:.3f}] x reference"
    return f"length trend implies {value:+.1%} over the versions seen (|change| > {bound:.1%})"


class DriftDetector:
    """Thresholds + patience + cooldown over window metrics (see the module docstring for the rules).

    Args:
        reference_tau: held-out Kendall tau of the predictor (evaluate stage); None disables the tau signal.
        reference_bias: the load ratio that counts as calibrated (the evaluate stage's held-out one).
        reference_tau_se, reference_bias_se: standard errors of the references (tau; log of the load ratio): the
            floor and the band are widened by `REFERENCE_Z` of them (0: references known exactly).
        min_prompts, tau_drop, bias_tolerance, trend, trend_min_r2, patience, cooldown, action: `SETTINGS`, the
            `drift:` params (`asp.config.DriftParams`, where their defaults live), e.g.
            ``DriftDetector(tau, **{k: getattr(params.drift, k) for k in SETTINGS})``.
    """

    def __init__(
        self,
        reference_tau: float | None,
        *,
        reference_bias: float = 1.0,
        reference_tau_se: float = 0.0,
        reference_bias_se: float = 0.0,
        min_prompts: int,
        tau_drop: float,
        bias_tolerance: float,
        trend: float,
        trend_min_r2: float,
        patience: int,
        cooldown: int,
        action: Action,
    ) -> None:
        _check(reference_bias > 0 and tau_drop > 0 and bias_tolerance > 0 and trend > 0, "thresholds must be > 0")
        _check(0 <= trend_min_r2 <= 1 and patience >= 1 and cooldown >= 0 and min_prompts >= 0, "bad counts")
        _check(reference_tau_se >= 0 and reference_bias_se >= 0, "standard errors must be >= 0")
        self.reference_tau = reference_tau
        self.reference_bias = reference_bias
        self.reference_tau_se, self.reference_bias_se = reference_tau_se, reference_bias_se
        self.min_prompts = min_prompts
        self.tau_drop, self.bias_tolerance = tau_drop, bias_tolerance
        self.trend, self.trend_min_r2 = trend, trend_min_r2
        self.patience, self.cooldown, self.action = patience, cooldown, action
        self.streak = 0
        self.cooling = 0
        self.seen = 0

    @property
    def tau_floor(self) -> float:
        """Window tau below this offends: reference_tau - tau_drop - REFERENCE_Z * reference_tau_se."""
        if self.reference_tau is None:
            return -math.inf
        return self.reference_tau - self.tau_drop - REFERENCE_Z * self.reference_tau_se

    @property
    def bias_factor(self) -> float:
        """The bias band is [1 / factor, factor] x reference_bias: (1 + bias_tolerance) x exp(REFERENCE_Z x se)."""
        return (1.0 + self.bias_tolerance) * math.exp(REFERENCE_Z * self.reference_bias_se)

    def offending(self, metrics: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """(values, thresholds) of the signals this window's metrics violate (empty dicts: none)."""
        values: dict[str, float] = {}
        bounds: dict[str, float] = {}
        tau = metrics.get("drift/tau_window", math.nan)
        if self.reference_tau is not None and _finite(tau) and tau < self.tau_floor:
            values["tau"], bounds["tau"] = tau, self.tau_floor
        ratio = metrics.get("drift/bias_window", math.nan)
        if _finite(ratio) and ratio > 0 and abs(math.log(ratio / self.reference_bias)) > math.log(self.bias_factor):
            values["bias"], bounds["bias"] = ratio, self.bias_factor
        change = metrics.get("drift/length_trend_change", math.nan)
        r2 = metrics.get("drift/length_trend_r2", math.nan)
        if _finite(change) and _finite(r2) and abs(change) > self.trend and r2 >= self.trend_min_r2:
            values["trend"], bounds["trend"] = change, self.trend
        return values, bounds

    def update(self, metrics: Mapping[str, float]) -> DriftEvent | None:
        """Feed one window's metrics; return a `DriftEvent` when drift is confirmed, else None."""
        index = int(metrics.get("drift/window_index", self.seen))
        self.seen += 1
        if self.cooling > 0:
            self.cooling -= 1
            return None
        if metrics.get("drift/prompts_window", 0.0) < self.min_prompts:
            return None
        values, bounds = self.offending(metrics)
        self.streak = self.streak + 1 if values else 0
        if self.streak < self.patience:
            return None
        event = DriftEvent(index, tuple(s for s in SIGNALS if s in values), values, bounds, self.action, self.streak)
        self.streak, self.cooling = 0, self.cooldown
        return event


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"DriftDetector: {what}")
