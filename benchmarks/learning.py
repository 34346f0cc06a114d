"""Time to quality, side by side: held-out reward against the step and against wall-clock for the synchronous
baseline and asp's asynchronous runtime, from real `launch` runs (GRPO trainer, the demo policy's hf engines).

Conditions (the same policy, prompts, reward, hyper-parameters and number of updates; otherwise params.yaml's
`runtime:` with the setting of benchmarks/sync_vs_async.py: 2 actors, 32 prompts per update, q_max 64):

* ``sync C0``: generate one round, train, reload every actor (lag 0; the original prompt order);
* ``async C0``: the asynchronous runtime on the same minibatches;
* ``async C4``: ASP (the `schedule` stage's length-aware, history-aware schedule; the default);
* ``async C4 partial``: ASP with partial rollouts (``runtime.partial``).

Each condition runs once per seed (``common.seed`` + s: sampling, the schedule's randomness and the held-out
problems; arms interleaved per seed), with the launch stage's learning curve (`asp.steps.learning_curve`): held-out
reward every `--eval-interval` steps on `--eval-problems` new demo problems x 2 samples, evaluated after each run so
the wall-clock axis is the run's iteration time only. Printed (mean ± SE over seeds): final held-out reward; the
wall-clock to reach the sync baseline's final reward of the same seed (time to target; linear between evaluations)
and its ratio to sync's; the paired difference of each condition's final reward minus sync's with a 95 % t interval
("no degradation" for C4); the area under the curve; and what length-homogeneous batches do to the update: the
spread of mean rewards between a batch's prompts, of batch mean rewards over steps, the mean absolute advantage and the
spread of gradient norms. The figure draws the mean curves (band ± 1 SE) against step and wall-clock.

Needs the pipeline outputs up to `schedule` in `--root` (`asp repro schedule`). Writes nothing under outputs/
(temporary directories) and logs nothing (NullTracker).

    .venv/bin/python benchmarks/learning.py --json benchmarks/results/learning.json \
        --plot docs/img/learning.png                           # 3 seeds x 4 conditions
    .venv/bin/python benchmarks/learning.py --quick           # 1 seed, 4 steps of 8 prompts, 8 problems (a smoke)
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
import pandas as pd
from launch_paths import scratch_launch_paths

from asp.cli.plan import load_params_with
from asp.config import Params, RuntimeParams, deep_merge
from asp.env import set_offline_defaults
from asp.pipeline import launch
from asp.steps.paths import rebase
from asp.tracking import NullTracker

CONDITIONS = {  # name -> (mode, condition, partial rollouts)
    "sync C0": ("sync", "C0", False),
    "async C0": ("async", "C0", False),
    "async C4": ("async", "C4", False),
    "async C4 partial": ("async", "C4", True),
}
BASELINE = "sync C0"
SETTING = {  # benchmarks/sync_vs_async.py's setting
    "global_batch_prompts": 32,
    "heldout_problems": 0,  # the curve's first and last points are the before / after
    "queue": {"q_max": 64},
    "ray": {"generation_units": 1, "actors_per_unit": 2},
    "trainer": {"kind": "grpo"},
}
FULL = {"iterations": 40, "checkpoint_interval": 5, "eval_interval": 5, "eval_problems": 128, "seeds": 3}
QUICK = {
    "iterations": 4,
    "checkpoint_interval": 2,
    "eval_interval": 2,
    "eval_problems": 8,
    "seeds": 1,
    "global_batch_prompts": 8,
    "q_max": 16,
}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


# ---- statistics (pure) ----------------------------------------------------------------------------------
def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (std ddof 1 / sqrt(n); NaN for one value) of the finite `values`."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")


def paired_interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean of paired differences and its 95 % t interval (NaN bounds with one pair)."""
    mean, se = mean_se(diffs)
    df = len(diffs) - 1
    half = T95.get(df, 1.96) * se if df >= 1 else float("nan")
    return mean, mean - half, mean + half


def time_to(points: list[dict[str, float]], target: float) -> float:
    """Elapsed seconds at which the curve first reaches `target` (linear between evaluations; 0 when the first
    point already does; NaN when it never does)."""
    pts = sorted(points, key=lambda p: p["step"])
    for i, p in enumerate(pts):
        if p["reward"] >= target:
            if i == 0:
                return 0.0
            a = pts[i - 1]
            frac = (target - a["reward"]) / (p["reward"] - a["reward"])
            return float(a["elapsed_s"] + frac * (p["elapsed_s"] - a["elapsed_s"]))
    return float("nan")


def curve_points(metrics: dict[str, Any]) -> list[dict[str, float]]:
    """The learning curve of a launch from its ``learning/curve/step_<k>/...`` metrics."""
    by_step: dict[int, dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith("learning/curve/step_"):
            step_part, name = key[len("learning/curve/step_") :].split("/")
            by_step.setdefault(int(step_part), {"step": int(step_part)})[name] = float(value)
    return [by_step[s] for s in sorted(by_step)]


def update_spread(iterations: pd.DataFrame) -> dict[str, float]:
    """What the batches did to the update over a run's steps."""

    def col(name: str) -> np.ndarray:
        return iterations[name].to_numpy(dtype=float) if name in iterations else np.array([np.nan])

    return {
        "prompt_reward_std": float(np.nanmean(col("train/prompt_reward_std"))),
        "batch_reward_std": float(np.nanstd(col("train/reward_mean"))),
        "adv_abs_mean": float(np.nanmean(col("train/adv_abs_mean"))),
        "grad_norm_mean": float(np.nanmean(col("train/grad_norm"))),
        "grad_norm_std": float(np.nanstd(col("train/grad_norm"))),
        "iteration_time_s": float(np.nanmean(col("runtime/iteration_time_s"))),
        "lag_mean": float(np.nanmean(col("train/lag_mean"))),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per condition (mean ± SE over seeds): final reward, time to the baseline's final of the same seed and its
    ratio, paired difference to the baseline with a 95 % interval, AUC, update spreads; and the mean curve."""
    base = {r["seed"]: r for r in runs[BASELINE]}
    out: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        finals = [r["points"][-1]["reward"] for r in rs]
        times = [time_to(r["points"], base[r["seed"]]["points"][-1]["reward"]) for r in rs]
        base_times = [time_to(base[r["seed"]]["points"], base[r["seed"]]["points"][-1]["reward"]) for r in rs]
        ratios = [t / b if b > 0 else float("nan") for t, b in zip(times, base_times, strict=True)]
        diffs = [f - base[r["seed"]]["points"][-1]["reward"] for f, r in zip(finals, rs, strict=True)]
        row: dict[str, Any] = {
            "seeds": [r["seed"] for r in rs],
            "final": mean_se(finals),
            "start": mean_se([r["points"][0]["reward"] for r in rs]),
            "run_s": mean_se([r["points"][-1]["elapsed_s"] for r in rs]),
            "time_to_target_s": mean_se(times),
            "reached": f"{sum(math.isfinite(t) for t in times)}/{len(times)}",
            "ratio": mean_se(ratios),
            "diff_vs_sync": paired_interval(diffs),
            "auc_step": mean_se([r["metrics"].get("learning/auc_step", float("nan")) for r in rs]),
            "eval_s": mean_se([r["metrics"].get("learning/eval_seconds", float("nan")) for r in rs]),
        }
        for key in rs[0]["spread"]:
            row[key] = mean_se([r["spread"][key] for r in rs])
        steps = [p["step"] for p in rs[0]["points"]]
        row["curve"] = [
            {
                "step": s,
                "reward": mean_se([r["points"][i]["reward"] for r in rs])[0],
                "reward_se": mean_se([r["points"][i]["reward"] for r in rs])[1],
                "elapsed_s": mean_se([r["points"][i]["elapsed_s"] for r in rs])[0],
            }
            for i, s in enumerate(steps)
        ]
        out[name] = row
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The markdown table: one row per metric, one column per condition (mean ± SE over seeds)."""
    names = list(summary)

    def pm(v: tuple[float, float], fmt: str) -> str:
        m, se = v
        return f"{m:{fmt}}" + ("" if not math.isfinite(se) else f" ± {se:{fmt}}")

    def interval(v: tuple[float, float, float]) -> str:
        m, lo, hi = v
        return f"{m:+.3f}" + ("" if not math.isfinite(lo) else f" [{lo:+.3f}, {hi:+.3f}]")

    rows = [
        ("held-out reward at step 0", lambda r: pm(r["start"], ".3f")),
        ("final held-out reward", lambda r: pm(r["final"], ".3f")),
        ("final − sync's, paired (95 % t interval)", lambda r: interval(r["diff_vs_sync"])),
        ("run wall-clock, iteration time (s)", lambda r: pm(r["run_s"], ".0f")),
        ("time to sync's final reward (s)", lambda r: pm(r["time_to_target_s"], ".0f") + f" ({r['reached']})"),
        ("… its ratio to sync's", lambda r: pm(r["ratio"], ".2f")),
        ("area under the curve (mean reward over steps)", lambda r: pm(r["auc_step"], ".3f")),
        ("mean iteration time (s)", lambda r: pm(r["iteration_time_s"], ".2f")),
        ("policy lag mean (steps)", lambda r: pm(r["lag_mean"], ".2f")),
        ("reward spread between a batch's prompts (std)", lambda r: pm(r["prompt_reward_std"], ".3f")),
        ("batch mean reward spread over steps (std)", lambda r: pm(r["batch_reward_std"], ".3f")),
        ("mean absolute advantage", lambda r: pm(r["adv_abs_mean"], ".3f")),
        ("grad norm mean", lambda r: pm(r["grad_norm_mean"], ".3f")),
        ("grad norm spread over steps (std)", lambda r: pm(r["grad_norm_std"], ".3f")),
        ("evaluation time, apart (s)", lambda r: pm(r["eval_s"], ".0f")),
    ]
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(fn(summary[n]) for n in names) + " |" for label, fn in rows]
    return "\n".join(lines)


# ---- runs ----------------------------------------------------------------------------------------------
def bench_params(params: Params, name: str, seed: int, setting: dict[str, int]) -> Params:
    """params with the setting, the condition `name`'s mode / schedule / partial rollouts and seed offset `seed`."""
    mode, condition, partial = CONDITIONS[name]
    runtime = params.runtime
    budget = min(runtime.partial.token_budget, max(1, runtime.sampling.max_new_tokens // 2))
    update: dict[str, Any] = {
        "iterations": setting["iterations"],
        "checkpoint_interval": setting["checkpoint_interval"],
        "mode": mode,
        "condition": condition,
        "partial": {"enabled": partial, "token_budget": budget},
        "grpo": {"eval_interval": setting["eval_interval"], "eval_problems": setting["eval_problems"]},
    }
    if "global_batch_prompts" in setting:
        update["global_batch_prompts"] = setting["global_batch_prompts"]
    if "q_max" in setting:  # the setting's Training Queue depth: runtime.queue.q_max
        update["queue"] = {"q_max": setting["q_max"]}
    merged = deep_merge(runtime.model_dump(), deep_merge(SETTING, update))
    common = params.common.model_copy(update={"seed": params.common.seed + seed})
    return params.model_copy(update={"runtime": RuntimeParams.model_validate(merged), "common": common})


def measure(params: Params, root: Path) -> dict[str, Any]:
    """One real launch in a temporary directory: its metrics, learning curve and update spreads."""
    load, start = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        paths = scratch_launch_paths(t, rebase(launch.Paths(), root))
        metrics = launch.run(params, paths, NullTracker())
        iterations = pd.read_parquet(t / "launch" / "iterations.parquet")
    if metrics.get("learning/measured") != 1:
        raise SystemExit(f"no learning curve: {metrics.get('learning/note')}")
    return {
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, int | float)},
        "points": curve_points(metrics),
        "spread": update_spread(iterations),
        "total_s": time.perf_counter() - start,
        "load_start": load,
    }


def figure(summary: dict[str, dict[str, Any]], path: Path) -> None:
    from asp.plots import save_figure
    from asp.plots.learning import learning_curve_figure

    target = summary[BASELINE]["final"][0]
    curves = {name: row["curve"] for name, row in summary.items()}
    seeds = len(summary[BASELINE]["seeds"])
    fig = learning_curve_figure(curves, title=f"Held-out reward, mean of {seeds} seed(s)", target=target)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def run_all(args: argparse.Namespace, setting: dict[str, int], names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every condition once per seed, interleaved per seed; with --json the runs so far are saved after each one
    (--from-json makes the table of what finished: each condition over the seeds it ran)."""
    set_offline_defaults()
    params = load_params_with(args.params or args.root / "params.yaml", None, [])
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in range(setting["seeds"]):
        for name in names:
            run = measure(bench_params(params, name, seed, setting), args.root)
            runs[name].append({"seed": seed, **run})
            final = run["points"][-1]
            print(
                f"seed {seed} {name}: final {final['reward']:.3f} at {final['elapsed_s']:.0f} s "
                f"({run['total_s']:.0f} s with start-up and evaluation, load {run['load_start']:.1f})",
                file=sys.stderr,
            )
            if args.json is not None:
                write(args.json, {"setting": setting, "runs": runs})
    return runs


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 seed, 4 steps of 8 prompts, 8 held-out problems (a smoke run)"
    )
    parser.add_argument("--seeds", type=int, help="seeds per condition (default 3; quick 1)")
    parser.add_argument("--iterations", type=int, help="GRPO updates per run (default 40; quick 4)")
    parser.add_argument("--eval-interval", type=int, help="steps between evaluations (default 5; quick 2)")
    parser.add_argument("--eval-problems", type=int, help="held-out problems per evaluation (default 128)")
    parser.add_argument("--conditions", nargs="+", choices=list(CONDITIONS), default=list(CONDITIONS))
    parser.add_argument("--root", type=Path, default=Path("."), help="project with the outputs up to `schedule`")
    parser.add_argument("--params", type=Path, help="params file (default: <root>/params.yaml)")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    parser.add_argument("--plot", type=Path, help="write the figure here")
    parser.add_argument("--from-json", type=Path, help="no runs: the table and figure of an earlier --json")
    args = parser.parse_args(argv)
    setting = dict(QUICK if args.quick else FULL)
    for key in ("seeds", "iterations", "eval_interval", "eval_problems"):
        if getattr(args, key) is not None:
            setting[key] = getattr(args, key)
    if args.eval_interval is not None:
        setting["checkpoint_interval"] = args.eval_interval
    names = [BASELINE, *[n for n in args.conditions if n != BASELINE]]
    if args.from_json is not None:  # the table and figure again from a (possibly cut short) earlier run
        saved = json.loads(args.from_json.read_text())
        setting, runs = saved["setting"], saved["runs"]
        paired = {r["seed"] for r in runs[BASELINE]}  # a run counts when the baseline ran its seed
        runs = {n: [r for r in rs if r["seed"] in paired] for n, rs in runs.items() if rs}
    else:
        runs = run_all(args, setting, names)
    summary = summarize(runs)
    print(f"setting: {setting}; seeds per condition: { {n: len(rs) for n, rs in runs.items()} }")
    print(table(summary))
    if args.json is not None:
        write(args.json, {"setting": setting, "runs": runs, "summary": summary})
    if args.plot is not None:
        figure(summary, args.plot)
    return summary


if __name__ == "__main__":
    main()
