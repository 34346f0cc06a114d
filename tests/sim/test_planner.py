"""Planner: Amdahl scaling, validation, B.6 on hand-computed rates, the search on a toy evaluator and on the
real simulator, and the scaling figure. Run: `.venv/bin/python -m pytest tests/sim/test_planner.py -q`."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from asp.plots.planner import scaling_figure  # noqa: E402
from asp.runtime.config import RuntimeConfig  # noqa: E402
from asp.sim.engine import Workload  # noqa: E402
from asp.sim.evaluate import make_evaluator  # noqa: E402
from asp.sim.planner import (  # noqa: E402
    Candidate,
    Cluster,
    Grid,
    Limits,
    amdahl_factor,
    b6_curve,
    b6_heuristic,
    balanced_actors,
    bottleneck,
    grid_candidates,
    pack_actors,
    scaling_curve,
    search_layout,
)
from asp.sim.timemodel import FEATURES, GenerationTimeModel, TrainingTimeModel  # noqa: E402

ITER = "runtime/summary/mean_iteration_time_s_excl_first"


def _cluster(**fields: float) -> Cluster:
    """A `Cluster` of one-device actors, a one-device TU minimum with perfect scaling and 8 devices per node, but
    for the `fields` given (Cluster has no defaults of its own: simulate.plan's live in asp.config)."""
    base = {"devices_per_actor": 1, "tu_min_devices": 1, "tu_serial_fraction": 0.0, "devices_per_node": 8}
    return Cluster(**{**base, **fields})


# ---- Cluster / Candidate ------------------------------------------------------------------------------------
def test_amdahl_by_hand() -> None:
    # s = 0.2, d_min = 8, d = 32: 0.2 + 0.8 * 8 / 32 = 0.4; at the minimum the factor is 1; s = 1: no scaling.
    assert amdahl_factor(32, 8, 0.2) == pytest.approx(0.4)
    assert amdahl_factor(8, 8, 0.2) == pytest.approx(1.0)
    assert amdahl_factor(64, 8, 1.0) == pytest.approx(1.0)
    cluster = _cluster(devices=64, devices_per_actor=8, tu_min_devices=8, tu_serial_fraction=0.5)
    assert cluster.train_factor(16) == pytest.approx(0.5 + 0.5 * 8 / 16)  # 0.75
    with pytest.raises(ValueError, match="tu_min_devices"):
        cluster.train_factor(4)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"devices": 0}, "cluster.devices"),
        ({"devices": -4}, "cluster.devices"),
        ({"devices": 8, "devices_per_actor": 0}, "cluster.devices_per_actor"),
        ({"devices": 8, "tu_min_devices": 8}, "cluster.tu_min_devices"),
        ({"devices": 8, "tu_min_devices": 16}, "cluster.tu_min_devices"),
        ({"devices": 8, "tu_serial_fraction": 1.5}, "cluster.tu_serial_fraction"),
        ({"devices": 32, "devices_per_actor": 16, "devices_per_node": 8}, "cluster.devices_per_actor"),
        ({"devices": 8, "devices_per_node": 0}, "cluster.devices_per_node"),
    ],
)
def test_cluster_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _cluster(**kwargs)


def test_candidate_devices_fit_and_overlay() -> None:
    cluster = _cluster(devices=32, devices_per_actor=2, tu_min_devices=8, devices_per_node=8)
    c = Candidate(generation_units=3, actors_per_unit=4, q_max=48, b=32, k=6, tu_devices=8)
    assert c.actors == 12 and c.devices(cluster) == 8 + 12 * 2
    assert c.misfit(cluster) is None
    assert "exceed one node" in Candidate(1, 5, 48, 32, 6, 8).misfit(cluster)
    assert "needs 34 devices" in Candidate(4, 3, 48, 32, 6, 10).misfit(cluster)
    assert c.overlay() == {
        "runtime": {"queue": {"q_max": 48}, "ray": {"generation_units": 3, "actors_per_unit": 4}},
        "schedule": {"b": 32, "k": 6},
        "plan": {"tu_devices": 8},
    }
    with pytest.raises(ValueError, match="candidate.q_max"):
        Candidate(1, 1, 0, 32, 6, 8)


# ---- B.6 -----------------------------------------------------------------------------------------------------
@dataclass
class FixedRates:
    """Stand-in `Rates`: one actor generates `actor` prompts/s; the TU step at its minimum takes `step` s."""

    actor: float
    step: float
    publish: float = 0.0
    global_batch_prompts: int = 32

    def actor_prompts_per_s(self, b: int, k: int) -> float:
        return self.actor

    def train_step_s(self) -> tuple[float, float]:
        return self.step, self.publish


def test_balanced_actors_and_packing() -> None:
    assert balanced_actors(3.2) == 3  # 6% short: generation the mild bottleneck
    assert balanced_actors(3.95) == 4  # 3 would be 24% short
    assert balanced_actors(0.4) == 1
    cluster = _cluster(devices=64, devices_per_node=8)
    assert pack_actors(7, cluster) == (1, 7)
    assert pack_actors(16, cluster) == (2, 8)
    assert pack_actors(9, cluster) == (3, 3)  # no 2-GU split of 9, so 3 GUs of 3


def test_b6_hand_computed_three_actors() -> None:
    # TU consumes G / step = 32 / 1 s = 32 prompts/s; one actor makes 10 -> need 3.2 -> 3 actors (30 < 32).
    # The TU cannot grow: s = 1 (no speed-up), so 4 devices stay free.
    cluster = _cluster(devices=8, tu_min_devices=1, tu_serial_fraction=1.0, devices_per_node=8)
    c = b6_heuristic(cluster, FixedRates(actor=10.0, step=1.0), b=16, k=4, q_max=64)
    assert (c.actors, c.tu_devices, c.q_max, c.b, c.k) == (3, 1, 64, 16, 4)


def test_b6_capped_then_alternating_growth() -> None:
    rates = FixedRates(actor=10.0, step=1.0)
    # Too small a cluster: 2 devices after the TU, generation is the (strong) bottleneck.
    small = _cluster(devices=3, tu_min_devices=1, devices_per_node=8)
    assert b6_heuristic(small, rates, b=16, k=4, q_max=64).actors == 2
    # Perfect scaling, TU grows one node (4) at a time: TU 1 -> 32/s, 3 actors; TU 5 -> 160/s, 16 actors (21
    # devices); TU 9 -> 288/s needs 28 actors but only 23 fit: capped 230/s beats 160/s, so TU 9 + 23 actors.
    big = _cluster(devices=32, tu_min_devices=1, tu_serial_fraction=0.0, devices_per_node=4)
    c = b6_heuristic(big, rates, b=16, k=4, q_max=64)
    assert (c.tu_devices, c.actors, c.actors_per_unit <= 4) == (9, 23, True)
    # Plateau: s = 0.9 -> TU 5 consumes 32 / 0.92 = 34.8/s, +8.7%; with min_tu_gain 0.1 the TU stays at 1.
    flat = _cluster(devices=32, tu_min_devices=1, tu_serial_fraction=0.9, devices_per_node=4)
    assert b6_heuristic(flat, rates, b=16, k=4, q_max=64, min_tu_gain=0.1).tu_devices == 1


# ---- search on a toy deterministic evaluator ------------------------------------------------------------------
def toy_evaluate(c: Candidate) -> dict[str, float]:
    """Iteration time = max(generation 64 / (4 * actors), training 1 / tu) + 0.01 * |b - 32|; lag = actors / 2."""
    gen_s, train_s = 64 / (4 * c.actors), 1.0 / c.tu_devices
    it = max(gen_s, train_s) + 0.01 * abs(c.b - 32)
    return {
        ITER: it,
        "runtime/summary/depth_at_arrival_batches_mean": 8.0 if c.q_max > 64 else 1.0,
        "sim/policy_lag_max": c.actors / 2,
        "sim/generation_utilization": min(1.0, train_s / gen_s),
        "sim/training_utilization": min(1.0, gen_s / train_s),
    }


def test_search_picks_known_optimum() -> None:
    cluster = _cluster(devices=8, tu_min_devices=1, devices_per_node=4)
    grid = Grid(q_max=(32, 128), b=(16, 32), k=(4,), tu_devices=(1, 2))
    ranked = search_layout(cluster, toy_evaluate, grid, limits=Limits(depth_batches=4.0, policy_lag=3.0), prune=False)
    assert len(ranked) == len(grid_candidates(cluster, grid))
    best, metrics = ranked[0]
    # gen 16 / actors vs train 1 / tu: nothing reaches train-bound within the lag bound (actors <= 6), so the most
    # actors (6, lag 3) win; b = 32; q_max 128 breaks the depth limit; TU 1 and 2 tie -> fewer devices (TU 1).
    assert (best.actors, best.b, best.q_max, best.tu_devices) == (6, 32, 32, 1)
    assert metrics["planner/feasible"] == 1.0 and metrics["planner/devices"] == 7.0
    assert metrics["planner/objective_s"] == pytest.approx(16 / 6)
    assert all(m["planner/feasible"] == 0.0 for c, m in ranked if c.q_max == 128)
    times = [m["planner/objective_s"] for _, m in ranked if m["planner/feasible"]]
    assert times == sorted(times)


def test_bottleneck_labels() -> None:
    def m(g: float, t: float) -> dict[str, float]:
        return {"sim/generation_utilization": g, "sim/training_utilization": t}

    assert bottleneck(m(1.0, 0.5)) == "generation"
    assert bottleneck(m(0.4, 0.98)) == "training"
    assert bottleneck(m(0.95, 0.9)) == "balanced"


def test_grid_too_large_is_refused() -> None:
    cluster = _cluster(devices=64, tu_min_devices=1, devices_per_node=8)
    with pytest.raises(ValueError, match="max_candidates"):
        search_layout(cluster, toy_evaluate, Grid(q_max=(32,), b=(16, 32), k=(4,)), max_candidates=50)


# ---- real simulator on a tiny synthetic schedule ---------------------------------------------------------------
P, N, B, G = 256, 4, 8, 16


@pytest.fixture(scope="module")
def evaluator():
    """256 prompts of 4 x 100 tokens; every minibatch (8 prompts, kappa 0) decodes in 1 s -> one actor makes
    8 prompts/s; the TU step takes 1 s at its minimum for 16 prompts -> it consumes 16 prompts/s."""
    ids = np.arange(P)
    workload = Workload.from_arrays(ids, np.full((P, N), 100), np.full(P, 10), 200)
    gen = GenerationTimeModel("continuous", (1.0, 0.0, 0.0, 0.0, 0.0), FEATURES["continuous"])
    train = TrainingTimeModel(
        step_base_s=1.0, step_per_token_s=0.0, save_s=0.0, convert_s=0.0, load_s=0.0, step_per_sample_s=0.0
    )
    cfg = RuntimeConfig(
        iterations=20,
        global_batch_prompts=G,
        sampling={"n_samples": N},
        queue={"q_max": 32},
        trainer={"kind": "simulated"},
    ).control_settings()
    cluster = _cluster(devices=8, tu_min_devices=1, tu_serial_fraction=0.5, devices_per_node=4)
    return make_evaluator(
        ids,
        np.full(P, 100.0),
        workload,
        gen,
        train,
        cfg,
        cluster=cluster,
        kappa=0,
        iterations=500,
        condition="C4",
        method="asp",
    )


def test_rates_from_time_models(evaluator) -> None:
    assert evaluator.actor_prompts_per_s(B, 4) == pytest.approx(8.0)
    assert evaluator.train_step_s() == pytest.approx((1.0, 0.0))


def test_more_actors_help_until_training_bound(evaluator) -> None:
    rows = [evaluator(Candidate(1, a, 32, B, 4, 1)) for a in (1, 2, 3, 4)]
    times = [m[ITER] for m in rows]
    # 1 actor: 16 prompts per 2 s; 2 actors: 16 prompts/s = the TU's 1 s step; beyond, the TU sets the pace.
    assert times[0] == pytest.approx(2.0, rel=0.02) and times[1] == pytest.approx(1.0, rel=0.02)
    assert times[2] == pytest.approx(1.0, rel=0.02) and times[3] == pytest.approx(1.0, rel=0.02)
    assert [bottleneck(m) for m in rows] == ["generation", "balanced", "training", "training"]
    # A bigger TU (Amdahl s = 0.5, 5 devices: 0.6 s step) with 3 actors (24 prompts/s) is faster still.
    assert evaluator(Candidate(1, 3, 32, B, 4, 5))[ITER] == pytest.approx(G / 24, rel=0.03)


def test_b6_and_search_on_the_simulator(evaluator) -> None:
    cluster = evaluator.cluster
    b6 = b6_heuristic(cluster, evaluator, b=B, k=4, q_max=32)
    assert (b6.tu_devices, b6.actors) == (5, 3)  # TU 1 -> 2 actors, then TU 5 (26.7 prompts/s) -> 3 actors
    ranked = search_layout(cluster, evaluator, Grid(q_max=(32,), b=(B,), k=(4,)))
    best, metrics = ranked[0]
    assert metrics[ITER] == pytest.approx(evaluator(b6)[ITER])
    assert best.devices(cluster) == 8 and bottleneck(metrics) == "generation"
    # pruning: the TU-1 branch of 1 actor per GU stops at 3 GUs (training-bound), never trying 4..7
    assert Candidate(4, 1, 32, B, 4, 1) not in {c for c, _ in ranked}


def test_scaling_curve_and_figure(evaluator) -> None:
    grid = Grid(q_max=(32,), b=(B,), k=(4,))
    rows = scaling_curve(evaluator.cluster, evaluator, [2, 4, 8], grid)
    assert [d for d, _, _ in rows] == [2, 4, 8]
    times = [m[ITER] for _, _, m in rows]
    assert times[0] > times[1] >= times[2]
    b6_rows = b6_curve(evaluator.cluster, evaluator, [2, 4, 8], b=B, k=4, q_max=32)
    fig = scaling_figure(rows, b6_rows, title="toy")
    assert isinstance(fig, Figure)
    ax_total, ax_gen = fig.axes
    assert [len(line.get_xdata()) for line in ax_total.lines] == [3, 3]
    assert list(ax_total.lines[0].get_xdata()) == [2, 4, 8]
    assert list(ax_gen.lines[0].get_xdata()) == [c.actors for _, c, _ in rows]
    assert ax_total.get_xscale() == "log"
    assert len(scaling_figure(rows).axes[0].lines) == 1
