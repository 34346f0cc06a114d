"""Table 4(b) of the paper on this machine: the `launch` stage's asynchronous run (real generation by the demo
policy, simulated training) under schedule conditions C0-C4, same seeds, side by side.

Needs the pipeline outputs up to `schedule` (run `make run` first). Uses params.yaml's `runtime:` section with
the Table 4(b) setting below (simulated trainer, 0.5 s steps, 30 iterations of 16 prompts, 3 actors) and
`runtime.condition` overridden; writes nothing under outputs/ (temporary directories) and logs nothing.

    .venv/bin/python benchmarks/launch_conditions.py            # C0 and C4
    .venv/bin/python benchmarks/launch_conditions.py C0 C1 C2 C3 C4
    .venv/bin/python benchmarks/launch_conditions.py C0 --iterations 3     # a quick smoke (not the table)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from launch_paths import scratch_launch_paths

from asp.config import Params, RuntimeParams, deep_merge, load_params
from asp.env import set_offline_defaults
from asp.pipeline import launch
from asp.tracking import NullTracker

# the scheduling-study setting (fixed training time, so iteration time reflects the schedule only)
TABLE_4B = {
    "iterations": 30,
    "global_batch_prompts": 16,
    "queue": {"q_max": 64, "gu_queue_target": 6, "max_policy_lag": None},
    "ray": {"actors_per_unit": 3},
    "trainer": {"kind": "simulated", "step_s": 0.5, "refresh_delay_s": 0.2},
}
COLUMNS = {
    "mean_iteration_time_s": "mean iter (s)",
    "mean_iteration_time_s_excl_first": "mean iter excl. first (s)",
    "iteration_time_trend": "trend (Spearman)",
    "queue_std_samples": "queue STD (samples)",
    "queue_max_samples": "queue max (samples)",
    "generation_time_std_s": "gen-time STD / mb (s)",
    "padding_rate_mean": "padding rate",
    "tokens_per_s": "tokens/s",
}


def table_4b_params(params: Params, condition: str, iterations: int | None = None) -> Params:
    """params with the Table 4(b) runtime setting above and `runtime.condition` set (`iterations`: fewer steps for a
    quick look; None: the setting's 30)."""
    extra = {} if iterations is None else {"iterations": iterations}
    overlay = deep_merge(TABLE_4B, {"condition": condition, **extra})
    runtime = RuntimeParams.model_validate(deep_merge(params.runtime.model_dump(), overlay))
    return params.model_copy(update={"runtime": runtime})


def measure(params: Params, condition: str, iterations: int | None = None) -> dict[str, float]:
    """One real launch (Ray, the demo policy generating, simulated training) in a temporary directory; its
    ``runtime/summary/...`` metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = scratch_launch_paths(Path(tmp))
        return launch.run(table_4b_params(params, condition, iterations), paths, NullTracker())


def main(conditions: list[str], iterations: int | None = None) -> None:
    set_offline_defaults()
    params = load_params("params.yaml")
    rows = {}
    for cond in conditions:
        metrics = measure(params, cond, iterations)
        rows[cond] = {k: metrics[f"runtime/summary/{k}"] for k in COLUMNS}
        print(f"{cond} done", file=sys.stderr)
    print("| metric | " + " | ".join(conditions) + " |")
    print("|---|" + "---|" * len(conditions))
    for key, label in COLUMNS.items():
        print(f"| {label} | " + " | ".join(f"{rows[c][key]:.4g}" for c in conditions) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conditions", nargs="*", help="schedule conditions, of C0-C4 (default C0 C4)")
    parser.add_argument("--iterations", type=int, default=None, help="trainer steps (default the setting's 30)")
    args = parser.parse_args()
    if bad := [c for c in args.conditions if c not in ("C0", "C1", "C2", "C3", "C4")]:
        parser.error(f"unknown condition {bad[0]!r}: give some of C0 C1 C2 C3 C4")
    main(args.conditions or ["C0", "C4"], args.iterations)
