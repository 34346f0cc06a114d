"""The simulator against measured runs, side by side with the error per metric, in two settings:

* **Table 4(b)** (`benchmarks/launch_conditions.py`: simulated 0.5 s training steps, 30 iterations of 16 prompts,
  1 GU x 3 actors of the demo policy on this machine's cores), per schedule condition (default C0 and C4);
* **sync vs async** (`benchmarks/sync_vs_async.py`, the README's "ASP against the synchronous baseline": GRPO
  trainer, 1 GU x 2 actors, global batch 32, q_max 64, 30 updates): ``runtime.mode: sync`` + C0, async + C0 and
  async + C4. The simulator runs the same Control Unit core as the runtime (`asp.control`), sync rounds included.

The simulation sees only what the pipeline had measured before any launch: the generation-time model fitted on
metrics/profile_timings.csv, the length model fitted on the held-out profiled prompts, the schedule,
`simulate.cores` (CPU cores the actors share) and, for the GRPO trainer, `simulate.training` (fitted from an
earlier launch by `asp simulate fit-training`). Targets (issue 15, Table 4(b)): mean iteration time within 15 %,
mean Training Queue depth at arrival within 25 %. Needs the pipeline outputs up to `schedule` (`make run` or
`dvc repro schedule`); writes nothing under outputs/ and logs nothing. Run it on an otherwise idle machine: the
measured side is wall-clock time (every measured column is a real launch under Ray).

    .venv/bin/python benchmarks/sim_validation.py                    # both tables: C0, C4; sync C0, async C0, C4
    .venv/bin/python benchmarks/sim_validation.py C0 C1 C2 C3 C4     # Table 4(b) for these conditions (and sync)
    .venv/bin/python benchmarks/sim_validation.py --table sync       # the sync-vs-async table only
    .venv/bin/python benchmarks/sim_validation.py --iterations 5 --simulate-only     # a quick smoke, no launch
    .venv/bin/python benchmarks/sim_validation.py --table sync --preset demo-vllm   # on vLLM actors (CPU build)

Times on the idle 2-core machine: Table 4(b) C0 + C4 about 3 minutes, sync vs async about 4.5 minutes
(three GRPO launches of about 1.3 minutes each plus the simulations, a few seconds each).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launch_conditions import measure as measure_4b
from launch_conditions import table_4b_params
from sync_vs_async import RUNS as SYNC_RUNS
from sync_vs_async import SETTING, bench_params, run_name
from sync_vs_async import measure as measure_sync

from asp.cli.plan import load_params_with
from asp.config import Params
from asp.env import set_offline_defaults
from asp.pipeline import simulate as stage

ROWS_4B = {
    "mean_iteration_time_s": ("mean iteration time (s)", 0.15),
    "mean_iteration_time_s_excl_first": ("mean iteration time excl. first (s)", None),
    "depth_at_arrival_batches_mean": ("mean depth at arrival (global batches)", 0.25),
    "queue_std_samples": ("queue STD (samples)", None),
    "queue_max_samples": ("queue max (samples)", None),
    "generation_time_mean_s": ("generation time / minibatch (s)", None),
    "generation_time_std_s": ("gen-time STD / minibatch (s)", None),
    "padding_rate_mean": ("padding rate", None),
    "tokens_per_s": ("tokens/s", None),
}
ROWS_SYNC = {
    "mean_iteration_time_s": "mean iteration time (s)",
    "tokens_per_s": "generated tokens/s",
    "generation_utilization": "generation utilization (Σ generation time / (actors × wall))",
    "policy_lag_mean": "policy lag mean (steps)",
    "policy_lag_max": "policy lag max (steps)",
    "generation_time_mean_s": "T_gen per minibatch (s)",
    "train_step_mean_s": "T_train per step (s)",
    "padding_rate_mean": "padding rate",
    "wall_s": "run wall time (s)",
}


def simulated(p: Params, condition: str, lengths: str = "empirical") -> tuple[dict[str, float], float]:
    """The simulator's ``runtime/summary/...`` for the run `p` describes (its ``runtime:``, mode included) on
    `condition`'s schedule, and its wall seconds."""
    update = {"conditions": [condition], "lengths": lengths}
    p = p.model_copy(update={"simulate": p.simulate.model_copy(update=update)})
    t0 = time.perf_counter()
    paths = stage.Paths()
    result = stage.simulate_conditions(p, paths, stage.fit_models(p, paths))[condition]
    return result.metrics, time.perf_counter() - t0


def error(measured: float, sim: float) -> str:
    """The relative error in %, or the absolute difference where the measured value is 0 (a lag of 0)."""
    if measured == 0:
        return f"{sim - measured:+.3g} (abs.)"
    return f"{100 * (sim - measured) / measured:+.1f} %"


def cell(measured: dict[str, float] | None, sim: dict[str, float], key: str) -> str:
    """'measured | simulated | error' (or '- | simulated | -' with --simulate-only)."""
    s = sim[f"runtime/summary/{key}"]
    if measured is None:
        return f"- | {s:.4g} | -"
    m = measured[f"runtime/summary/{key}"]
    return f"{m:.4g} | {s:.4g} | {error(m, s)}"


def table_4b(params: Params, conditions: list[str], iterations: int | None, measure: bool) -> None:
    print("Table 4(b) setting (simulate.lengths: empirical, unless the row says lognormal)")
    print(f"| metric | {' | '.join(f'{c} measured | {c} simulated | error' for c in conditions)} | target |")
    print("|---|" + "---|---|---|" * len(conditions) + "---|")
    cells: dict[str, list[str]] = {k: [] for k in ROWS_4B}
    alt: list[str] = []
    for cond in conditions:
        p = table_4b_params(params, cond, iterations)
        real = measure_4b(params, cond, iterations) if measure else None
        sim, wall = simulated(p, cond)
        other, _ = simulated(p, cond, "lognormal")
        alt.append(cell(real, other, "mean_iteration_time_s"))
        print(f"{cond}: measured and simulated (simulation {wall:.2f} s)", file=sys.stderr)
        for key in ROWS_4B:
            cells[key].append(cell(real, sim, key))
    for key, (label, target) in ROWS_4B.items():
        print(f"| {label} | {' | '.join(cells[key])} | {f'within {100 * target:.0f} %' if target else ''} |")
    print(f"| mean iteration time (s), lognormal lengths | {' | '.join(alt)} | |")


def table_sync(params: Params, iterations: int | None, measure: bool) -> None:
    names = [run_name(*run) for run in SYNC_RUNS]
    print("sync-vs-async setting (benchmarks/sync_vs_async.py; simulate.lengths: empirical)")
    print(f"| metric | {' | '.join(f'{n} measured | {n} simulated | error' for n in names)} |")
    print("|---|" + "---|---|---|" * len(names))
    cells: dict[str, list[str]] = {k: [] for k in ROWS_SYNC}
    for (mode, cond, partial), name in zip(SYNC_RUNS, names, strict=True):
        p = bench_params(params, mode, cond, iterations or SETTING["iterations"], partial)
        real = measure_sync(p) if measure else None
        sim, wall = simulated(p, cond)
        print(f"{name}: measured and simulated (simulation {wall:.2f} s)", file=sys.stderr)
        for key in ROWS_SYNC:
            cells[key].append(cell(real, sim, key))
    for key, label in ROWS_SYNC.items():
        print(f"| {label} | {' | '.join(cells[key])} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conditions", nargs="*", default=["C0", "C4"], help="Table 4(b) conditions")
    parser.add_argument("--table", choices=["4b", "sync", "both"], default="both")
    parser.add_argument("--iterations", type=int, default=None, help="trainer steps of every run (default 30)")
    parser.add_argument("--simulate-only", action="store_true", help="skip the real launches (a quick smoke)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--preset", help="a preset of configs/ over the params (e.g. demo-vllm: vLLM actors)")
    args = parser.parse_args(argv)
    set_offline_defaults()
    params = load_params_with(Path(args.params), args.preset, [])
    if args.table in ("4b", "both"):
        table_4b(params, args.conditions, args.iterations, not args.simulate_only)
    if args.table in ("sync", "both"):
        if args.table == "both":
            print()
        table_sync(params, args.iterations, not args.simulate_only)


if __name__ == "__main__":
    main()
