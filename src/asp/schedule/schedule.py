"""The whole offline scheduling pass (paper §3.2-3.4): predictions in, a dispatchable `Schedule` out.

    sort by expected length -> DP minibatches (sizes b..b+kappa) -> balanced batch groups of k -> dispatch order

`build_schedule` balances *expected* loads: when a calibration map (predicted -> expected true length, e.g.
an isotonic fit on held-out profiled prompts) is given, it is applied first (`loads="calibrated"`, the
default then), otherwise raw predictions are used (`loads="raw"`). The `Schedule` keeps everything the async
runtime needs: minibatches of prompt ids in dispatch order, whose consecutive runs of k are the batch groups.
`schedule_to_frame` / `schedule_from_frame` convert to and from one row per prompt (the Parquet layout).

Run the checks: `.venv/bin/python -m pytest tests/schedule/test_schedule.py -q`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from asp.schedule.balance import balance_groups, shuffle_groups
from asp.schedule.dp import build_minibatches, is_feasible
from asp.schedule.metrics import dispatch_metrics, schedule_metrics
from asp.schedule.spec import BUILD_METHODS
from asp.schedule.validate import as_choice, as_int, as_lengths

Calibration = Callable[[np.ndarray], np.ndarray] | tuple[Any, Any] | Mapping[str, Any]
FRAME_COLUMNS = ("prompt_id", "minibatch_id", "group_id", "dispatch_rank", "predicted_length", "load_used")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A rollout schedule. Arrays of length n are per prompt in dispatch order; N_B = number of minibatches.

    Attributes:
        prompt_ids: (n,) prompt ids, minibatch after minibatch in dispatch order.
        positions: (n,) int64 row of each prompt in the arrays given to `build_schedule`.
        offsets: (N_B + 1,) int64; the p-th dispatched minibatch is prompt_ids[offsets[p]:offsets[p + 1]].
        minibatch_ids: (N_B,) int64 id of the p-th dispatched minibatch = its rank in length-sorted order.
        predicted_lengths: (n,) raw predicted lengths (tokens).
        loads: (n,) per-prompt loads that were balanced (calibrated or raw predictions, tokens).
        k: minibatches per batch group; group g = dispatch ranks g*k .. g*k+k-1 (the last may be partial).
        info: build parameters (b, kappa, method, iterations, seed, loads, shuffle, feasible).
    """

    prompt_ids: np.ndarray
    positions: np.ndarray
    offsets: np.ndarray
    minibatch_ids: np.ndarray
    predicted_lengths: np.ndarray
    loads: np.ndarray
    k: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def n_minibatches(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_groups(self) -> int:
        """Number of batch groups, counting a trailing partial group."""
        return -(-self.n_minibatches // self.k)

    @property
    def minibatch_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def minibatch_loads(self) -> np.ndarray:
        """(N_B,) balanced load of each minibatch in dispatch order."""
        return np.add.reduceat(self.loads, self.offsets[:-1])

    @property
    def group_loads(self) -> np.ndarray:
        """(n_groups,) balanced load of each batch group in dispatch order."""
        return np.add.reduceat(self.minibatch_loads, np.arange(0, self.n_minibatches, self.k))

    def minibatch(self, rank: int) -> np.ndarray:
        """Prompt ids of the minibatch dispatched at position `rank`."""
        return self.prompt_ids[self.offsets[rank] : self.offsets[rank + 1]]

    def minibatches(self) -> list[np.ndarray]:
        """Prompt ids of every minibatch, in dispatch order."""
        return [self.minibatch(p) for p in range(self.n_minibatches)]

    def groups(self) -> list[list[np.ndarray]]:
        """Batch groups in dispatch order, each a list of its minibatches' prompt ids (the dispatch units)."""
        mbs = self.minibatches()
        return [mbs[g : g + self.k] for g in range(0, len(mbs), self.k)]


def resolve_calibration(calibration: Calibration) -> Callable[[np.ndarray], np.ndarray]:
    """Turn a callable, an (x, y) knot pair or a {"x": .., "y": ..} mapping into a float64 -> float64 map.

    Knots are interpolated with np.interp (constant beyond the ends); x must be strictly increasing.
    """
    if callable(calibration):
        return calibration
    if isinstance(calibration, Mapping):
        if not {"x", "y"} <= set(calibration):
            raise ValueError(f"calibration mapping needs keys 'x' and 'y', got {sorted(calibration)}")
        calibration = (calibration["x"], calibration["y"])
    if not isinstance(calibration, tuple | list) or len(calibration) != 2:
        raise ValueError("calibration must be a callable, an (x, y) pair of knot arrays or a {'x', 'y'} mapping")
    x = np.asarray(calibration[0], dtype=np.float64)
    y = np.asarray(calibration[1], dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise ValueError(f"calibration knots x and y must be 1-D of equal non-zero size, got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or np.any(np.diff(x) <= 0):
        raise ValueError("calibration knots must be finite and x strictly increasing")
    return lambda values: np.interp(values, x, y)


def expected_lengths(
    predicted: np.ndarray, calibration: Calibration | None, loads: str | None
) -> tuple[np.ndarray, str]:
    """Per-prompt loads to schedule on, and the resolved loads mode ("raw" or "calibrated")."""
    mode = as_choice(loads or ("calibrated" if calibration is not None else "raw"), "loads", ("raw", "calibrated"))
    if mode == "raw":
        return predicted, mode
    if calibration is None:
        raise ValueError('loads="calibrated" needs a calibration map (predicted -> expected true length)')
    values = np.asarray(resolve_calibration(calibration)(predicted.copy()), dtype=np.float64)
    if values.shape != predicted.shape:
        raise ValueError(f"calibration returned shape {values.shape} for input shape {predicted.shape}")
    return as_lengths(values, "calibration(predicted_lengths)"), mode


def plan_minibatches(
    predicted: np.ndarray, expected: np.ndarray, b: int, kappa: int, on_infeasible: str = "short"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort by (expected, predicted, row) and cut with the DP.

    Returns:
        order (n,) rows in sorted order; endpoints (N_B + 1,) into `order`; (N_B,) minibatch loads.
    """
    order = np.lexsort((np.arange(predicted.size), predicted, expected))
    sorted_loads = expected[order]
    endpoints = build_minibatches(sorted_loads, b, kappa, on_infeasible=on_infeasible)
    return order, endpoints, np.add.reduceat(sorted_loads, endpoints[:-1])


def assemble(order: np.ndarray, endpoints: np.ndarray, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, offsets) for dispatching minibatch perm[p] of a plan p-th."""
    sizes = np.diff(endpoints)[perm]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    shift = np.repeat(endpoints[:-1][perm] - offsets[:-1], sizes)
    return order[np.arange(offsets[-1]) + shift], offsets


def build_schedule(
    prompt_ids: object,
    predicted_lengths: object,
    *,
    b: int,
    kappa: int,
    k: int,
    iterations: int,
    seed: int,
    method: str,
    calibration: Calibration | None = None,
    loads: str | None = None,
    shuffle: bool = False,
    on_infeasible: str = "short",
) -> Schedule:
    """Build the ASP rollout schedule for a dataset (b, kappa, k, iterations: no defaults; `PAPER_SPEC.kwargs()`
    gives the paper's appendix E.4 settings, the `schedule:` params a pipeline run's).

    Args:
        prompt_ids: (n,) unique ids (ints or strings).
        predicted_lengths: (n,) predicted response lengths (tokens, or any monotone score), finite and > 0.
        b, kappa: minibatch sizes in [b, b + kappa] (see `build_minibatches`, incl. the infeasible-n policy).
        k: minibatches per batch group.
        iterations, seed, method: balancing (see `balance_groups`); method "sorted" keeps the DP's
            short-to-long order (no balancing).
        calibration: optional map predicted -> expected true length: a callable on float64 arrays (e.g. an
            isotonic `CalibrationMap`), an (x, y) pair of knots, or {"x": [...], "y": [...]}.
        loads: "calibrated" (default when `calibration` is given) or "raw" (default otherwise).
        shuffle: shuffle whole batch groups after balancing (training randomness; groups stay intact).
        on_infeasible: "short" or "error" (see `build_minibatches`).

    Returns:
        The Schedule.

    Raises:
        ValueError: bad lengths, sizes or parameters (message names the argument and value).

    Example:
        >>> ids = [f"p{i}" for i in range(8)]
        >>> s = build_schedule(ids, [100, 900, 120, 880, 500, 510, 480, 520], b=2, kappa=0, k=2,
        ...                    iterations=2_000_000, seed=0, method="asp")
        >>> [m.tolist() for m in s.minibatches()]  # groups {p3 p1 | p0 p2} = 2000, {p5 p7 | p6 p4} = 2010 tokens
        [['p3', 'p1'], ['p0', 'p2'], ['p5', 'p7'], ['p6', 'p4']]
    """
    predicted = as_lengths(predicted_lengths, "predicted_lengths")
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or ids.shape[0] != predicted.shape[0]:
        raise ValueError(f"prompt_ids has shape {ids.shape} but predicted_lengths has {predicted.shape[0]} values")
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        raise ValueError(f"prompt_ids must be unique; {uniq[counts > 1][:3].tolist()} appear more than once")
    b, kappa = as_int(b, "b", minimum=1), as_int(kappa, "kappa", minimum=0)
    k = as_int(k, "k", minimum=1)
    iterations = as_int(iterations, "iterations", minimum=0)
    seed = as_int(seed, "seed", minimum=0)
    as_choice(method, "method", BUILD_METHODS)
    expected, mode = expected_lengths(predicted, calibration, loads)
    order, endpoints, mb_loads = plan_minibatches(predicted, expected, b, kappa, on_infeasible)
    if method == "sorted":
        perm = np.arange(mb_loads.size, dtype=np.int64)
        perm = shuffle_groups(perm, k, seed) if shuffle else perm
    else:
        perm = balance_groups(mb_loads, k, iterations=iterations, seed=seed, method=method, shuffle=shuffle)
    positions, offsets = assemble(order, endpoints, perm)
    info = {
        "b": b,
        "kappa": kappa,
        "method": method,
        "iterations": iterations,
        "seed": seed,
        "loads": mode,
        "shuffle": bool(shuffle),
        "feasible": is_feasible(predicted.size, b, kappa),
    }
    return Schedule(
        ids[positions], positions, offsets, perm.astype(np.int64), predicted[positions], expected[positions], k, info
    )


def schedule_to_frame(schedule: Schedule) -> pd.DataFrame:
    """One row per prompt in dispatch order: prompt_id, minibatch_id, group_id, dispatch_rank,
    predicted_length, load_used."""
    rank = np.repeat(np.arange(schedule.n_minibatches, dtype=np.int64), schedule.minibatch_sizes)
    return pd.DataFrame(
        {
            "prompt_id": schedule.prompt_ids,
            "minibatch_id": schedule.minibatch_ids[rank],
            "group_id": rank // schedule.k,
            "dispatch_rank": rank,
            "predicted_length": schedule.predicted_lengths,
            "load_used": schedule.loads,
        }
    )


def schedule_from_frame(frame: pd.DataFrame, k: int | None = None, info: Mapping[str, Any] | None = None) -> Schedule:
    """Rebuild a Schedule from `schedule_to_frame` output (e.g. read back from Parquet).

    Rows are ordered by dispatch_rank (stable, so the order inside a minibatch is kept); `positions` then index
    those rows. k is inferred from group_id when not given. Raises ValueError on an inconsistent frame.
    """
    missing = [c for c in FRAME_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"schedule frame lacks columns {missing}; expected {list(FRAME_COLUMNS)}")
    df = frame.sort_values("dispatch_rank", kind="stable")
    rank = df["dispatch_rank"].to_numpy(np.int64)
    sizes = np.bincount(rank) if rank.size and rank.min() >= 0 else np.zeros(0, dtype=np.int64)
    if sizes.size == 0 or (sizes == 0).any():
        raise ValueError("dispatch_rank must cover 0..N_B-1 with no gaps")
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    mb = df["minibatch_id"].to_numpy(np.int64)
    if (mb != np.repeat(mb[offsets[:-1]], sizes)).any():
        raise ValueError("each dispatch_rank must hold a single minibatch_id")
    group = df["group_id"].to_numpy(np.int64)[offsets[:-1]]
    if k is None:
        k = int((group == 0).sum()) if group.max() > 0 else sizes.size
    k = as_int(k, "k", minimum=1)
    if (group != np.arange(sizes.size) // k).any():
        raise ValueError(f"group_id must equal dispatch_rank // k (k = {k})")
    n = rank.size
    return Schedule(
        df["prompt_id"].to_numpy(),
        np.arange(n, dtype=np.int64),
        offsets,
        mb[offsets[:-1]],
        df["predicted_length"].to_numpy(np.float64),
        df["load_used"].to_numpy(np.float64),
        k,
        dict(info or {}),
    )


def schedule_summary(schedule: Schedule, true_lengths: object | None = None) -> dict[str, Any]:
    """Small JSON-able summary: sizes, parameters, predicted metrics, and realized ones if true lengths given.

    Args:
        schedule: the Schedule.
        true_lengths: optional (n,) true lengths indexed like the arrays given to `build_schedule`.
    """
    sizes = schedule.minibatch_sizes
    summary: dict[str, Any] = {
        "n_prompts": schedule.n_prompts,
        "n_minibatches": schedule.n_minibatches,
        "n_groups": schedule.n_groups,
        "k": schedule.k,
        "minibatch_size": {"min": int(sizes.min()), "max": int(sizes.max()), "mean": float(sizes.mean())},
        **{key: val for key, val in schedule.info.items() if isinstance(val, bool | int | float | str)},
        "predicted": dispatch_metrics(schedule.loads, schedule.offsets, schedule.k),
    }
    if true_lengths is not None:
        summary["realized"] = schedule_metrics(true_lengths, schedule)
    return summary
