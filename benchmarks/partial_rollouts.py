"""Partial rollouts and the online length correction against the offline schedule alone (issue 25 §3).

Three parts, each printing a Markdown table:

(demo) Real `launch` runs on this machine (the demo policy generating with hf engines, the GRPO trainer, Ray), same
       seeds and the same number of updates, under C0 (original order) and C4 (ASP), each without and with partial
       rollouts (``runtime.partial``: ``--demo-budget`` tokens per response per engine call, continuation order
       fifo and online). Needs the pipeline outputs up to `schedule` (``make run`` / ``dvc repro schedule``); runs in
       temporary directories, logs nothing, drift watch off, no held-out evaluation (``heldout_problems: 0``).
(sim)  The same conditions in the discrete-event simulator at the GPU preset's layout (configs/gpu-cluster.yaml
       over params.yaml: 3 GUs x 4 actors, batch 512 prompts x n = 8, cap 8,192 tokens, q_max 2,048,
       max_policy_lag 2 with drop, schedule b = 32, kappa = 2, k = 6) with the continuous-batching time model,
       where padding costs nothing and only the tail does. The workload and the time models are the ASSUMPTIONS of
       benchmarks/bench_sim.py (synthetic DeepScaleR-like lengths, predictions at Kendall tau ~0.7, a vLLM-like
       engine at ~20 ms per decode step and 1 s per call, a trainer at 2 s + 1.2 us per token): no GPU measured
       them. ``--sim-budget`` tokens per response per call.
(sim, demo layout) The demo's own layout in the simulator with the simulate stage's models fitted on this machine
       (static hf model), ``--sim-iterations`` updates: does the simulator predict what (demo) measures?

Columns: mean iteration time (s), generation utilization (engine seconds / (actors x wall)), padding rate of the
engine calls (1 - tokens / row-steps), generated tokens/s, policy lag mean / max (a response counts from its oldest
segment), share of trained responses whose segments came from more than one policy version, prompts dropped by the
lag bound (all, and those dropped while held, before any engine time was spent continuing them), tokens decoded for
prompts that were then dropped (wasted), continuation calls, prompts dropped per length bucket (quarters of
max_new_tokens by the prompt's longest response so far: q1 / q2 / q3 / q4) and (demo) the mean GRPO reward.

    .venv/bin/python benchmarks/partial_rollouts.py                      # both parts (~10-15 min on 2 busy cores)
    .venv/bin/python benchmarks/partial_rollouts.py --skip-demo          # the simulated table only (~1 min)
    .venv/bin/python benchmarks/partial_rollouts.py --demo-iterations 3 --skip-sim    # a quick look
    .venv/bin/python benchmarks/partial_rollouts.py --json benchmarks/results/partial_rollouts.json
    .venv/bin/python benchmarks/partial_rollouts.py --skip-demo --skip-sim-demo --sim-lag none \
        --time-model h100-qwen3-8b --variants C4 "C4 + partial (fifo)"    # a sourced preset, with its range

``--time-model PRESET`` simulates the GPU layout with a published-source preset of `asp.sim.presets` instead of
bench_sim's assumed model and prints each variant's mean iteration time over C4's at the preset and its min-max over
the preset's 13-point sensitivity grid (`SENSITIVITY_GRID`; C4 among the variants).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from asp.sim.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_sim's synthetic workload and assumed models

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {  # name -> (condition, runtime.partial)
    "C0": ("C0", {"enabled": False}),
    "C4": ("C4", {"enabled": False}),
    "C0 + partial (fifo)": ("C0", {"enabled": True, "continuation_order": "fifo"}),
    "C0 + partial (online)": ("C0", {"enabled": True, "continuation_order": "online"}),
    "C4 + partial (fifo)": ("C4", {"enabled": True, "continuation_order": "fifo"}),
    "C4 + partial (online)": ("C4", {"enabled": True, "continuation_order": "online"}),
    "C0 + partial (online, full calls)": (
        "C0",
        {"enabled": True, "continuation_order": "online", "wait_for_full": True},
    ),
    "C4 + partial (online, full calls)": (
        "C4",
        {"enabled": True, "continuation_order": "online", "wait_for_full": True},
    ),
    # admission under a lag bound (issue 37): the default continues the oldest held minibatch first; without it,
    # continuation_order alone (the same as the default when there is no bound)
    "C4 + partial (fifo, not oldest first)": (
        "C4",
        {"enabled": True, "continuation_order": "fifo", "oldest_first": False},
    ),
    "C4 + partial (online, not oldest first)": (
        "C4",
        {"enabled": True, "continuation_order": "online", "oldest_first": False},
    ),
}
DEMO_DEFAULT = ["C0", "C4", "C0 + partial (online)", "C4 + partial (online)", "C0 + partial (online, full calls)"]
COLUMNS = {  # runtime/summary/<key> -> header
    "mean_iteration_time_s": "mean iter (s)",
    "generation_utilization": "gen. util.",
    "padding_rate_mean": "padding",
    "tokens_per_s": "tokens/s",
    "policy_lag_mean": "lag mean",
    "policy_lag_max": "lag max",
    "split_response_share": "split share",
    "stale_dropped_prompts": "dropped",
    "stale_held_prompts": "dropped before continuing",
    "stale_wasted_tokens": "wasted tokens",
    "continuations": "cont. calls",
}
BUCKETS = ("q1", "q2", "q3", "q4")  # quarters of max_new_tokens by the prompt's longest response (asp.control.partial)


def by_bucket(m: dict[str, float]) -> str:
    """Prompts dropped (or regenerated) per length bucket, q1 / q2 / q3 / q4."""
    kind = "regenerated" if m.get("runtime/summary/stale_regenerated_prompts", 0) else "dropped"
    return " / ".join(f"{m.get(f'runtime/summary/stale_{kind}_prompts_{b}', float('nan')):.0f}" for b in BUCKETS)


def row(name: str, m: dict[str, float], extra: dict[str, str]) -> str:
    cells = [name] + [f"{m.get(f'runtime/summary/{k}', float('nan')):.4g}" for k in COLUMNS] + list(extra.values())
    return "| " + " | ".join(cells) + " |"


def table(rows: dict[str, dict[str, float]], extra_cols: dict[str, Any] | None = None) -> None:
    extra_cols = extra_cols or {}
    print("| variant | " + " | ".join(COLUMNS.values()) + "".join(f" | {h}" for h in extra_cols) + " |")
    print("|---|" + "---:|" * (len(COLUMNS) + len(extra_cols)))
    for name, m in rows.items():
        print(row(name, m, {h: f(m) for h, f in extra_cols.items()}))


# ---- demo: real launches ----------------------------------------------------------------------------------------
def demo_params(params: Any, condition: str, partial: dict[str, Any], iterations: int, budget: int) -> Any:
    from asp.config import PartialParams

    part = PartialParams(**{**partial, "token_budget": budget})
    runtime = params.runtime.model_copy(
        update={"condition": condition, "iterations": iterations, "heldout_problems": 0, "partial": part}
    )
    drift = params.drift.model_copy(update={"enabled": False})
    return params.model_copy(update={"runtime": runtime, "drift": drift})


def demo(iterations: int, budget: int, variants: list[str]) -> dict[str, dict[str, float]]:
    from launch_paths import scratch_launch_paths

    from asp.config import load_params
    from asp.env import set_offline_defaults
    from asp.pipeline import launch
    from asp.tracking import NullTracker

    set_offline_defaults()
    params = load_params(ROOT / "params.yaml")
    print(
        f"\n## (demo) launch, GRPO, hf engines, {iterations} updates, budget {budget} tokens "
        f"(runtime: {params.runtime.ray.generation_units} GU x {params.runtime.ray.actors_per_unit} actors, batch "
        f"{params.runtime.global_batch_prompts} x n={params.runtime.sampling.n_samples}, "
        f"cap {params.runtime.sampling.max_new_tokens})\n"
    )
    rows = {}
    for name in variants:
        condition, partial = VARIANTS[name]
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            paths = scratch_launch_paths(Path(tmp))
            rows[name] = launch.run(demo_params(params, condition, partial, iterations, budget), paths, NullTracker())
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    table(rows, {"dropped q1/q2/q3/q4": by_bucket, "reward (first / last 20 %)": _reward})
    return rows


def _reward(m: dict[str, float]) -> str:
    return (
        f"{m.get('grpo/reward_first_20pct', float('nan')):.3f} / {m.get('grpo/reward_last_20pct', float('nan')):.3f}"
    )


# ---- sim: the GPU preset's layout --------------------------------------------------------------------------------
def gpu_settings(iterations: int, partial: dict[str, Any], budget: int, lag: str = "preset") -> Any:
    from asp.config import deep_merge, read_yaml
    from asp.runtime.config import RuntimeConfig

    raw = deep_merge(read_yaml(ROOT / "params.yaml"), read_yaml(ROOT / "configs/gpu-cluster.yaml"))
    runtime = dict(raw["runtime"])
    runtime.update(iterations=iterations, partial={**partial, "token_budget": budget})
    # the stall watchdog guards a real run; a sourced model's slow corner has minibatches of over 600 s
    runtime["control"] = {**runtime.get("control", {}), "stall_timeout_s": 1e6}
    if lag != "preset":
        runtime["queue"] = {**runtime["queue"], "max_policy_lag": None if lag == "none" else int(lag)}
    return RuntimeConfig(**runtime, seed=0).control_settings(), raw["schedule"]


def sim(
    iterations: int, budget: int, n_prompts: int, variants: list[str], lag: str, time_model: str | None = None
) -> dict[str, dict[str, float]]:
    from bench_sim import TAU, TRAIN, assumed_generation_model, synthetic_workload

    from asp.control.plan import WorkPlan
    from asp.schedule import condition_schedule, kendall_tau, perturb_predictions
    from asp.sim.engine import simulate
    from asp.sim.inputs import visits_needed
    from asp.sim.presets import get_preset

    preset = get_preset(time_model) if time_model else None
    gen, train = (preset.gen, preset.train) if preset else (assumed_generation_model(), TRAIN)
    model = f"the published-source preset {preset.name}" if preset else "continuous-batching model (assumed)"
    cfg0, sched = gpu_settings(iterations, {"enabled": False}, budget, lag)
    # a prompt visited again (a later pass, or generated again after a drop) draws its samples again
    ids, work = synthetic_workload(n_prompts, visits=visits_needed(iterations, cfg0.global_batch_prompts, n_prompts))
    true_mean = work.lengths.mean(axis=1)
    predicted, _ = perturb_predictions(true_mean, TAU, seed=0)
    print(
        f"\n## (sim) GPU preset layout: {cfg0.generation_units} GUs x {cfg0.actors_per_unit} actors, batch "
        f"{cfg0.global_batch_prompts} x n={cfg0.n_samples}, cap {cfg0.max_new_tokens}, q_max {cfg0.q_max}, "
        f"max_policy_lag {cfg0.max_policy_lag} ({cfg0.stale_samples}), {iterations} updates, budget {budget} tokens; "
        f"{model}; {n_prompts:,} synthetic prompts, Kendall tau "
        f"{kendall_tau(true_mean, predicted):.2f}\n"
    )
    plans = {}
    for cond in sorted({VARIANTS[name][0] for name in variants}):
        extra = {"iterations": 20_000, "method": "asp"} if cond == "C4" else {}
        schedule = condition_schedule(
            ids, predicted, cond, b=sched["b"], kappa=sched["kappa"], k=sched["k"], seed=0, **extra
        )
        plans[cond] = WorkPlan.from_schedule(schedule)
    rows = {}
    for name in variants:
        condition, partial = VARIANTS[name]
        cfg, _ = gpu_settings(iterations, partial, budget, lag)
        start = time.perf_counter()
        rows[name] = simulate(plans[condition], work, gen, train, cfg).metrics
        print(f"{name}: simulated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    table(
        rows, {"dropped q1/q2/q3/q4": by_bucket, "sim gen. util.": lambda m: f"{m['sim/generation_utilization']:.3f}"}
    )
    if preset is not None and "C4" in variants:
        sensitivity(rows, plans, work, preset, iterations, budget, variants, lag)
    return rows


def sensitivity(
    rows: dict[str, dict[str, float]],
    plans: dict[str, Any],
    work: Any,
    preset: Any,
    iterations: int,
    budget: int,
    variants: list[str],
    lag: str,
) -> None:
    """Each variant's mean iteration time over C4's, at the preset and its min-max over the sensitivity grid
    (`asp.sim.presets.SENSITIVITY_GRID`); each grid point's variants share its scaled models. Adds
    ``vs_c4_min`` / ``vs_c4_max`` to `rows`."""
    from asp.sim.engine import simulate
    from asp.sim.presets import SENSITIVITY_GRID, scaled_models

    key, drops = "runtime/summary/mean_iteration_time_s", "runtime/summary/stale_dropped_prompts"
    others = [n for n in variants if n != "C4"]
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    print(f"\n{preset.name}, per point of its sensitivity grid (prompts dropped by the lag bound in brackets)\n")
    print(f"| grid point | C4 mean iter (s) | {' | '.join(f'{n} / C4' for n in others)} |")
    print("|---|---|" + "---|" * len(others))
    for scale in SENSITIVITY_GRID:
        gen, train = scaled_models(preset.gen, preset.train, scale)
        runs = {}
        for name in variants:
            condition, partial = VARIANTS[name]
            cfg, _ = gpu_settings(iterations, partial, budget, lag)
            runs[name] = simulate(plans[condition], work, gen, train, cfg).metrics
        for name in variants:
            ratios[name].append(runs[name][key] / runs["C4"][key])
        cells = [f"{runs[n][key] / runs['C4'][key]:.3f}x ({runs[n].get(drops, 0):,.0f})" for n in others]
        point = ", ".join(f"{k} x{v:g}" for k, v in asdict(scale).items() if v != 1.0) or "preset"
        print(f"| {point} | {runs['C4'][key]:.1f} ({runs['C4'].get(drops, 0):,.0f}) | {' | '.join(cells)} |")
    print(
        f"\n{preset.name}: mean iteration over C4's, at the preset and across its {len(SENSITIVITY_GRID)}-point grid\n"
    )
    print("| variant | at the preset | min | max | faster than C4 at every point |")
    print("|---|---|---|---|---|")
    for name in variants:
        r = ratios[name]
        rows[name].update(vs_c4_min=min(r), vs_c4_max=max(r))
        at = rows[name][key] / rows["C4"][key]
        print(f"| {name} | {at:.3f}x | {min(r):.3f}x | {max(r):.3f}x | {'yes' if max(r) < 1 else 'no'} |")


def sim_demo(iterations: int, budget: int, variants: list[str]) -> dict[str, dict[str, float]]:
    """The demo's own layout in the simulator, with the simulate stage's models fitted on this machine's profile
    (static hf time model, processor sharing of `simulate.cores`, GRPO step times of `simulate.training`)."""
    from asp.config import load_params
    from asp.pipeline import simulate as stage

    base = load_params(ROOT / "params.yaml")
    models = stage.fit_models(base, stage.Paths())
    print(
        f"\n## (sim, demo layout) the simulate stage's fitted models ({models.gen.form}), {iterations} updates, "
        f"budget {budget} tokens\n"
    )
    rows = {}
    for name in variants:
        condition, partial = VARIANTS[name]
        params = demo_params(base, condition, partial, iterations, budget)
        params = params.model_copy(update={"simulate": base.simulate.model_copy(update={"conditions": [condition]})})
        rows[name] = stage.simulate_conditions(params, stage.Paths(), models)[condition].metrics
    table(
        rows, {"dropped q1/q2/q3/q4": by_bucket, "sim gen. util.": lambda m: f"{m['sim/generation_utilization']:.3f}"}
    )
    return rows


def _portable(value: Any) -> str:
    """An argument as the results file records it: a path by its name (no machine's folders in committed results)."""
    return value.name if isinstance(value, Path) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--skip-sim-demo", action="store_true", help="skip the simulator at the demo's layout")
    parser.add_argument("--demo-iterations", type=int, default=6, help="GRPO updates per demo run (default 6)")
    parser.add_argument("--demo-budget", type=int, default=48, help="tokens per response per call (demo cap 160)")
    parser.add_argument("--sim-iterations", type=int, default=30)
    parser.add_argument("--sim-budget", type=int, default=2048, help="tokens per response per call (cap 8,192)")
    parser.add_argument("--sim-prompts", type=int, default=8192, help="synthetic prompts (cycled)")
    parser.add_argument("--sim-lag", default="preset", help="max_policy_lag: preset (the GPU preset's 2), none or N")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS), help="(sim)")
    parser.add_argument(
        "--demo-variants", nargs="*", default=DEMO_DEFAULT, choices=list(VARIANTS), help="(demo; each ~2-3 min here)"
    )
    parser.add_argument(
        "--time-model",
        choices=list(PRESETS),
        default=None,
        help="(sim) a published-source GPU preset instead of bench_sim's assumed model, with its sensitivity range",
    )
    parser.add_argument("--json", type=Path, help="also write every run's summary metrics here")
    args = parser.parse_args()
    out: dict[str, Any] = {"args": {k: _portable(v) for k, v in vars(args).items()}}
    if not args.skip_sim:
        out["sim"] = sim(
            args.sim_iterations, args.sim_budget, args.sim_prompts, args.variants, args.sim_lag, args.time_model
        )
    if not args.skip_sim_demo:
        out["sim_demo"] = sim_demo(args.sim_iterations, args.demo_budget, args.variants)
    if not args.skip_demo:
        out["demo"] = demo(args.demo_iterations, args.demo_budget, args.demo_variants)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        clean = {
            part: {
                v: {k: float(x) for k, x in m.items() if isinstance(x, int | float | np.floating)}
                for v, m in rows.items()
            }
            for part, rows in out.items()
            if part != "args"
        }
        args.json.write_text(json.dumps({"args": out["args"], **clean}, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
