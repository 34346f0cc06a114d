"""Runtime overhead benchmark (issue 5): dispatch -> generate -> ingest -> Training Queue, in minibatches/s.

Run:  .venv/bin/python benchmarks/bench_runtime.py              (about a minute; prints a Markdown table)
      .venv/bin/python benchmarks/bench_runtime.py --quick      (fewer minibatches)
      .venv/bin/python benchmarks/bench_runtime.py --ablation   (C0 vs C4 through the runtime, stand-in decode)

The engine is `StandInEngine` with no sleep (a response costs a few Python list operations), so the
numbers measure the runtime's own path: Database -> Generation Sender -> GU input queue -> actor call ->
columnar packing -> GU report -> Ingestor -> Training Queue -> simulated trainer (0 s steps). Throughput
is ingested minibatches divided by the time between the first and the last arrival (Ray start-up and
actor creation excluded); the whole-run rate including the first iteration is shown next to it.

``--ablation`` is an illustration, not a measurement of a model: the stand-in engine sleeps
``seconds_per_token * longest response`` per minibatch (padded decoding) with DeepScaleR-like synthetic
lengths, and the same prompts run as C0 (fixed minibatches, original order) and C4 (ASP schedule from
predictions at Kendall tau ~ 0.6), printing the Table 4(b) columns side by side.
"""

from __future__ import annotations

import argparse
import os
import time

from asp.runtime import EngineSpec, RuntimeConfig, WorkPlan, run_async
from asp.trainers import make_trainer_factory


def bench(
    n_minibatches: int, prompts_per_mb: int, n: int, units: int, actors: int, max_len: int, coalesce_s: float = 0.05
) -> dict[str, float]:
    """Run one configuration; return throughput numbers."""
    total = n_minibatches * prompts_per_mb
    prompts = {i: f"bench prompt {i}" for i in range(total)}
    mbs = [list(range(i, i + prompts_per_mb)) for i in range(0, total, prompts_per_mb)]
    plan = WorkPlan.from_lists(mbs, [p // 6 for p in range(n_minibatches)])
    cfg = RuntimeConfig(
        global_batch_prompts=64 * prompts_per_mb,
        iterations=None,
        sampling={"n_samples": n, "max_new_tokens": max_len},
        queue={"gu_queue_target": 8, "q_max": 10**9, "coalesce_below_s": coalesce_s, "max_policy_lag": None},
        control={"poll_timeout_s": 0.5},
        ray={"generation_units": units, "actors_per_unit": actors, "actor_num_cpus": 0.0},
        trainer={"step_s": 0.0, "refresh_delay_s": 0.0},
    )
    engine = EngineSpec("standin", options={"min_length": max(1, max_len // 2), "max_length": max_len})
    start = time.perf_counter()
    summary = run_async(plan, prompts, engine, cfg, trainer_factory=make_trainer_factory("simulated", cfg))
    wall = time.perf_counter() - start
    arrivals = [r["arrival_s"] for r in summary.minibatches]
    span = max(arrivals) - min(arrivals)
    return {
        "minibatches": len(arrivals),
        "steady_mb_per_s": (len(arrivals) - 1) / span if span > 0 else float("nan"),
        "run_mb_per_s": len(arrivals) / summary.metrics["runtime/summary/wall_s"],
        "samples_per_s": (len(arrivals) - 1) * prompts_per_mb * n / span if span > 0 else float("nan"),
        "wall_s_incl_startup": wall,
    }


TABLE_4B = (
    ("mean_iteration_time_s", "Mean iteration time (s)"),
    ("mean_iteration_time_s_excl_first", "Mean iteration time excl. first (s)"),
    ("iteration_time_trend", "Iteration-time trend (Spearman)"),
    ("queue_std_samples", "Training Queue STD (samples)"),
    ("queue_max_samples", "Training Queue maximum (samples)"),
    ("generation_time_std_s", "Generation-time STD per minibatch (s)"),
    ("padding_rate_mean", "Realized padding rate"),
)


def ablation(n_prompts: int = 3072, seed: int = 0) -> None:
    """C0 vs C4 through the runtime with a stand-in decode time (see module docstring)."""
    from asp.schedule import build_schedule, fixed_minibatches, perturb_predictions, synthetic_lengths

    true = synthetic_lengths(n_prompts, seed=seed)
    pred, _ = perturb_predictions(true, 0.6, seed)
    prompts = {i: f"prompt {i}" for i in range(n_prompts)}
    engine = EngineSpec(
        "standin",
        options={
            "lengths": {prompts[i]: int(true[i]) for i in range(n_prompts)},
            "seconds_per_token": 2e-5,
            "seconds_per_call": 0.005,
            "jitter": 0.1,
        },
    )
    ends = fixed_minibatches(n_prompts, 16)
    c0 = WorkPlan.from_lists(
        [list(range(a, b)) for a, b in zip(ends[:-1], ends[1:], strict=True)], [p // 6 for p in range(ends.size - 1)]
    )
    c4 = build_schedule(
        list(range(n_prompts)), pred, b=16, kappa=2, k=6, iterations=2_000_000, seed=seed, method="asp"
    )
    cfg = RuntimeConfig(
        global_batch_prompts=64,
        seed=seed,
        iterations=None,
        sampling={"n_samples": 4, "max_new_tokens": 8192},
        queue={"gu_queue_target": 6, "q_max": 192, "max_policy_lag": None},
        ray={"generation_units": 2, "actors_per_unit": 2, "actor_num_cpus": 0.0},
        trainer={"step_s": 0.1, "refresh_delay_s": 0.02},
    )
    results = {
        name: run_async(plan, prompts, engine, cfg, trainer_factory=make_trainer_factory("simulated", cfg)).metrics
        for name, plan in (("C0", c0), ("C4", c4))
    }
    print(f"{n_prompts} prompts, 16-prompt minibatches, n=4, 2 GUs x 2 actors, 64-prompt steps of 0.1 s\n")
    print("| metric | C0 | C4 |\n|---|---|---|")
    for key, label in TABLE_4B:
        c0v, c4v = (results[c][f"runtime/summary/{key}"] for c in ("C0", "C4"))
        print(f"| {label} | {c0v:.3f} | {c4v:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer minibatches")
    parser.add_argument("--ablation", action="store_true", help="C0 vs C4 with a stand-in decode time instead")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    if args.ablation:
        try:
            ablation()
        finally:
            ray.shutdown()
        return
    count = 2000 if args.quick else 8000
    configs = [  # (prompts per minibatch, n, GUs, actors per GU, max response tokens, coalesce_below_s)
        (8, 4, 1, 2, 16, 0.05),
        (8, 4, 2, 2, 16, 0.05),
        (32, 8, 2, 2, 16, 0.05),
        (8, 4, 2, 2, 16, 0.0),
    ]
    print(f"machine: {os.cpu_count()} CPUs; {count} minibatches per row; StandInEngine (no sleep)\n")
    print(
        "| prompts/mb | n | GUs x actors | tokens/sample | coalesce | steady mb/s | whole-run mb/s | samples/s |",
        end="",
    )
    print(" wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for p, n, units, actors, max_len, coalesce in configs:
            r = bench(count, p, n, units, actors, max_len, coalesce)
            print(
                f"| {p} | {n} | {units} x {actors} | <= {max_len} | {'on' if coalesce else 'off'} | "
                f"{r['steady_mb_per_s']:.0f} | "
                f"{r['run_mb_per_s']:.0f} | {r['samples_per_s']:.0f} | {r['wall_s_incl_startup']:.1f} |",
                flush=True,
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
