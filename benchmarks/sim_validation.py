"""The simulator against measured runs: the setting of `benchmarks/launch_conditions.py` (paper Table 4(b):
simulated 0.5 s training steps, 30 iterations of 16 prompts, 1 GU x 3 actors of the demo policy on this
machine's cores) run for real under Ray and simulated with `asp.sim`, side by side, per condition.

The simulation sees only what the pipeline had measured before any launch: the generation-time model fitted on
metrics/profile_timings.csv, the length model fitted on the held-out profiled prompts, the schedule, and
`simulate.cores` (CPU cores the actors share). Targets (issue 15): mean iteration time within 15 %, mean Training
Queue depth at arrival within 25 %. Needs the pipeline outputs up to `schedule` (`make run` or
`dvc repro schedule`); writes nothing under outputs/ and logs nothing. Run it on an otherwise idle machine: the
measured side is wall-clock time.

    .venv/bin/python benchmarks/sim_validation.py              # C0 and C4 (about 3 minutes on 2 cores)
    .venv/bin/python benchmarks/sim_validation.py C0 C1 C2 C3 C4
"""

from __future__ import annotations

import sys
import time

from launch_conditions import measure, table_4b_params

from asp.config import load_params
from asp.env import set_offline_defaults
from asp.pipeline import simulate as stage

ROWS = {
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


def simulated(params, condition: str, lengths: str = "empirical") -> tuple[dict[str, float], float]:  # noqa: ANN001
    """The simulator's ``runtime/summary/...`` for the same setting, and its wall seconds."""
    p = table_4b_params(params, condition)
    update = {"conditions": [condition], "lengths": lengths}
    p = p.model_copy(update={"simulate": p.simulate.model_copy(update=update)})
    t0 = time.perf_counter()
    paths = stage.Paths()
    result = stage.simulate_conditions(p, paths, stage.fit_models(p, paths))[condition]
    return result.metrics, time.perf_counter() - t0


def main(conditions: list[str]) -> None:
    set_offline_defaults()
    params = load_params("params.yaml")
    print("(simulate.lengths: empirical, unless the row says lognormal)")
    print(f"| metric | {' | '.join(f'{c} measured | {c} simulated | error' for c in conditions)} | target |")
    print("|---|" + "---|---|---|" * len(conditions) + "---|")
    cells: dict[str, list[str]] = {k: [] for k in ROWS}
    alt: list[str] = []
    for cond in conditions:
        real = measure(params, cond)
        sim, wall = simulated(params, cond)
        other, _ = simulated(params, cond, "lognormal")
        m, s = real["runtime/summary/mean_iteration_time_s"], other["runtime/summary/mean_iteration_time_s"]
        alt.append(f"{m:.4g} | {s:.4g} | {100 * (s - m) / m:+.1f} %")
        print(f"{cond}: measured and simulated (simulation {wall:.2f} s)", file=sys.stderr)
        for key in ROWS:
            m, s = real[f"runtime/summary/{key}"], sim[f"runtime/summary/{key}"]
            err = (s - m) / m if m else float("nan")
            cells[key].append(f"{m:.4g} | {s:.4g} | {100 * err:+.1f} %")
    for key, (label, target) in ROWS.items():
        print(f"| {label} | {' | '.join(cells[key])} | {f'within {100 * target:.0f} %' if target else ''} |")
    print(f"| mean iteration time (s), lognormal lengths | {' | '.join(alt)} | |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["C0", "C4"])
