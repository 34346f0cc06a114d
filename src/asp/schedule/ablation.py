"""C0-C4 ablation and the controlled-tau sweep of paper §5.3 / appendix F.6.2, on any length vector.

Conditions (metrics always on true lengths):
  C0 fixed-size minibatches of b in original order      C1 sorted by load, fixed size b
  C2 DP minibatches (b..b+kappa) in the same order      C3 C2's minibatches randomly shuffled
  C4 C2's minibatches in ASP's balanced order

Same inputs: within a seed every condition gets the prompts in one order and one load vector (raw predictions,
calibrated ones, or K-fold cross-fitted calibrated ones: `cross_fitted_loads`), so C1 and C2 differ only in the
cut and C2-C4 only in the minibatches' order. What a seed varies is stated (`AblationResult.varies`): the prompts'
order (`order="shuffled"`, C0's schedule), the cross-fitting folds, C3's shuffle, C4's annealing and, for
simulated predictions, the prediction noise; the prompt set itself is the same in every seed.

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

from asp.predictor.calibration import fit_calibration, fit_isotonic
from asp.predictor.metrics import kendall_tau
from asp.schedule.conditions import CONDITION_NAMES, condition_schedule
from asp.schedule.metrics import dispatch_metrics
from asp.schedule.schedule import Calibration, expected_lengths
from asp.schedule.spec import PAPER_TAUS, ScheduleSpec
from asp.schedule.validate import as_choice, as_int, as_lengths

CONDITIONS = CONDITION_NAMES  # public name of the table rows
METRICS = ("D", "P", "CV", "spread")
LENGTH_CAP = 8192
ORDERS = ("shuffled", "given")  # the prompts' order per seed: a seeded permutation, or as given


def synthetic_lengths(n: int, seed: int, cap: int = LENGTH_CAP) -> np.ndarray:
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


LOG_CLIP = (-30.0, 27.0)  # simulated log-predictions in [1e-13, 5.3e11]: sums of a minibatch stay below 1e15


def predictions_at(true_lengths: np.ndarray, nu: float, seed: int) -> np.ndarray:
    """l * exp(nu * eps) with eps ~ N(0, 1) drawn from `seed`, the log clipped to `LOG_CLIP` (large nu at low tau
    would overflow the scheduler's length range; only the extreme tails of the noise are clipped); nu = inf
    gives a random permutation of l."""
    rng = np.random.default_rng([seed, 0x7A])
    if np.isinf(nu):
        return rng.permutation(true_lengths)
    return np.exp(np.clip(np.log(true_lengths) + nu * rng.standard_normal(true_lengths.size), *LOG_CLIP))


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


@dataclass(frozen=True)
class FixedLoads:
    """Calibration stand-in: the given expected lengths [n] of exactly the given predictions [n].

    The scheduler calls its calibration on the prediction vector it schedules; this one answers with per-prompt
    loads (e.g. cross-fitted ones, which no single map of the prediction gives) and refuses any other vector, so
    every condition built with it balances and sorts the same numbers.
    """

    predicted: np.ndarray
    loads: np.ndarray

    def __call__(self, values: np.ndarray) -> np.ndarray:
        if not np.array_equal(np.asarray(values, dtype=np.float64), self.predicted):
            raise ValueError("FixedLoads is called on other predictions than the ones it holds loads for")
        return self.loads.copy()


def seeded_folds(predicted: np.ndarray, folds: int, seed: int | None) -> np.ndarray:
    """Fold of each prompt, interleaved by predicted rank: each run of `folds` consecutive ranks holds every fold
    once (so each fold's complement covers the whole prediction range). seed None: rank r -> fold r mod `folds`
    (`asp.predictor.calibration.calibration_folds`, what the evaluate stage uses); a seed permutes the folds
    within each run of ranks, so different seeds cross-fit on different splits.

    Returns:
        int64 [n] fold index in 0..folds-1 per prompt (input order).
    """
    p = np.asarray(predicted, dtype=np.float64)
    if isinstance(folds, bool) or not isinstance(folds, int | np.integer) or not 2 <= folds <= p.size:
        raise ValueError(f"folds must be an integer in [2, n = {p.size}], got {folds!r}")
    if seed is None:
        labels = np.arange(p.size) % folds
    else:
        runs = -(-p.size // folds)
        rng = np.random.default_rng([as_int(seed, "seed", minimum=0), 0xF0])
        labels = np.argsort(rng.random((runs, folds)), axis=1).ravel()[: p.size]
    fold = np.empty(p.size, dtype=np.int64)
    fold[np.argsort(p, kind="stable")] = labels
    return fold


def cross_fitted_loads(predicted: object, true: object, folds: int, seed: int | None = None) -> np.ndarray:
    """Out-of-fold calibrated lengths [n]: each prompt's prediction mapped by an isotonic fit on the other folds
    (`seeded_folds`). seed None gives `asp.predictor.calibration.cross_fit_calibration`'s values."""
    p = np.asarray(predicted, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    if p.ndim != 1 or p.shape != t.shape:
        raise ValueError(f"predicted and true must be 1-D arrays of equal length; got {p.shape}, {t.shape}")
    fold = seeded_folds(p, folds, seed)
    out = np.empty_like(p)
    for f in range(folds):
        held = fold == f
        out[held] = fit_calibration(p[~held], t[~held])(p[held])
    return out


def dataset_order(n: int, seed: int, order: str) -> np.ndarray:
    """The order the prompts are presented in for one seed: as given, or a seeded random permutation (what a
    shuffling data loader hands the scheduler; C0 dispatches it as is)."""
    order = as_choice(order, "order", ORDERS)
    if order == "given":
        return np.arange(n)
    return np.random.default_rng([seed, 0x0D]).permutation(n)


def _conditions(
    true: np.ndarray,
    pred: np.ndarray,
    spec: ScheduleSpec,
    seed: int,
    calibration: Calibration | None,
    loads: str | None,
    conditions: Sequence[str] = CONDITION_NAMES,
) -> dict[str, dict[str, float]]:
    """Metrics of the conditions for one prediction vector and seed, measured on the true lengths. The loads are
    resolved once (`expected_lengths`) and handed to every condition as `FixedLoads`, so C1-C4 sort, cut and
    balance the same numbers; each schedule is built by `condition_schedule` (the code the `launch` stage runs).
    """
    expected, mode = expected_lengths(pred, calibration, loads)
    fixed = FixedLoads(pred, expected) if mode == "calibrated" else None
    ids = np.arange(true.size)
    out = {}
    for name in conditions:
        s = condition_schedule(ids, pred, name, **spec.kwargs(), seed=seed, calibration=fixed, loads=mode)
        out[name] = dispatch_metrics(true[s.positions], s.offsets, spec.k)
    out["loads"] = {"tau": kendall_tau(true, expected)}  # NaN for constant loads
    return out


def _table(runs: list[dict[str, dict[str, float]]], stat: str = "mean") -> pd.DataFrame:
    names = [c for c in runs[0] if c in CONDITION_NAMES]

    def reduce(values: list[float]) -> float:
        if stat == "mean":
            return float(np.mean(values))
        return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0

    rows = {c: {m: reduce([r[c][m] for r in runs]) for m in METRICS} for c in names}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRICS)]


@dataclass(frozen=True, slots=True)
class AblationResult:
    """C0-C4 over seeds.

    Attributes:
        mean: DataFrame indexed C0..C4, columns D (tokens), P, CV, spread: means over seeds.
        sd: the same layout: sample standard deviation over seeds (0 with one seed).
        loads_tau: mean over seeds of Kendall tau between the loads every condition saw and the true lengths.
        seeds: the seeds.
        varies: what the seeds varied, in words.
    """

    mean: pd.DataFrame
    sd: pd.DataFrame
    loads_tau: float
    seeds: tuple[int, ...]
    varies: str


def run_ablation(
    true_lengths: object,
    predicted_lengths: object,
    spec: ScheduleSpec,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    calibration: Calibration | None = None,
    loads: str | None = None,
    cross_fit: int = 0,
    order: str = "shuffled",
) -> AblationResult:
    """C0-C4 (paper §5.3) over seeds: D, P, CV and spread measured on true lengths, their mean and spread.

    Every condition of a seed sees the same inputs: the prompts in one order and one load vector (raw
    predictions, `calibration` applied to them, or with `cross_fit` = K their K-fold cross-fitted calibrated
    lengths); C1-C4 sort, cut and balance those loads. What a seed varies: the order the prompts come in
    (`order="shuffled"`: a seeded permutation, which is C0's schedule; "given": the input order in every seed),
    the cross-fitting folds (`cross_fit` > 0), C3's shuffle and C4's annealing, and the prediction vector when
    `predicted_lengths` has one row per seed (simulated predictions). The prompt set is the same in every seed.

    Args:
        true_lengths: (n,) measured lengths.
        predicted_lengths: (n,) predictions shared by all seeds, or (len(seeds), n), one row per seed.
        spec: scheduler settings (C0/C1 use fixed size spec.b; iterations and method balance C4).
        seeds: one run per seed.
        calibration, loads: as in `build_schedule` (ignored when `cross_fit` > 0).
        cross_fit: K >= 2: loads are K-fold cross-fitted isotonic calibrations of the predictions against the true
            lengths (`cross_fitted_loads`, folds drawn per seed); 0: `calibration` / `loads` as given.
        order: "shuffled" or "given" (see above).

    Returns:
        `AblationResult`.

    Raises:
        ValueError: bad lengths, mismatched sizes or parameters.
    """
    true = as_lengths(true_lengths, "true_lengths")
    pred = np.asarray(predicted_lengths, dtype=np.float64)
    seeds = [as_int(s, "seeds", minimum=0) for s in seeds]
    order = as_choice(order, "order", ORDERS)
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed")
    rows = pred[None, :] if pred.ndim == 1 else pred
    if rows.ndim != 2 or rows.shape[1] != true.size or rows.shape[0] not in (1, len(seeds)):
        raise ValueError(
            f"predicted_lengths has shape {pred.shape}; expected ({true.size},) or ({len(seeds)}, {true.size})"
        )
    cross_fit = as_int(cross_fit, "cross_fit", minimum=0)
    if cross_fit == 1 or cross_fit > true.size:
        raise ValueError(f"cross_fit must be 0 or a number of folds in [2, n = {true.size}], got {cross_fit}")
    runs = []
    for i, seed in enumerate(seeds):
        perm = dataset_order(true.size, seed, order)
        t = true[perm]
        p = as_lengths(rows[i if rows.shape[0] > 1 else 0], "predicted_lengths")[perm]
        if cross_fit:
            runs.append(_conditions(t, p, spec, seed, FixedLoads(p, cross_fitted_loads(p, t, cross_fit, seed)), None))
        else:
            runs.append(_conditions(t, p, spec, seed, calibration, loads))
    varies = [
        "the prompts' order (C0's minibatches)" if order == "shuffled" else "",
        "the cross-fitting folds (the loads of C1-C4)" if cross_fit else "",
        "the predictions" if rows.shape[0] > 1 else "",
        "C3's shuffle and C4's annealing",
    ]
    return AblationResult(
        mean=_table(runs),
        sd=_table(runs, "sd"),
        loads_tau=float(np.mean([r["loads"]["tau"] for r in runs])),
        seeds=tuple(seeds),
        varies=", ".join(v for v in varies if v),
    )


def ablation(
    true_lengths: object,
    predicted_lengths: object,
    spec: ScheduleSpec,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    calibration: Calibration | None = None,
    loads: str | None = None,
    cross_fit: int = 0,
    order: str = "shuffled",
) -> pd.DataFrame:
    """C0-C4 table (paper §5.3): mean over seeds of D, P, CV and spread, measured on true lengths
    (`run_ablation(...).mean`; see it for what each seed varies and `.sd` for the spread over seeds).

    Returns:
        DataFrame indexed C0..C4 with columns D (tokens), P, CV, spread.
    """
    return run_ablation(
        true_lengths,
        predicted_lengths,
        spec,
        seeds=seeds,
        calibration=calibration,
        loads=loads,
        cross_fit=cross_fit,
        order=order,
    ).mean


@dataclass(slots=True)
class SweepResult:
    """The tables of the controlled-tau sweep (means over seeds).

    Attributes:
        local: Table 9 analogue, one row per tau: tau_measured, MAE, D_C0, D_C1, D_C2-C4, P_C0, P_C1, P_C2-C4.
        cv: Table 10 analogue, one row per tau: group-load CV of C0..C4 (raw predicted loads) and C4_cal.
        cv_sd: the same layout: sample standard deviation of the CVs over seeds (0 with one seed).
        per_seed: one row per (tau, seed): the group-load CV of C0..C4 and C4_cal in that seed (C0 and C4 of one
            seed share the prompts' order, so their difference is paired).
    """

    local: pd.DataFrame
    cv: pd.DataFrame
    cv_sd: pd.DataFrame | None = None
    per_seed: pd.DataFrame | None = None

    def gain(self, condition: str = "C4_cal", baseline: str = "C0") -> pd.DataFrame:
        """Per tau: mean over seeds of CV(baseline) - CV(condition) (> 0: `condition` balances better), its
        standard error over seeds (paired: NaN with one seed) and the number of seeds."""
        if self.per_seed is None:
            raise ValueError("this SweepResult has no per-seed CVs; run sweep() again")
        d = (self.per_seed[baseline] - self.per_seed[condition]).groupby(self.per_seed["tau"])
        out = pd.DataFrame({"gain": d.mean(), "se": d.std(ddof=1) / np.sqrt(d.count()), "seeds": d.count()})
        return out.sort_index(ascending=False)

    def stops_helping(
        self, condition: str = "C4_cal", baseline: str = "C0", z: float = 0.0
    ) -> tuple[float | None, float | None]:
        """Where `condition` stops beating `baseline` on group-load CV, going down the tau grid.

        `condition` beats `baseline` at a tau when its mean CV over seeds is lower (z = 0), or lower by more than z
        paired standard errors (z > 0: `gain` > z * se; needs more than one seed).

        Returns:
            (lowest, below): `lowest` is the smallest grid tau such that `condition` beats `baseline` at it and at
            every larger grid tau (None if not even at the largest); `below` is the next smaller grid tau, the
            first where it does not (None if it beats the baseline everywhere).
        """
        if z > 0:
            g = self.gain(condition, baseline)
            beats = g["gain"] > z * g["se"]
        else:
            cv = self.cv.sort_index(ascending=False)
            beats = cv[condition] < cv[baseline]
        lowest = None
        for tau, ok in beats.items():
            if not ok:
                return lowest, float(tau)
            lowest = float(tau)
        return lowest, None


def sweep(
    true_lengths: object,
    spec: ScheduleSpec,
    *,
    taus: Sequence[float] = PAPER_TAUS,
    seeds: Sequence[int] = (0, 1, 2),
    calibration_size: int = 4000,
    order: str = "shuffled",
) -> SweepResult:
    """Controlled-tau sweep (appendix F.6.2): Tables 9 and 10 for a length vector.

    For each tau and seed the same simulated prediction vector feeds every condition. C4_cal balances loads
    calibrated by isotonic regression fitted on an independent profile of `calibration_size` prompts (fresh
    noise at the same nu), as a deployed predictor's held-out calibration would be. A seed varies the simulated
    predictions, C3's shuffle, C4's annealing and (`order="shuffled"`) the prompts' order, hence C0.

    Args:
        true_lengths: (n,) measured (or synthetic) lengths.
        spec: scheduler settings shared by every condition.
        taus: Kendall tau targets in [0, 1].
        seeds: one simulated prediction vector (and prompt order, C3/C4 seed) per seed.
        calibration_size: prompts in the simulated profile the isotonic map is fitted on (at most n).
        order: "shuffled" (a seeded permutation of the prompts per seed) or "given" (their input order).

    Returns:
        `SweepResult` (Tables 9 and 10, means and standard deviations over seeds).
    """
    true = as_lengths(true_lengths, "true_lengths")
    seeds = [as_int(s, "seeds", minimum=0) for s in seeds]
    order = as_choice(order, "order", ORDERS)
    if not seeds or not taus:
        raise ValueError("seeds and taus must be non-empty")
    m = min(as_int(calibration_size, "calibration_size", minimum=2), true.size)
    local, cv, cv_sd, per_seed = [], [], [], []
    for tau in taus:
        runs, cal_cv, taus_hat, maes = [], [], [], []
        for seed in seeds:
            t = true[dataset_order(true.size, seed, order)]
            pred, nu = perturb_predictions(t, float(tau), seed)
            taus_hat.append(kendall_tau(t, pred))
            maes.append(float(np.abs(pred - t).mean()))
            runs.append(_conditions(t, pred, spec, seed, None, "raw"))
            profile = np.random.default_rng([seed, 0xCA]).choice(t.size, size=m, replace=False)
            prof_pred = predictions_at(t[profile], nu, seed + 10_007)
            knots = fit_isotonic(prof_pred, t[profile])
            cal_cv.append(_conditions(t, pred, spec, seed, knots, "calibrated", ("C4",))["C4"]["CV"])
            per_seed.append({"tau": tau, "seed": seed, **{c: runs[-1][c]["CV"] for c in CONDITIONS}})
            per_seed[-1]["C4_cal"] = cal_cv[-1]
        mean, sd = _table(runs), _table(runs, "sd")
        local.append(
            {
                "tau": tau,
                "tau_measured": np.mean(taus_hat),
                "MAE": np.mean(maes),
                "D_C0": mean.at["C0", "D"],
                "D_C1": mean.at["C1", "D"],
                "D_C2-C4": mean.at["C2", "D"],
                "P_C0": mean.at["C0", "P"],
                "P_C1": mean.at["C1", "P"],
                "P_C2-C4": mean.at["C2", "P"],
            }
        )
        cv.append({"tau": tau, **{c: mean.at[c, "CV"] for c in CONDITIONS}, "C4_cal": float(np.mean(cal_cv))})
        cal_sd = float(np.std(cal_cv, ddof=1)) if len(cal_cv) > 1 else 0.0
        cv_sd.append({"tau": tau, **{c: sd.at[c, "CV"] for c in CONDITIONS}, "C4_cal": cal_sd})
    local_t, cv_t, cv_sd_t = (pd.DataFrame(rows).set_index("tau") for rows in (local, cv, cv_sd))
    return SweepResult(local_t, cv_t, cv_sd=cv_sd_t, per_seed=pd.DataFrame(per_seed))
