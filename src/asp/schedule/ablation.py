"""C0-C4 ablation and the controlled-tau sweep of paper §5.3 / appendix F.6.2, on any length vector.

Conditions (metrics always on true lengths):
  C0 fixed-size minibatches of b in original order      C1 sorted by prediction, fixed size b
  C2 DP minibatches (b..b+kappa) in sorted order        C3 C2's minibatches randomly shuffled
  C4 C2's minibatches in ASP's balanced order

Controlled predictions: l_hat = l * exp(nu * eps), eps ~ N(0, 1), with nu found by bisection so that Kendall's
tau-b(l, l_hat) hits the target; tau = 1 is the oracle (l_hat = l) and tau = 0 the nu -> infinity limit, taken
as a random permutation of l (independent ranks, realistic magnitudes). `sweep` also reports C4 balanced on
calibrated loads: an isotonic map fitted on an independent simulated profile of `calibration_size` prompts.
Scheduler settings (b, kappa, k, iterations, method) come as one `ScheduleSpec`; seeds are separate.

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_ablation.py -q`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from asp.predictor.calibration import fit_isotonic
from asp.predictor.metrics import kendall_tau
from asp.schedule.conditions import CONDITION_NAMES, condition_schedule
from asp.schedule.metrics import dispatch_metrics
from asp.schedule.schedule import Calibration
from asp.schedule.spec import PAPER_TAUS, ScheduleSpec
from asp.schedule.validate import as_int, as_lengths

CONDITIONS = CONDITION_NAMES  # public name of the table rows
METRICS = ("D", "P", "CV", "spread")
LENGTH_CAP = 8192


def synthetic_lengths(n: int, seed: int = 0, cap: int = LENGTH_CAP) -> np.ndarray:
    """DeepScaleR-like response lengths: long-tailed, integer, capped at `cap` with a visible mass at the cap.

    A log-normal body (median 5,200 tokens, sigma 0.55) plus 3% short answers (median 600), rounded and clipped
    to [16, cap]: mean about 5,220 tokens, std about 2,220 (the paper's C0 dispersion is 2,066-2,138), about 20%
    of responses at the cap (truncated), in random (i.i.d.) order.

    Returns:
        float64 (n,) lengths in tokens.
    """
    n = as_int(n, "n", minimum=1)
    rng = np.random.default_rng([as_int(seed, "seed", minimum=0), 0x5C])
    body = rng.lognormal(np.log(5200.0), 0.55, n)
    short = rng.lognormal(np.log(600.0), 0.5, n)
    x = np.where(rng.random(n) < 0.03, short, body)
    return np.clip(np.round(x), 16, cap).astype(np.float64)


def predictions_at(true_lengths: np.ndarray, nu: float, seed: int) -> np.ndarray:
    """l * exp(nu * eps) with eps ~ N(0, 1) drawn from `seed`; nu = inf gives a random permutation of l."""
    rng = np.random.default_rng([seed, 0x7A])
    if np.isinf(nu):
        return rng.permutation(true_lengths)
    return np.exp(np.log(true_lengths) + nu * rng.standard_normal(true_lengths.size))


def perturb_predictions(true_lengths: object, tau: float, seed: int, *, tol: float = 2e-3) -> tuple[np.ndarray, float]:
    """Simulated predictions l * exp(nu * eps) whose Kendall tau-b with the true lengths is about `tau`.

    Args:
        true_lengths: (n,) true lengths.
        tau: target in [0, 1]; 1 returns the true lengths, 0 a random permutation of them.
        seed: RNG seed for eps (and the permutation).
        tol: bisection stops when |tau_hat - tau| < tol (tau measured on up to 20,000 sampled prompts).

    Returns:
        (predictions (n,), nu); nu is inf for tau = 0.
    """
    true = as_lengths(true_lengths, "true_lengths")
    seed = as_int(seed, "seed", minimum=0)
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must lie in [0, 1], got {tau}")
    if tau >= 1.0:
        return true.copy(), 0.0
    if tau <= 0.0:
        return predictions_at(true, np.inf, seed), float("inf")
    if true.min() == true.max():
        raise ValueError(f"all {true.size} true lengths are equal ({true[0]:g}), so no prediction has tau {tau}")
    sub = np.random.default_rng([seed, 0x5B]).choice(true.size, size=min(true.size, 20_000), replace=False)
    sub.sort()

    def tau_at(nu: float) -> float:
        return kendall_tau(true[sub], predictions_at(true, nu, seed)[sub])

    lo, hi = 0.0, 0.5
    while tau_at(hi) > tau and hi < 100.0:
        lo, hi = hi, hi * 2.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        got = tau_at(mid)
        if abs(got - tau) < tol:
            lo = hi = mid
            break
        lo, hi = (mid, hi) if got > tau else (lo, mid)
    nu = 0.5 * (lo + hi)
    return predictions_at(true, nu, seed), nu


def _conditions(
    true: np.ndarray,
    pred: np.ndarray,
    spec: ScheduleSpec,
    seed: int,
    calibration: Calibration | None,
    loads: str | None,
) -> dict[str, dict[str, float]]:
    """Metrics of C0..C4 for one prediction vector and seed: each condition's schedule is built by
    `condition_schedule` (the same code the `launch` stage runs) and measured on the true lengths."""
    ids = np.arange(true.size)
    out = {}
    for name in CONDITION_NAMES:
        s = condition_schedule(ids, pred, name, **spec.kwargs(), seed=seed, calibration=calibration, loads=loads)
        out[name] = dispatch_metrics(true[s.positions], s.offsets, spec.k)
    return out


def _table(runs: list[dict[str, dict[str, float]]]) -> pd.DataFrame:
    rows = {c: {m: float(np.mean([r[c][m] for r in runs])) for m in METRICS} for c in runs[0]}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRICS)]


def ablation(
    true_lengths: object,
    predicted_lengths: object,
    spec: ScheduleSpec,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    calibration: Calibration | None = None,
    loads: str | None = None,
) -> pd.DataFrame:
    """C0-C4 table (paper §5.3): mean over seeds of D, P, CV and spread, measured on true lengths.

    Args:
        true_lengths: (n,) measured lengths.
        predicted_lengths: (n,) predictions shared by all seeds, or (len(seeds), n), one row per seed.
        spec: scheduler settings (C0/C1 use fixed size spec.b; iterations and method balance C4).
        seeds: seeds for C3's shuffle and C4's balancing.
        calibration, loads: as in `build_schedule` (C2-C4 are built on the resulting loads).

    Returns:
        DataFrame indexed C0..C4 with columns D (tokens), P, CV, spread.

    Raises:
        ValueError: bad lengths, mismatched sizes or parameters.
    """
    true = as_lengths(true_lengths, "true_lengths")
    pred = np.asarray(predicted_lengths, dtype=np.float64)
    seeds = [as_int(s, "seeds", minimum=0) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed")
    rows = pred[None, :] if pred.ndim == 1 else pred
    if rows.ndim != 2 or rows.shape[1] != true.size or rows.shape[0] not in (1, len(seeds)):
        raise ValueError(
            f"predicted_lengths has shape {pred.shape}; expected ({true.size},) or ({len(seeds)}, {true.size})"
        )
    runs = []
    for i, seed in enumerate(seeds):
        p = as_lengths(rows[i if rows.shape[0] > 1 else 0], "predicted_lengths")
        runs.append(_conditions(true, p, spec, seed, calibration, loads))
    return _table(runs)


@dataclass(slots=True)
class SweepResult:
    """The two tables of the controlled-tau sweep (means over seeds).

    Attributes:
        local: Table 9 analogue, one row per tau: tau_measured, MAE, D_C0, D_C1, D_C2-C4, P_C0, P_C1, P_C2-C4.
        cv: Table 10 analogue, one row per tau: group-load CV of C0..C4 (raw predicted loads) and C4_cal.
    """

    local: pd.DataFrame
    cv: pd.DataFrame


def sweep(
    true_lengths: object,
    spec: ScheduleSpec,
    *,
    taus: Sequence[float] = PAPER_TAUS,
    seeds: Sequence[int] = (0, 1, 2),
    calibration_size: int = 4000,
) -> SweepResult:
    """Controlled-tau sweep (appendix F.6.2): Tables 9 and 10 for a length vector.

    For each tau and seed the same simulated prediction vector feeds every condition. C4_cal balances loads
    calibrated by isotonic regression fitted on an independent profile of `calibration_size` prompts (fresh
    noise at the same nu), as a deployed predictor's held-out calibration would be.

    Args:
        true_lengths: (n,) measured (or synthetic) lengths.
        spec: scheduler settings shared by every condition.
        taus: Kendall tau targets in [0, 1].
        seeds: one simulated prediction vector (and C3/C4 seed) per seed.
        calibration_size: prompts in the simulated profile the isotonic map is fitted on.

    Returns:
        `SweepResult` (Tables 9 and 10, means over seeds).
    """
    true = as_lengths(true_lengths, "true_lengths")
    seeds = [as_int(s, "seeds", minimum=0) for s in seeds]
    if not seeds or not taus:
        raise ValueError("seeds and taus must be non-empty")
    m = min(as_int(calibration_size, "calibration_size", minimum=2), true.size)
    local, cv = [], []
    for tau in taus:
        runs, cal_cv, taus_hat, maes = [], [], [], []
        for seed in seeds:
            pred, nu = perturb_predictions(true, float(tau), seed)
            taus_hat.append(kendall_tau(true, pred))
            maes.append(float(np.abs(pred - true).mean()))
            runs.append(_conditions(true, pred, spec, seed, None, "raw"))
            profile = np.random.default_rng([seed, 0xCA]).choice(true.size, size=m, replace=False)
            prof_pred = predictions_at(true[profile], nu, seed + 10_007)
            knots = fit_isotonic(prof_pred, true[profile])
            cal_cv.append(_conditions(true, pred, spec, seed, knots, "calibrated")["C4"]["CV"])
        t = _table(runs)
        local.append(
            {
                "tau": tau,
                "tau_measured": np.mean(taus_hat),
                "MAE": np.mean(maes),
                "D_C0": t.at["C0", "D"],
                "D_C1": t.at["C1", "D"],
                "D_C2-C4": t.at["C2", "D"],
                "P_C0": t.at["C0", "P"],
                "P_C1": t.at["C1", "P"],
                "P_C2-C4": t.at["C2", "P"],
            }
        )
        cv.append({"tau": tau, **{c: t.at[c, "CV"] for c in CONDITIONS}, "C4_cal": float(np.mean(cal_cv))})
    return SweepResult(pd.DataFrame(local).set_index("tau"), pd.DataFrame(cv).set_index("tau"))
