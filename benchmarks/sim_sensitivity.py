"""Which GPU-layout conclusions hold across the plausible range of a time-model preset, and which flip.

Run:  .venv/bin/python benchmarks/sim_sensitivity.py                          (h100-qwen3-8b; a few minutes)
      .venv/bin/python benchmarks/sim_sensitivity.py --preset ascend910b3-qwen3-30b-a3b --no-planner

For every point of `asp.sim.presets.SENSITIVITY_GRID` (the preset, each cost alone at the ends of its range:
decode per step and per sequence-step x0.5 and x2, trainer x0.5 and x2, reload x0.5 and x4, and four corners that
move the bottleneck) it simulates, on the same synthetic workload, schedules and seeds:

* C4 vs C0 (balanced, length-homogeneous schedule vs original order; history-aware passes off in both);
* history-aware vs predictor-only loads (C4, runtime.history on vs off, over 2.5 passes of the prompts);
* partial rollouts (C4 under max_policy_lag 2: partial on, token budget 1,024, vs off);
* sync vs async (C4, runtime.mode);
* the planner's best layout (asp.sim.planner.search_layout: 32 devices, 8 per node, TU >= 8 devices,
  serial fraction 0.1) and its iteration time,

and prints one row per grid point (the relative change in mean iteration time, excluding the first; negative =
the first arm is faster) and, per conclusion, whether its sign holds at every point.

Setting (assumed, GPU scale): 2 GUs x 8 vLLM actors, a Training Unit of the preset's size, 64 prompts x 8
samples per step, b = 8, kappa = 2, k = 6, q_max = 4 batches, 60 iterations over 1,536 prompts; synthetic
DeepScaleR-like lengths (benchmarks/sim_paper.py's generator) of mean 4,000 tokens, cap 8,192, a prompt's later
visits sampled again (its prompt effect kept; before 2026-12-08 every pass repeated the first's lengths, which a
history-aware pass then knew exactly); predictions at Kendall tau 0.6. One seed per point (the workload and
schedules are shared by all points).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_paper import lengths_with_mean  # noqa: E402  (a sibling benchmark script)

from asp.config import HistoryParams, PartialParams, ScheduleParams  # noqa: E402
from asp.control.plan import WorkPlan  # noqa: E402
from asp.runtime.config import RuntimeConfig  # noqa: E402
from asp.schedule import condition_schedule, perturb_predictions  # noqa: E402
from asp.sim.engine import Workload, simulate  # noqa: E402
from asp.sim.evaluate import make_evaluator  # noqa: E402
from asp.sim.inputs import visits_needed  # noqa: E402
from asp.sim.planner import Cluster, Grid, Limits, search_layout  # noqa: E402
from asp.sim.presets import SENSITIVITY_GRID, get_preset, scaled_models  # noqa: E402

CAP, N, BATCH, B, KAPPA, K = 8192, 8, 64, 8, 2, 6
PROMPTS, ITERATIONS, MEAN, TAU = 1536, 60, 4000.0, 0.6
ITER = "runtime/summary/mean_iteration_time_s_excl_first"


def setup(seed: int = 0):
    # 60 steps x 64 prompts: 2.5 passes over 1,536; a later pass samples each prompt again
    drawn = lengths_with_mean(PROMPTS, MEAN, seed, visits=visits_needed(ITERATIONS, BATCH, PROMPTS))
    lengths = drawn[0]
    ids = np.arange(PROMPTS)
    work = Workload.from_arrays(ids, lengths, np.full(PROMPTS, 150, np.int32), max_new_tokens=CAP, revisits=drawn[1:])
    predicted, _ = perturb_predictions(lengths.mean(axis=1), TAU, seed=seed)
    plans = {
        c: WorkPlan.from_schedule(
            condition_schedule(ids, predicted, c, b=B, kappa=KAPPA, k=K, seed=seed, iterations=20_000, method="asp")
        )
        for c in ("C0", "C4")
    }
    return ids, predicted, work, plans


def settings(condition: str = "C4", iterations: int = ITERATIONS, **over):
    base = dict(
        global_batch_prompts=BATCH,
        iterations=iterations,
        condition=condition,
        sampling={"n_samples": N, "max_new_tokens": CAP},
        queue={"q_max": 4 * BATCH, "max_policy_lag": None},
        control={"stall_timeout_s": 1e6, "poll_timeout_s": 2.0},
        ray={"generation_units": 2, "actors_per_unit": 8},
        history=HistoryParams(enabled=False),
        schedule=ScheduleParams(b=B, kappa=KAPPA, k=K, iterations=20_000),
    )
    base.update(over)
    return RuntimeConfig(**base).control_settings()


def iter_s(plan, work, gen, train, cfg) -> float:
    return float(simulate(plan, work, gen, train, cfg).metrics[ITER])


def change(a: float, b: float) -> float:
    """Relative change of b against a, %."""
    return 100 * (b - a) / a


def planner_best(ids, predicted, work, gen, train, tu_devices: int) -> tuple[str, float]:
    cluster = Cluster(devices=32, devices_per_actor=1, tu_min_devices=tu_devices, tu_serial_fraction=0.1,
                      devices_per_node=8)  # fmt: skip
    ev = make_evaluator(ids, predicted, work, gen, train, settings(iterations=20), cluster=cluster, kappa=KAPPA,
                        iterations=20_000, condition="C4", method="asp")  # fmt: skip
    grid = Grid(q_max=(4 * BATCH,), b=(B,), k=(K,))
    best, metrics = search_layout(cluster, ev, grid, limits=Limits(depth_batches=4.0, policy_lag=None))[0]
    layout = f"{best.generation_units}x{best.actors_per_unit} actors + TU {best.tu_devices}"
    return layout, metrics["planner/objective_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="h100-qwen3-8b")
    parser.add_argument("--no-planner", action="store_true", help="skip the planner column (faster)")
    args = parser.parse_args(argv)
    preset = get_preset(args.preset)
    ids, predicted, work, plans = setup()
    print(f"Preset {preset.name}: {preset.description}. Mean length {work.lengths.mean():,.0f}, cap {CAP}.\n")
    cols = ["point", "C0 iter s", "C4 vs C0", "history vs predictor-only", "partial vs not (lag 2)",
            "async vs sync"] + ([] if args.no_planner else ["planner best", "best iter s"])  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * (len(cols) - 1))
    signs: dict[str, list[float]] = {c: [] for c in cols[2:6]}
    layouts: list[str] = []
    start = time.perf_counter()
    for scale in SENSITIVITY_GRID:
        gen, train = scaled_models(preset.gen, preset.train, scale)
        c0 = iter_s(plans["C0"], work, gen, train, settings("C0"))
        c4 = iter_s(plans["C4"], work, gen, train, settings("C4"))
        hist = iter_s(plans["C4"], work, gen, train, settings("C4", history=HistoryParams(enabled=True)))
        lagged = iter_s(plans["C4"], work, gen, train, settings("C4", queue={"q_max": 4 * BATCH, "max_policy_lag": 2}))
        partial = iter_s(plans["C4"], work, gen, train, settings(
            "C4", queue={"q_max": 4 * BATCH, "max_policy_lag": 2},
            partial=PartialParams(enabled=True, token_budget=1024)))  # fmt: skip
        sync = iter_s(plans["C4"], work, gen, train, settings("C4", mode="sync"))
        values = [change(c0, c4), change(c4, hist), change(lagged, partial), change(sync, c4)]
        for key, v in zip(cols[2:6], values, strict=True):
            signs[key].append(v)
        cells = [scale.label, f"{c0:,.1f}"] + [f"{v:+.1f} %" for v in values]
        if not args.no_planner:
            layout, best_s = planner_best(ids, predicted, work, gen, train, preset.tu_devices)
            layouts.append(layout)
            cells += [layout, f"{best_s:,.1f}"]
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s)\n")
    print("| conclusion | preset | min | max | holds at every point |")
    print("|---|---:|---:|---:|---|")
    for key, v in signs.items():
        holds = "yes" if all(x < 0 for x in v) else ("flips" if any(x < 0 for x in v) else "never (slower)")
        print(f"| {key} faster | {v[0]:+.1f} % | {min(v):+.1f} % | {max(v):+.1f} % | {holds} |")
    if layouts:
        distinct = sorted(set(layouts))
        verdict = "yes" if len(distinct) == 1 else "changes: " + "; ".join(distinct)
        print(f"| planner's best layout | {layouts[0]} | - | - | {verdict} |")


if __name__ == "__main__":
    main()
