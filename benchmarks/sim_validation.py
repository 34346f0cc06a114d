"""The simulator against measured runs, side by side with the error per metric, in two settings:

* **Table 4(b)** (`benchmarks/launch_conditions.py`: simulated 0.5 s training steps, 30 iterations of 16 prompts,
  1 GU x 3 actors of the demo policy on this machine's cores), per schedule condition (default C0 and C4);
* **sync vs async** (`benchmarks/sync_vs_async.py`, the README's "ASP against the synchronous baseline": GRPO
  trainer, 1 GU x 2 actors, global batch 32, q_max 64, 30 updates): ``runtime.mode: sync`` + C0, async + C0 and
  async + C4. The simulator runs the same Control Unit core as the runtime (`asp.control`), sync rounds included.

Every table has the rows mean iteration time, generation time per minibatch, training time per step,
generation utilisation, policy lag, queue depth at arrival and padding, each measured / simulated / error.

The simulation sees only what the pipeline had measured before these runs: the generation-time model fitted on
metrics/profile_timings.csv, the length model fitted on the held-out profiled prompts, the schedule,
`simulate.cores` (CPU cores the actors share) and, for the GRPO trainer, the launch-fitted terms of `--fit-from`
(default ``outputs/launch``, the pipeline's own launch: global batch 16, 200 steps, async C4, so none of the runs
validated here): the training-time model (`asp.sim.timemodel.fit_training_model`: base + per token, the batch
size acting through its tokens) and the CPU-sharing factor of its generation calls (`fit_sharing_factor`). The
simulated trainer computes nothing (it sleeps), so the Table 4(b) runs keep sharing factor 1 (`simulate.cores`
alone). ``--no-fit`` simulates with params.yaml's ``simulate.training`` and sharing factor instead (the old
behaviour); either way the row "mean iteration time, params' terms" shows the old model beside the new.
Targets: error within 15 % on iteration, generation and training time; depth within 25 % (Table 4(b)). Needs the
pipeline outputs up to `schedule` (`make run` or `dvc repro schedule`) and, for the fit, a GRPO launch; writes
nothing under outputs/ and logs nothing. The measured side is wall-clock time (every measured column is a real
launch under Ray): run it on an otherwise idle machine, or report the load average it prints.

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
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from launch_conditions import measure as measure_4b
from launch_conditions import table_4b_params
from sync_vs_async import RUNS as SYNC_RUNS
from sync_vs_async import SETTING, bench_params, run_name
from sync_vs_async import measure as measure_sync

from asp.cli.plan import load_params_with
from asp.config import Params
from asp.env import set_offline_defaults
from asp.pipeline import simulate as stage

# the rows every table has (measured / simulated / error)
ROWS_COMMON = {
    "mean_iteration_time_s": "mean iteration time (s)",
    "generation_time_mean_s": "generation time / minibatch (s)",
    "train_step_mean_s": "training time / step (s)",
    "generation_utilization": "generation utilisation (Σ generation time / (actors × wall))",
    "policy_lag_mean": "policy lag mean (steps)",
    "depth_at_arrival_batches_mean": "queue depth at arrival (global batches)",
    "padding_rate_mean": "padding rate",
}
ROWS_4B = {
    **ROWS_COMMON,
    "mean_iteration_time_s_excl_first": "mean iteration time excl. first (s)",
    "queue_std_samples": "queue STD (samples)",
    "queue_max_samples": "queue max (samples)",
    "generation_time_std_s": "gen-time STD / minibatch (s)",
    "tokens_per_s": "tokens/s",
}
ROWS_SYNC = {
    **ROWS_COMMON,
    "policy_lag_max": "policy lag max (steps)",
    "tokens_per_s": "generated tokens/s",
    "wall_s": "run wall time (s)",
}
OLD_ROW = "mean iteration time (s), params' terms (simulate.training, sharing factor of params)"


@dataclass(frozen=True)
class Terms:
    """Launch-fitted terms for GRPO runs: `simulate.training` values and the CPU-sharing factor (None: params')."""

    training: dict[str, float] | None
    sharing_factor: float | None
    note: str


def fitted_terms(params: Params, fit_from: Path) -> Terms:
    """The training-time model and sharing factor fitted on the launch in `fit_from` (iterations.parquet and
    minibatches.parquet, made with `params`' n_samples) against the profile's generation-time fit."""
    from asp.sim.timemodel import fit_generation_model, fit_sharing_factor, fit_training_model

    iterations, minibatches = fit_from / "iterations.parquet", fit_from / "minibatches.parquet"
    for f in (iterations, minibatches):
        if not f.is_file():
            sys.exit(f"{f}: missing; run the launch stage (GRPO) first, or pass --no-fit")
    it = pd.read_parquet(iterations)
    train, treport = fit_training_model(it, n_samples=params.runtime.sampling.n_samples)
    paths = stage.Paths()
    timings = pd.read_csv(paths.timings)
    gen, _ = fit_generation_model(timings, stage.generation_form(params), folds=params.simulate.folds, seed=0)
    prompt_tokens = float(timings["prompt_tokens"].sum() / max(int(timings["num_prompts"].sum()), 1))
    factor, freport = fit_sharing_factor(pd.read_parquet(minibatches), gen, prompt_tokens)
    batch = int(it["train/prompts"].median()) if "train/prompts" in it else -1
    note = (
        f"launch-fitted terms from {fit_from} ({len(it)} steps, global batch {batch} prompts; not a run below): "
        f"training {train.step_base_s:.4g} s + {train.step_per_token_s:.4g} s/token (R² of the trailing means "
        f"{treport['r2_in_sample']:.2f}), sharing factor {factor:.3f} (per-call ratio IQR "
        f"{freport['ratio_q25']:.2f}-{freport['ratio_q75']:.2f}, {int(freport['minibatches'])} calls)"
    )
    training = {k: v for k, v in train.to_dict().items()}
    return Terms(training, factor, note)


def with_terms(p: Params, terms: Terms) -> Params:
    """`p` with the launch-fitted terms for a GRPO run (the simulated trainer computes nothing: unchanged)."""
    if p.runtime.trainer.kind != "grpo" or terms.training is None:
        return p
    training = p.simulate.training.model_copy(update=terms.training)
    update = {"training": training, "sharing_factor": terms.sharing_factor}
    return p.model_copy(update={"simulate": p.simulate.model_copy(update=update)})


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
    s = float(sim.get(f"runtime/summary/{key}", float("nan")))
    if measured is None:
        return f"- | {s:.4g} | -"
    m = float(measured.get(f"runtime/summary/{key}", float("nan")))
    return f"{m:.4g} | {s:.4g} | {error(m, s)}"


def table_4b(params: Params, conditions: list[str], iterations: int | None, measure: bool) -> None:
    print("Table 4(b) setting (simulated trainer: sharing factor 1; simulate.lengths: empirical, unless the row says)")
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
        print(
            f"{cond}: measured and simulated (simulation {wall:.2f} s, load {os.getloadavg()[0]:.1f})", file=sys.stderr
        )
        for key in ROWS_4B:
            cells[key].append(cell(real, sim, key))
    targets = {"mean_iteration_time_s": 0.15, "depth_at_arrival_batches_mean": 0.25}
    for key, label in ROWS_4B.items():
        target = targets.get(key)
        print(f"| {label} | {' | '.join(cells[key])} | {f'within {100 * target:.0f} %' if target else ''} |")
    print(f"| mean iteration time (s), lognormal lengths | {' | '.join(alt)} | |")


def table_sync(params: Params, iterations: int | None, measure: bool, terms: Terms) -> None:
    names = [run_name(*run) for run in SYNC_RUNS]
    print("sync-vs-async setting (benchmarks/sync_vs_async.py; simulate.lengths: empirical)")
    print(terms.note)
    print(f"| metric | {' | '.join(f'{n} measured | {n} simulated | error' for n in names)} |")
    print("|---|" + "---|---|---|" * len(names))
    cells: dict[str, list[str]] = {k: [] for k in ROWS_SYNC}
    old: list[str] = []
    for (mode, cond, partial), name in zip(SYNC_RUNS, names, strict=True):
        p = bench_params(params, mode, cond, iterations or SETTING["iterations"], partial)
        real = measure_sync(p) if measure else None
        sim, wall = simulated(with_terms(p, terms), cond)
        before, _ = simulated(p, cond)
        old.append(cell(real, before, "mean_iteration_time_s"))
        load = f"load {real['bench/load_start']:.1f}-{real['bench/load_end']:.1f}" if real else "not measured"
        print(f"{name}: measured ({load}) and simulated (simulation {wall:.2f} s)", file=sys.stderr)
        for key in ROWS_SYNC:
            cells[key].append(cell(real, sim, key))
    for key, label in ROWS_SYNC.items():
        print(f"| {label} | {' | '.join(cells[key])} |")
    print(f"| {OLD_ROW} | {' | '.join(old)} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conditions", nargs="*", default=["C0", "C4"], help="Table 4(b) conditions")
    parser.add_argument("--table", choices=["4b", "sync", "both"], default="both")
    parser.add_argument("--iterations", type=int, default=None, help="trainer steps of every run (default 30)")
    parser.add_argument("--simulate-only", action="store_true", help="skip the real launches (a quick smoke)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--preset", help="a preset of configs/ over the params (e.g. demo-vllm: vLLM actors)")
    parser.add_argument("--fit-from", default="outputs/launch", help="the launch the GRPO terms are fitted on")
    parser.add_argument("--no-fit", action="store_true", help="params' simulate.training and sharing factor")
    args = parser.parse_args(argv)
    set_offline_defaults()
    params = load_params_with(Path(args.params), args.preset, [])
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}", file=sys.stderr)
    if args.table in ("4b", "both"):
        table_4b(params, args.conditions, args.iterations, not args.simulate_only)
    if args.table in ("sync", "both"):
        if args.table == "both":
            print()
        no_fit = Terms(None, None, "params' simulate.training and sharing factor (--no-fit)")
        terms = no_fit if args.no_fit else fitted_terms(params, Path(args.fit_from))
        table_sync(params, args.iterations, not args.simulate_only, terms)


if __name__ == "__main__":
    main()
