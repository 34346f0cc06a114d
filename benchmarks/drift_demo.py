"""Length drift on the demo, measured: the same GRPO `launch` with `drift.action: reprofile` (the default) and with
`drift.action: warn`, side by side.

Needs the drift demo's pipeline outputs up to `schedule` (the policy warm-started with shortcuts on long
problems, so GRPO lengthens them; configs/drift-demo.yaml):

    asp preset apply drift-demo && dvc repro schedule      # in a scratch clone: it rewrites params.yaml
    .venv/bin/python benchmarks/drift_demo.py              # ~15 min on the idle 2-core machine
    .venv/bin/python benchmarks/drift_demo.py --actions warn   # one of the two

Each run is a real launch stage run (`asp.pipeline.launch.run`) in a temporary directory (outputs/ and the MLflow
store are not touched; NullTracker, so the re-profiled predictor is not registered here: `dvc repro` registers
it). The table compares windows *before* the first drift event with windows from `--settle` trainer steps after
it (the same rule for both runs: in the reprofile run those windows are on the new schedule), and lists the
re-profile time next to the run's wall time and the exactly-once ledger (prompts lost / trained twice).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from launch_paths import scratch_launch_paths

from asp.config import Params, load_params
from asp.env import set_offline_defaults
from asp.pipeline import launch
from asp.tracking import NullTracker

ROWS = {  # key -> (label, format)
    "drift/summary/first_event_step": ("first drift event at trainer step", ".0f"),
    "drift/summary/tau_at_first_event": ("window Kendall tau when it fired (stale predictor)", ".3f"),
    "bench/tau_before": ("window tau, before the event (mean)", ".3f"),
    "bench/tau_after": ("window tau, after (mean)", ".3f"),
    "bench/bias_before": ("calibration bias realized/predicted, before (median of windows)", ".3f"),
    "bench/bias_after": ("calibration bias, after", ".3f"),
    "bench/padding_before": ("padding rate, before", ".3f"),
    "bench/padding_after": ("padding rate, after", ".3f"),
    "bench/cv_before": ("realized group-load CV, before", ".3f"),
    "bench/cv_after": ("realized group-load CV, after", ".3f"),
    "bench/mean_length_before": ("mean response length, before (tokens)", ".1f"),
    "bench/mean_length_after": ("mean response length, after (tokens)", ".1f"),
    "drift/summary/events": ("drift events", ".0f"),
    "drift/summary/reprofiles": ("re-profiles", ".0f"),
    "drift/summary/reprofile_accepted": ("re-profiles accepted (tau gate)", ".0f"),
    "drift/summary/reprofile_s": ("re-profile time (s)", ".1f"),
    "bench/total_s": ("launch wall time incl. re-profile and start-up (s)", ".1f"),
    "runtime/summary/mean_iteration_time_s": ("mean iteration time, last session (s)", ".3f"),
    "drift/summary/predictor_version_final": ("predictor version at the end", ".0f"),
    "drift/summary/lost_prompts": ("prompts lost", ".0f"),
    "drift/summary/duplicated_prompts": ("prompts trained twice", ".0f"),
    "grpo/reward_first_20pct": ("reward, first 20 % of steps", ".3f"),
    "grpo/reward_last_20pct": ("reward, last 20 % of steps", ".3f"),
    "grpo/heldout_reward_before": ("held-out reward, initial policy", ".3f"),
    "grpo/heldout_reward_after": ("held-out reward, final weights", ".3f"),
    "bench/load_start": ("1-min load average at start (other jobs)", ".1f"),
}


def window_rows(state_dir: Path) -> list[dict[str, Any]]:
    """The window rows of a run's drift history (``drift_history.jsonl``)."""
    path = state_dir / "drift_history.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return [r for r in rows if r.get("kind") == "window"]


def before_after(windows: list[dict[str, Any]], event_step: float, settle: int) -> dict[str, float]:
    """Window statistics before the first event and from `settle` steps after it (NaN where no window)."""

    def stat(rows: list[dict[str, Any]], key: str, fn: Any = np.mean) -> float:
        vals = [float(r[key]) for r in rows if r.get(key) is not None and math.isfinite(float(r[key]))]
        return float(fn(vals)) if vals else float("nan")

    if not math.isfinite(event_step):
        event_step = float("inf")
    before = [r for r in windows if r["step"] < event_step]
    after = [r for r in windows if r["step"] >= event_step + settle]
    out = {}
    for name, key, fn in (
        ("tau", "drift/tau_window", np.mean),
        ("bias", "drift/bias_window", np.median),
        ("padding", "drift/padding_rate", np.mean),
        ("cv", "drift/group_load_cv_realized", np.mean),
        ("mean_length", "drift/mean_length", np.mean),
    ):
        out[f"bench/{name}_before"] = stat(before, key, fn)
        out[f"bench/{name}_after"] = stat(after, key, fn)
    return out


def measure(params: Params, action: str, settle: int) -> dict[str, float]:
    """One real launch with `drift.action` = `action` in a temporary directory."""
    params = params.model_copy(update={"drift": params.drift.model_copy(update={"enabled": True, "action": action})})
    load_start, start = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        paths = scratch_launch_paths(Path(tmp), drift_plot=Path(f"plots/drift_demo_{action}.png"))
        metrics = launch.run(params, paths, NullTracker())
        windows = window_rows(paths.state_dir / params.runtime.condition)
    total = time.perf_counter() - start
    stats = before_after(windows, float(metrics.get("drift/summary/first_event_step", float("nan"))), settle)
    return {**metrics, **stats, "bench/total_s": total, "bench/load_start": load_start}


def table(results: dict[str, dict[str, float]]) -> str:
    """The markdown table: one row per metric, one column per run."""
    names = list(results)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, (label, fmt) in ROWS.items():
        cells = []
        for n in names:
            value = results[n].get(key, float("nan"))
            cells.append(format(float(value), fmt) if isinstance(value, int | float) else str(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument(
        "--actions", nargs="+", default=["reprofile", "warn"], choices=["reprofile", "warn", "recalibrate"]
    )
    parser.add_argument("--settle", type=int, default=10, help="trainer steps after the event before 'after' windows")
    args = parser.parse_args(argv)
    set_offline_defaults()
    params = load_params(args.params)
    results = {}
    for action in args.actions:
        results[f"action {action}"] = measure(params, action, args.settle)
        print(f"action {action} done in {results[f'action {action}']['bench/total_s']:.0f} s", file=sys.stderr)
    print(table(results))


if __name__ == "__main__":
    main()
