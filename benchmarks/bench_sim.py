"""Speed of the discrete-event simulator `asp.sim.engine.simulate` (simulated events per wall second).

Run:  .venv/bin/python benchmarks/bench_sim.py            (about 30 s; prints Markdown tables)
      .venv/bin/python benchmarks/bench_sim.py --quick    (smaller sizes, a few seconds)

(a) Paper-scale setting: 16 Generation Units x 8 actors (one device each), n = 8, b = 32, kappa = 2, k = 6,
    global batch 256 prompts, q_max 1,024 prompts, for conditions C0-C4 built with
    `asp.schedule.condition_schedule`: one pass over 30,720 prompts = 120 iterations (a whole pass, so the sorted
    conditions C1/C2 cannot stop before their longest minibatches). No max_policy_lag: 128 actors x 32 prompts in
    flight are 16 global batches, so a bound of a few steps would drop most of them. Target: all five simulations
    together < 10 s on one core.
(b) Long run: the C4 schedule cycled (the Database starts another pass when `iterations` needs it) for enough
    iterations that about 10^5 minibatches are generated. Target: < 60 s.

The workload is SYNTHETIC (no measured data): DeepScaleR-like response lengths with a per-prompt log-normal
median (median of medians 2,500 tokens, sigma 0.75) and per-sample log-normal spread around it (sigma 0.4),
rounded and capped at 8,192 tokens (a heavy right tail with a visible mass at the cap); prompt lengths
log-normal around 150 tokens. Predictions are the per-prompt mean realized length times log-normal noise whose
strength is bisected to Kendall tau ~ 0.7 (`asp.schedule.perturb_predictions`).

The time models are ASSUMPTIONS, not measurements (see `GEN_COEF` and `TRAIN`): a continuous-batching engine
(vLLM-like, TP = 1) with ~20 ms per decode step plus 40 us per active sequence per step (~30 ms per step at
256 sequences), 10 us per prefill token, 2 ns per attended KV position and 1 s per call; a trainer at 2 s +
1.2 us per response token per step, 1 s save + 1 s convert per snapshot and 3 s reload per actor. They put
generation and training in the same range so the conditions differ; they say nothing about a real cluster.

Schedule building (DP + balancing, with a short annealing of `ANNEAL_ITERATIONS` proposals) is timed
separately from the simulation. The script imports only asp.sim / asp.runtime / asp.schedule (no Ray); it
prints ``'ray' in sys.modules`` at the end as a check.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from asp.control.plan import WorkPlan
from asp.control.settings import ControlSettings
from asp.runtime.config import RuntimeConfig
from asp.schedule import CONDITION_NAMES, condition_schedule, kendall_tau, perturb_predictions
from asp.sim.engine import Workload, simulate
from asp.sim.timemodel import FEATURES, GenerationTimeModel, TrainingTimeModel

CAP = 8192
N_SAMPLES, B, KAPPA, K = 8, 32, 2, 6
BATCH = 256
TAU = 0.7
ANNEAL_ITERATIONS = 20_000
# continuous form: intercept (s), decode_steps (s/step), generated_tokens (s/token), prefill_tokens (s/token),
# kv_reads (s/position) -- assumptions, see the module docstring
GEN_COEF = {
    "intercept": 1.0,
    "decode_steps": 0.020,
    "generated_tokens": 4e-5,
    "prefill_tokens": 1e-5,
    "kv_reads": 2e-9,
}
TRAIN = TrainingTimeModel(
    step_base_s=2.0, step_per_token_s=1.2e-6, save_s=1.0, convert_s=1.0, load_s=3.0, step_per_sample_s=0.0
)


def assumed_generation_model() -> GenerationTimeModel:
    """The continuous (vLLM-like) generation-time model of `GEN_COEF` (an assumption, see the module docstring)."""
    return GenerationTimeModel(
        "continuous", tuple(GEN_COEF[f] for f in FEATURES["continuous"]), FEATURES["continuous"]
    )


def synthetic_workload(n_prompts: int, seed: int = 0, visits: int = 1) -> tuple[np.ndarray, Workload]:
    """(prompt ids, workload) of `n_prompts` prompts with N_SAMPLES synthetic lengths each (module docstring); with
    `visits` > 1 a prompt's later visits keep its median and draw its samples again (`Workload.revisits`)."""
    rng = np.random.default_rng([seed, 0xB5])
    medians = np.log(2500.0) + 0.75 * rng.standard_normal(n_prompts)

    def draw(r: np.random.Generator) -> np.ndarray:
        lengths = np.exp(medians[:, None] + 0.4 * r.standard_normal((n_prompts, N_SAMPLES)))
        return np.clip(np.round(lengths), 16, CAP).astype(np.int32)

    lengths = draw(rng)
    prompt_tokens = np.clip(np.round(rng.lognormal(np.log(150.0), 0.5, n_prompts)), 20, 1024).astype(np.int32)
    later = np.random.default_rng([seed, 0xB5, 1])
    revisits = np.stack([draw(later) for _ in range(1, visits)]) if visits > 1 else None
    ids = np.arange(n_prompts)
    return ids, Workload.from_arrays(ids, lengths, prompt_tokens, max_new_tokens=CAP, revisits=revisits)


def runtime_config(iterations: int | None) -> ControlSettings:
    """The paper-scale setting as the simulator's `ControlSettings` (the runtime params' defaults otherwise)."""
    return RuntimeConfig(
        global_batch_prompts=BATCH,
        iterations=iterations,
        sampling={"n_samples": N_SAMPLES, "max_new_tokens": CAP},
        queue={"gu_queue_target": 6, "q_max": 4 * BATCH, "max_policy_lag": None},
        ray={"generation_units": 16, "actors_per_unit": 8},
    ).control_settings()


def build_plans(ids: np.ndarray, predicted: np.ndarray) -> tuple[dict[str, WorkPlan], dict[str, float]]:
    plans, seconds = {}, {}
    for c in CONDITION_NAMES:
        start = time.perf_counter()
        extra = {"iterations": ANNEAL_ITERATIONS, "method": "asp"} if c == "C4" else {}
        schedule = condition_schedule(ids, predicted, c, b=B, kappa=KAPPA, k=K, seed=0, **extra)
        plans[c] = WorkPlan.from_schedule(schedule)
        seconds[c] = time.perf_counter() - start
    return plans, seconds


def timed_simulation(plan: WorkPlan, work: Workload, gen: GenerationTimeModel, cfg: ControlSettings):
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(plan, work, gen, TRAIN, cfg)
    return result, time.perf_counter() - wall, time.process_time() - cpu


A_COLUMNS = (
    "cond", "plan minibatches", "build s", "iterations", "mean iter s (sim)", "excl. first", "queue STD (samples)",
    "padding", "minibatches", "events", "wall s", "cpu s", "events/s",
)  # fmt: skip


def describe_workload(work: Workload, nu: float, tau: float) -> str:
    flat = work.lengths.ravel()
    return (
        f"Synthetic lengths: median {np.median(flat):,.0f}, mean {flat.mean():,.0f}, "
        f"p99 {np.percentile(flat, 99):,.0f}, at cap {np.mean(flat >= CAP):.1%}; "
        f"predictions: noise nu = {nu:.3f}, Kendall tau = {tau:.3f}."
    )


def a_row(c: str, plan: WorkPlan, build_s: float, r, wall: float, cpu: float) -> str:
    m = {k.removeprefix("runtime/summary/"): v for k, v in r.metrics.items()}
    cells = (
        c, f"{plan.n_minibatches:,}", f"{build_s:.2f}", f"{len(r.iterations)}", f"{m['mean_iteration_time_s']:.2f}",
        f"{m['mean_iteration_time_s_excl_first']:.2f}", f"{m['queue_std_samples']:,.0f}",
        f"{m['padding_rate_mean']:.3f}", f"{m['minibatches']:,.0f}", f"{r.events:,}", f"{wall:.2f}", f"{cpu:.2f}",
        f"{r.events / wall:,.0f}",
    )  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def part_a(n_prompts: int, gen: GenerationTimeModel) -> tuple[dict[str, WorkPlan], Workload]:
    ids, work = synthetic_workload(n_prompts)
    true_mean = work.lengths.mean(axis=1)
    predicted, nu = perturb_predictions(true_mean, TAU, seed=0)
    sub = np.random.default_rng(1).choice(n_prompts, min(n_prompts, 20_000), replace=False)
    tau = kendall_tau(true_mean[sub], predicted[sub])
    print(f"\n## (a) 16 GUs x 8 actors, {n_prompts:,} prompts x n={N_SAMPLES}, batch {BATCH}, one pass\n")
    print(describe_workload(work, nu, tau) + "\n")
    plans, build_s = build_plans(ids, predicted)
    cfg = runtime_config(None)
    rows, total_wall, total_cpu = [], 0.0, 0.0
    for c, plan in plans.items():
        r, wall, cpu = timed_simulation(plan, work, gen, cfg)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        rows.append(a_row(c, plan, build_s[c], r, wall, cpu))
    print("| " + " | ".join(A_COLUMNS) + " |")
    print("|---|" + "---:|" * (len(A_COLUMNS) - 1))
    print("\n".join(rows))
    verdict = "met" if total_wall < 10 else "MISSED"
    print(f"\nAll five simulations: {total_wall:.2f} s wall, {total_cpu:.2f} s CPU (target < 10 s: {verdict}).")
    return plans, work


def part_b(plan: WorkPlan, work: Workload, gen: GenerationTimeModel, minibatches: int) -> None:
    iterations = math.ceil(minibatches * plan.n_prompts / plan.n_minibatches / BATCH)
    r, wall, cpu = timed_simulation(plan, work, gen, runtime_config(iterations))
    done = r.metrics["runtime/summary/minibatches"]
    verdict = "met" if wall < 60 else "MISSED"
    print(f"\n## (b) C4 schedule cycled for {iterations:,} iterations (target ~{minibatches:,} minibatches)\n")
    print("| iterations | minibatches | events | simulated h | wall s | cpu s | events/s | minibatches/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {iterations:,} | {done:,.0f} | {r.events:,} | {r.metrics['sim/simulated_s'] / 3600:,.1f} | {wall:.1f} "
        f"| {cpu:.1f} | {r.events / wall:,.0f} | {done / wall:,.0f} |"
    )
    print(f"\nTarget < 60 s: {verdict}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a few seconds)")
    parser.add_argument("--skip-long", action="store_true", help="only part (a)")
    args = parser.parse_args()
    n_prompts, long_minibatches = (3_072, 5_000) if args.quick else (120 * BATCH, 100_000)
    gen = assumed_generation_model()
    print(f"Generation model (assumed): {GEN_COEF}; training model (assumed): {TRAIN.to_dict()}")
    plans, work = part_a(n_prompts, gen)
    if not args.skip_long:
        part_b(plans["C4"], work, gen, long_minibatches)
    print(f"\n'ray' in sys.modules: {'ray' in sys.modules}")


if __name__ == "__main__":
    main()
