"""ASP against the synchronous hybrid-style baseline (paper Table 3 / Figure 2) on this machine: three real
`launch` runs with the GRPO trainer and the demo policy's hf engines, same seeds, side by side.

* ``sync`` + C0: generate one round (>= one global batch) with all actors, train on it, reload every actor,
  repeat (`runtime.mode: sync`, lag 0; the original prompt order in fixed minibatches);
* ``async`` + C0: the asynchronous runtime on the same minibatches (generation overlaps training);
* ``async`` + C4: ASP, the asynchronous runtime on the `schedule` stage's length-aware schedule.

Setting (the same for all three, otherwise params.yaml's `runtime:` section): 2 generation actors (1 GU),
``global_batch_prompts`` = 32 = actors x b (b = 16 prompts per demo minibatch, so a sync round is one
minibatch per actor), ``q_max`` 64, 30 iterations (GRPO updates), 8 samples per prompt, 160 new tokens,
``max_policy_lag`` 4 (async), held-out reward evaluation off. About 4 minutes on the idle 2-core machine, 7.5
with other jobs running (the table prints the 1-min load), about 1.5 of which are start-up (Ray, actors, trainer).

``--preset demo-vllm`` runs the same comparison on vLLM generation actors (configs/demo-vllm.yaml: vLLM's CPU
build, weight updates through the worker extension). Where the params turn partial rollouts on, as that preset does,
a fourth run is added, ``async C4 partial``: ASP with partial rollouts (``runtime.partial``: responses cut at the
token budget, continued from their token ids after reloads); the other three runs have them off. ``--runs`` picks
runs by name.

Needs the pipeline outputs up to `schedule` (`make run` or `asp repro schedule` first). Writes nothing under
outputs/ (temporary directories) and logs nothing (NullTracker).

    .venv/bin/python benchmarks/sync_vs_async.py
    .venv/bin/python benchmarks/sync_vs_async.py --iterations 10     # a quicker look
    .venv/bin/python benchmarks/sync_vs_async.py --preset demo-vllm  # on vLLM actors, + C4 with partial rollouts
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from launch_paths import scratch_launch_paths

from asp.cli.plan import load_params_with
from asp.config import Params, RuntimeParams, deep_merge
from asp.env import set_offline_defaults
from asp.pipeline import launch
from asp.tracking import NullTracker

RUNS = (("sync", "C0", False), ("async", "C0", False), ("async", "C4", False))
PARTIAL_RUN = ("async", "C4", True)  # added where the params turn partial rollouts on (demo-vllm), or by --runs
SETTING = {
    "global_batch_prompts": 32,
    "iterations": 30,
    "heldout_problems": 0,
    "queue": {"q_max": 64},
    "ray": {"generation_units": 1, "actors_per_unit": 2},
    "trainer": {"kind": "grpo"},
}
ROWS = {  # metric key -> (label, format)
    "runtime/summary/mean_iteration_time_s": ("mean iteration time (s)", ".3f"),
    "runtime/summary/tokens_per_s": ("generated tokens/s", ",.0f"),
    "runtime/summary/generation_utilization": ("generation utilization (actor duty cycle)", ".3f"),
    "runtime/summary/policy_lag_mean": ("policy lag mean (steps)", ".2f"),
    "runtime/summary/policy_lag_max": ("policy lag max (steps)", ".0f"),
    "grpo/reward_first_20pct": ("reward, first 20 % of steps", ".3f"),
    "grpo/reward_last_20pct": ("reward, last 20 % of steps", ".3f"),
    "runtime/summary/wall_s": ("run wall time (s, first dispatch to last step)", ".1f"),
    "bench/total_s": ("launch wall time incl. start-up (s)", ".1f"),
    "bench/load_start": ("1-min load average at start (other jobs)", ".1f"),
    "bench/load_end": ("1-min load average at end", ".1f"),
    "grpo/T_gen_s": ("T_gen: generation per minibatch (s)", ".3f"),
    "grpo/T_train_s": ("T_train: trainer step (s)", ".3f"),
    "runtime/summary/reload_time_mean_s": ("reload per actor and snapshot (s)", ".4f"),
    "runtime/summary/padding_rate_mean": ("padding rate", ".3f"),
    "runtime/summary/split_response_share": ("responses continued across a reload (share)", ".3f"),
    "runtime/summary/stale_dropped_prompts": ("prompts dropped as too stale", ".0f"),
    "grpo/duty_cycle_measured": ("T_gen / (T_gen + T_load) (trainer's duty cycle)", ".3f"),
}


def bench_params(params: Params, mode: str, condition: str, iterations: int, partial: bool = False) -> Params:
    """params with the benchmark setting above, `runtime.mode`, `runtime.condition` and partial rollouts set."""
    update = {"iterations": iterations, "mode": mode, "condition": condition, "partial": {"enabled": partial}}
    runtime = RuntimeParams.model_validate(deep_merge(params.runtime.model_dump(), deep_merge(SETTING, update)))
    return params.model_copy(update={"runtime": runtime})


def run_name(mode: str, condition: str, partial: bool) -> str:
    return f"{mode} {condition}" + (" partial" if partial else "")


def measure(params: Params, keep: Path | None = None) -> dict[str, float]:
    """One real launch in a temporary directory; its metrics plus ``bench/total_s`` (wall time incl. start-up) and
    the machine's 1-min load average before and after (``bench/load_start|end``: other jobs slow every timing).
    `keep`: a folder to copy the launch's record tables into (iterations.parquet, minibatches.parquet)."""
    load_start, start = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        metrics = launch.run(params, scratch_launch_paths(Path(tmp)), NullTracker())
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("iterations.parquet", "minibatches.parquet"):
                shutil.copyfile(Path(tmp) / "launch" / name, keep / name)
    total = time.perf_counter() - start
    return {**metrics, "bench/total_s": total, "bench/load_start": load_start, "bench/load_end": os.getloadavg()[0]}


def table(results: dict[str, dict[str, float]]) -> str:
    """The markdown table: one row per metric, one column per run."""
    names = list(results)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, (label, fmt) in ROWS.items():
        cells = [format(float(results[n].get(key, float("nan"))), fmt) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=SETTING["iterations"], help="GRPO updates per run")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--preset", help="a preset of configs/ over the params (e.g. demo-vllm)")
    parser.add_argument("--runs", nargs="+", help="run names, e.g. 'sync C0' 'async C4 partial'")
    args = parser.parse_args(argv)
    set_offline_defaults()
    params = load_params_with(Path(args.params), args.preset, [])
    runs = list(RUNS) + ([PARTIAL_RUN] if params.runtime.partial.enabled else [])
    if args.runs:
        known = {run_name(*r): r for r in (*RUNS, PARTIAL_RUN)}
        unknown = sorted(set(args.runs) - set(known))
        if unknown:
            parser.error(f"unknown run(s) {unknown}; choose from {sorted(known)}")
        runs = [known[n] for n in args.runs]
    engine = params.runtime.engine.kind
    print(f"engine: {engine}; runs: {[run_name(*r) for r in runs]}", file=sys.stderr)
    results = {}
    for mode, condition, partial in runs:
        name = run_name(mode, condition, partial)
        results[name] = measure(bench_params(params, mode, condition, args.iterations, partial))
        print(f"{name} done in {results[name]['bench/total_s']:.0f} s", file=sys.stderr)
    print(table(results))


if __name__ == "__main__":
    main()
