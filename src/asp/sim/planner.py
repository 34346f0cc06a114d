"""Resource planner: Training Unit devices, Generation Units and actors for a cluster (paper B.6, §5.4).

Appendix B.6 sizes the layout so rollout throughput roughly matches what the Training Unit (TU) consumes,
generation a mild bottleneck; Figure 2 plots iteration time against devices as the bottleneck moves from
generation to training. Pure (no I/O; the figure is `asp.plots.planner.scaling_figure`):

* `Cluster` (devices, an actor's devices, the TU's minimum and Amdahl scaling, devices per node) and
  `Candidate` (GUs x actors per GU, TU devices, q_max, schedule b and k; `overlay()` for params.yaml);
* `b6_heuristic`: B.6 from measured `Rates` (one actor's prompts/s, the TU's step time), no simulation;
* `search_layout`: the candidates of a `Grid` scored by ``evaluate(candidate) -> metrics``, best first;
  `scaling_curve` / `b6_curve`: the best (or B.6) layout per device count;
* `asp.sim.evaluate.make_evaluator`: an `Evaluator` that simulates candidates and is a `Rates`.

    cluster = Cluster(devices=64, devices_per_actor=8, tu_min_devices=8, tu_serial_fraction=0.2, devices_per_node=8)
    # settings: the Control Unit's (RuntimeConfig(...).control_settings()); kappa, iterations: the schedule params
    ev = make_evaluator(ids, predicted, workload, gen, train, settings, cluster=cluster, kappa=2,
                        condition="C4", method="asp", iterations=200_000)
    b6 = b6_heuristic(cluster, ev, b=32, k=6, q_max=48); ev(b6)["runtime/summary/mean_iteration_time_s"]
    best, metrics = search_layout(cluster, ev, Grid(q_max=(32, 48), b=(32,), k=(6,)))[0]

Tests: ``.venv/bin/python -m pytest tests/sim/test_planner.py -q``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import product
from typing import Any, Protocol

from asp.sim.checks import positive_int

Evaluate = Callable[["Candidate"], Mapping[str, float]]
ITER_TIME = "runtime/summary/mean_iteration_time_s_excl_first"
ITER_TIME_ALL = "runtime/summary/mean_iteration_time_s"


def amdahl_factor(devices: int, min_devices: int, serial_fraction: float) -> float:
    """Step time at `devices` relative to the step time at `min_devices`: s + (1 - s) * d_min / d.

    Example: s = 0.2, d_min = 8, d = 32 -> 0.2 + 0.8 * 8 / 32 = 0.4 (four times the devices, 2.5x faster).
    """
    return serial_fraction + (1.0 - serial_fraction) * min_devices / devices


@dataclass(frozen=True)
class Cluster:
    """The accelerators to split between the TU and the generation actors (every field required: their defaults are
    `simulate.plan`'s in asp.config).

    Attributes:
        devices: total accelerators.
        devices_per_actor: devices of one generation engine (e.g. its tensor-parallel size).
        tu_min_devices: the TU's minimum size (its memory plan: model, optimizer, activations of a batch).
        tu_serial_fraction: s of Amdahl's law for the TU: a step on d >= d_min devices takes
            t(d_min) * (s + (1 - s) * d_min / d). It models the TU's own scaling plateau (paper §5.4: at 128
            NPUs training approaches it, so more devices stop paying off); s = 0 is perfect scaling.
        devices_per_node: GUs are packed per node: actors_per_unit * devices_per_actor <= devices_per_node.
    """

    devices: int
    devices_per_actor: int
    tu_min_devices: int
    tu_serial_fraction: float
    devices_per_node: int

    def __post_init__(self) -> None:
        for name in ("devices", "devices_per_actor", "tu_min_devices", "devices_per_node"):
            positive_int(f"cluster.{name}", getattr(self, name))
        s = self.tu_serial_fraction
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0.0 <= s <= 1.0:
            raise ValueError(f"cluster.tu_serial_fraction must be a number in [0, 1], got {s!r}")
        if self.devices_per_actor > self.devices_per_node:
            raise ValueError(f"cluster.devices_per_actor = {self.devices_per_actor} exceeds devices_per_node")
        if self.tu_min_devices + self.devices_per_actor > self.devices:
            raise ValueError(f"cluster.tu_min_devices = {self.tu_min_devices} leaves no room for one actor")

    @property
    def max_actors_per_unit(self) -> int:
        """Most actors one GU (one node) hosts."""
        return self.devices_per_node // self.devices_per_actor

    def train_factor(self, tu_devices: int) -> float:
        """TU step time at `tu_devices` relative to its minimum (`amdahl_factor`)."""
        if tu_devices < self.tu_min_devices:
            raise ValueError(f"tu_devices = {tu_devices} is below cluster.tu_min_devices = {self.tu_min_devices}")
        return amdahl_factor(tu_devices, self.tu_min_devices, self.tu_serial_fraction)

    def max_actors(self, tu_devices: int) -> int:
        """Actors that fit next to a TU of `tu_devices`."""
        return max(self.devices - tu_devices, 0) // self.devices_per_actor


@dataclass(frozen=True, order=True)
class Candidate:
    """One layout: `generation_units` GUs of `actors_per_unit` actors, a TU of `tu_devices`, q_max, (b, k)."""

    generation_units: int
    actors_per_unit: int
    q_max: int
    b: int
    k: int
    tu_devices: int

    def __post_init__(self) -> None:
        for name in ("generation_units", "actors_per_unit", "q_max", "b", "k", "tu_devices"):
            positive_int(f"candidate.{name}", getattr(self, name))

    @property
    def actors(self) -> int:
        return self.generation_units * self.actors_per_unit

    def devices(self, cluster: Cluster) -> int:
        """Devices the layout occupies (TU + actors)."""
        return self.tu_devices + self.actors * cluster.devices_per_actor

    def misfit(self, cluster: Cluster) -> str | None:
        """Why the layout does not fit `cluster` (None when it does)."""
        if self.tu_devices < cluster.tu_min_devices:
            return f"tu_devices {self.tu_devices} < tu_min_devices {cluster.tu_min_devices}"
        if self.actors_per_unit > cluster.max_actors_per_unit:
            return f"{self.actors_per_unit} actors per GU exceed one node ({cluster.max_actors_per_unit})"
        if self.devices(cluster) > cluster.devices:
            return f"needs {self.devices(cluster)} devices, the cluster has {cluster.devices}"
        return None

    def overlay(self) -> dict[str, dict[str, Any]]:
        """Params overlay (``runtime`` and ``schedule`` keys of params.yaml); ``plan`` holds what no param sets."""
        ray = {"generation_units": self.generation_units, "actors_per_unit": self.actors_per_unit}
        return {
            "runtime": {"ray": ray, "queue": {"q_max": self.q_max}},
            "schedule": {"b": self.b, "k": self.k},
            "plan": {"tu_devices": self.tu_devices},
        }

    def label(self) -> str:
        return f"TU {self.tu_devices} + {self.generation_units}x{self.actors_per_unit} actors"


class Rates(Protocol):
    """What B.6 measures (an `Evaluator` is one): prompts per step, one actor's rate, the TU's step time."""

    @property
    def global_batch_prompts(self) -> int: ...

    def actor_prompts_per_s(self, b: int, k: int) -> float:
        """Prompts per second one actor generates on the minibatches of the (b, k) schedule."""

    def train_step_s(self) -> tuple[float, float]:
        """(step seconds of a typical global batch on the TU's minimum, fixed per-step publish seconds)."""


def tu_prompts_per_s(cluster: Cluster, rates: Rates, tu_devices: int) -> float:
    """Prompts per second a TU of `tu_devices` consumes: G / (t_step(d_min) * amdahl + t_publish)."""
    step, publish = rates.train_step_s()
    return rates.global_batch_prompts / (step * cluster.train_factor(tu_devices) + publish)


def balanced_actors(need: float, tolerance: float = 0.1) -> int:
    """Actor count for `need` actors' worth of TU consumption, generation a mild bottleneck.

    floor(need) when it falls short by at most `tolerance` of `need` (and is >= 1), else ceil(need): 3.2 -> 3
    (6% short), 3.95 -> 4 (3 would be 24% short, so the TU becomes the mild bottleneck instead).
    """
    low = math.floor(need)
    return low if low >= 1 and low >= (1.0 - tolerance) * need else max(math.ceil(need), 1)


def pack_actors(actors: int, cluster: Cluster) -> tuple[int, int]:
    """(generation_units, actors_per_unit) with exactly `actors` actors, each GU on one node, fewest GUs.

    The runtime gives every GU the same number of actors, so a count with no fitting divisor (a prime above
    one node's worth) becomes single-actor GUs: 9 actors, 8 per node -> 3 x 3; 23 actors, 4 per node -> 23 x 1.
    """
    per_unit = cluster.max_actors_per_unit
    for units in range(-(-actors // per_unit), actors + 1):
        if actors % units == 0:
            return units, actors // units
    raise ValueError(f"actors must be >= 1, got {actors}")


def b6_heuristic(
    cluster: Cluster,
    rates: Rates,
    *,
    b: int,
    k: int,
    q_max: int,
    tolerance: float = 0.1,
    tu_increment: int | None = None,
    min_tu_gain: float = 0.05,
) -> Candidate:
    """Appendix B.6: TU at its minimum, actors replicated to match it, then TU and actors grown alternately.

    1. The TU starts at `cluster.tu_min_devices`; it consumes G / t_step prompts/s (`tu_prompts_per_s`).
    2. One actor's rate r on the (b, k) schedule's minibatches (`rates.actor_prompts_per_s`).
    3. Actors = `balanced_actors`(consumption / r), capped by the devices left (then generation is the
       bottleneck, as at the paper's 16 NPUs).
    4. While the balanced layout fits and `tu_increment` more TU devices raise its consumption by at least
       `min_tu_gain` (below that the TU sits on its Amdahl plateau), grow the TU and rebalance. A bigger TU
       whose balanced actors no longer fit is taken, capped, only if its estimated throughput min(actors * r,
       consumption) beats the current layout with its spare devices turned into actors. Devices the final
       layout does not use stay free.

    Args:
        cluster: the cluster; rates: the measurements (e.g. an `Evaluator`).
        b, k, q_max: the schedule's minibatch size and group size, and the queue bound of the candidate.
        tolerance: see `balanced_actors`; tu_increment: TU growth step (default: one node).
        min_tu_gain: smallest relative consumption gain worth a TU increment.

    Returns:
        The Candidate (simulate it with the evaluator to compare with `search_layout`).
    """
    rate = rates.actor_prompts_per_s(b, k)
    if not rate > 0:
        raise ValueError(f"one actor's generation rate must be > 0 prompts/s, got {rate}")
    step = positive_int("tu_increment", tu_increment or cluster.devices_per_node)

    def consume(tu: int) -> float:
        return tu_prompts_per_s(cluster, rates, tu)

    tu = cluster.tu_min_devices
    actors = min(balanced_actors(consume(tu) / rate, tolerance), cluster.max_actors(tu))
    while actors == balanced_actors(consume(tu) / rate, tolerance):
        grown = tu + step
        if cluster.max_actors(grown) < 1 or consume(grown) < consume(tu) * (1.0 + min_tu_gain):
            break
        need = balanced_actors(consume(grown) / rate, tolerance)
        if need <= cluster.max_actors(grown):
            tu, actors = grown, need
            continue
        capped = cluster.max_actors(grown)
        if min(capped * rate, consume(grown)) > min(cluster.max_actors(tu) * rate, consume(tu)):
            tu, actors = grown, capped
        break
    units, per_unit = pack_actors(actors, cluster)
    return Candidate(units, per_unit, q_max, b, k, tu)


@dataclass(frozen=True)
class Grid:
    """Values to search; None = every value that fits the cluster.

    Attributes:
        q_max, b, k: queue bounds (prompts) and schedule parameters.
        generation_units, actors_per_unit: GU counts and actors per GU (default 1.. what fits).
        tu_devices: TU sizes (default: the minimum, then one node more at a time).
    """

    q_max: tuple[int, ...]
    b: tuple[int, ...]
    k: tuple[int, ...]
    generation_units: tuple[int, ...] | None = None
    actors_per_unit: tuple[int, ...] | None = None
    tu_devices: tuple[int, ...] | None = None


class GridTooLarge(ValueError):
    """A grid with more than `limit` candidates (counted, never built: the search refuses it at once)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the grid has more than max_candidates = {limit} candidates; coarsen it")
        self.limit = limit


def _axes(cluster: Cluster, grid: Grid) -> tuple[range | tuple[int, ...], range | tuple[int, ...]]:
    """The TU sizes and actors per GU the grid searches (its own, else every one that fits, as ranges)."""
    tus = grid.tu_devices or range(cluster.tu_min_devices, cluster.devices, cluster.devices_per_node)
    per_units = grid.actors_per_unit or range(1, cluster.max_actors_per_unit + 1)
    return tus, per_units


def count_candidates(cluster: Cluster, grid: Grid, limit: int | None = None) -> int:
    """How many candidates `grid_candidates` would return, without building them; counting stops once it exceeds
    `limit` (then `limit + 1` is returned). Arithmetic per (TU size, actors per GU) pair, so a cluster of any size
    is counted in at most about `limit` steps."""
    tus, per_units = _axes(cluster, grid)
    fixed = len(grid.q_max) * len(grid.b) * len(grid.k)
    total = 0
    for tu in tus:
        if tu < cluster.tu_min_devices:
            continue
        room = cluster.max_actors(tu)
        for per_unit in per_units:
            if per_unit > min(room, cluster.max_actors_per_unit):
                if grid.actors_per_unit is None:
                    break  # the default axis ascends: no larger one fits either
                continue
            if per_unit < 1:
                continue  # not a candidate (`grid_candidates` names it)
            fits = room // per_unit
            units = fits if grid.generation_units is None else sum(1 <= n <= fits for n in set(grid.generation_units))
            total += units * fixed
            if limit is not None and total > limit:
                return limit + 1
    return total


def grid_candidates(cluster: Cluster, grid: Grid, max_candidates: int | None = None) -> list[Candidate]:
    """Every Candidate of `grid` that fits `cluster`, GU count varying fastest (`search_layout` prunes so).

    Raises:
        GridTooLarge: more than `max_candidates` (checked by `count_candidates` before any is built).
    """
    if max_candidates is not None and count_candidates(cluster, grid, limit=max_candidates) > max_candidates:
        raise GridTooLarge(max_candidates)
    tus, per_units = _axes(cluster, grid)
    out = []
    for tu, per_unit, q_max, b, k in product(tus, per_units, grid.q_max, grid.b, grid.k):
        units = grid.generation_units or tuple(range(1, cluster.max_actors(tu) // per_unit + 1))
        for n in sorted(units):
            c = Candidate(n, per_unit, q_max, b, k, tu)
            if c.misfit(cluster) is None:
                out.append(c)
    return out


@dataclass(frozen=True)
class Limits:
    """Constraints of a feasible layout (None = unchecked).

    Attributes:
        depth_batches: mean Training Queue depth at arrival (global batches) must stay at or below this.
        policy_lag: ``sim/policy_lag_max`` must stay at or below this (steps).
    """

    depth_batches: float | None = 4.0
    policy_lag: float | None = 4.0


def objective_s(metrics: Mapping[str, float]) -> float:
    """Mean iteration time without the first (startup) iteration; all iterations if only one; inf if none."""
    for key in (ITER_TIME, ITER_TIME_ALL):
        value = float(metrics.get(key, float("nan")))
        if math.isfinite(value):
            return value
    return float("inf")


def feasible(metrics: Mapping[str, float], limits: Limits) -> bool:
    """Whether the simulated run met `limits` (and produced an iteration time)."""
    depth = float(metrics.get("runtime/summary/depth_at_arrival_batches_mean", float("nan")))
    lag = float(metrics.get("sim/policy_lag_max", float("nan")))
    ok_depth = limits.depth_batches is None or depth <= limits.depth_batches
    ok_lag = limits.policy_lag is None or lag <= limits.policy_lag
    return ok_depth and ok_lag and math.isfinite(objective_s(metrics))


def bottleneck(metrics: Mapping[str, float], *, busy: float = 0.85, margin: float = 0.05) -> str:
    """Which side limits a run: generation, training or balanced (from the ``sim/..._utilization`` metrics).

    Balanced when both are at least `busy` or they differ by at most `margin`; otherwise the busier side (a
    training-bound run has the TU busy near 1 while backpressure idles the actors, and vice versa).
    """
    gen = float(metrics.get("sim/generation_utilization", float("nan")))
    train = float(metrics.get("sim/training_utilization", float("nan")))
    if (gen >= busy and train >= busy) or abs(gen - train) <= margin:
        return "balanced"
    return "training" if train > gen else "generation"


def search_layout(
    cluster: Cluster,
    evaluate: Evaluate,
    grid: Grid,
    *,
    limits: Limits = Limits(),
    prune: bool = True,
    max_candidates: int = 400,
) -> list[tuple[Candidate, dict[str, float]]]:
    """Score the candidates of `grid` on `cluster` and rank them.

    Order: feasible (`feasible`) first, then by `objective_s` (lower is better), then fewer devices. With
    `prune`, a branch (same TU, actors per GU, q_max, b, k) stops adding GUs after its first training-bound
    candidate (`bottleneck`): more actors then only idle.

    Args:
        cluster: the cluster; evaluate: candidate -> simulated metrics (e.g. an `Evaluator`).
        grid: the values to search; limits: feasibility bounds.
        prune: skip GU counts past the first training-bound one of each branch.
        max_candidates: refuse grids larger than this (`GridTooLarge`, a ValueError, raised after counting,
            before any candidate is built or scored: pass a coarser grid).

    Returns:
        Every evaluated (candidate, metrics) best first; metrics gain ``planner/objective_s``,
        ``planner/feasible`` (1/0), ``planner/devices`` and ``planner/actors``.
    """
    candidates = grid_candidates(cluster, grid, max_candidates)
    if not candidates:
        raise ValueError(f"no candidate of the grid fits the cluster ({cluster})")
    scored, done_branch = [], None
    for c in candidates:
        branch = (c.tu_devices, c.actors_per_unit, c.q_max, c.b, c.k)
        if prune and branch == done_branch:
            continue
        metrics = dict(evaluate(c))
        ok = feasible(metrics, limits)
        metrics.update({"planner/objective_s": objective_s(metrics), "planner/feasible": float(ok)})
        metrics.update({"planner/devices": float(c.devices(cluster)), "planner/actors": float(c.actors)})
        scored.append((c, metrics))
        if bottleneck(metrics) == "training":
            done_branch = branch
    return sorted(
        scored,
        key=lambda cm: (-cm[1]["planner/feasible"], cm[1]["planner/objective_s"], cm[1]["planner/devices"], cm[0]),
    )


def _cached(evaluate: Evaluate) -> Evaluate:
    memo: dict[Candidate, Mapping[str, float]] = {}

    def run(c: Candidate) -> Mapping[str, float]:
        if c not in memo:
            memo[c] = evaluate(c)
        return memo[c]

    return run


def scaling_curve(
    cluster: Cluster, evaluate: Evaluate, device_counts: Iterable[int], grid: Grid, **search: Any
) -> list[tuple[int, Candidate, dict[str, float]]]:
    """The best layout per total device count (the data of a Figure-2-like plot).

    Args:
        cluster: the cluster shape (its `devices` is replaced by each count); evaluate: as in `search_layout`
            (results are reused across counts); device_counts: totals to plan for.
        grid: the search grid; **search: `search_layout` keywords (limits, prune, max_candidates).

    Returns:
        (devices, best candidate, its metrics) per count, in the given order.
    """
    run = _cached(evaluate)
    rows = []
    for devices in device_counts:
        best, metrics = search_layout(replace(cluster, devices=devices), run, grid, **search)[0]
        rows.append((devices, best, metrics))
    return rows


def b6_curve(
    cluster: Cluster, evaluator: Any, device_counts: Iterable[int], **b6: Any
) -> list[tuple[int, Candidate, dict[str, float]]]:
    """`b6_heuristic` per device count, each simulated by `evaluator` (a `Rates` that is also an `Evaluate`)."""
    rows = []
    for devices in device_counts:
        c = b6_heuristic(replace(cluster, devices=devices), evaluator, **b6)
        rows.append((devices, c, dict(evaluator(c))))
    return rows
