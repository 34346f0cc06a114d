"""The simulator against measured runs, side by side with the error per metric, in two settings:

* **Table 4(b)** (`benchmarks/launch_conditions.py`: simulated 0.5 s training steps, 30 iterations of 16 prompts,
  1 GU x 3 actors of the demo policy on this machine's cores), per schedule condition (default C0 and C4);
* **sync vs async** (`benchmarks/sync_vs_async.py`, the README's "ASP against the synchronous baseline": GRPO
  trainer, 1 GU x 2 actors, global batch 32, q_max 64, 30 updates): ``runtime.mode: sync`` + C0, async + C0,
  async + C4, and async + C4 with partial rollouts. The simulator runs the same Control Unit core as the runtime
  (`asp.control`), sync rounds included.

Every table has the rows mean iteration time, generation time per minibatch (and its two factors: generated tokens
per minibatch, the lengths drawn and kept, and generation time per token, the time model), training time per step,
generation utilisation, policy lag, queue depth at arrival and padding, each measured / simulated / error.

The simulation sees only what the pipeline had measured before these runs: the generation-time model fitted on
metrics/profile_timings.csv, the length model fitted on the held-out profiled prompts, the schedule,
`simulate.cores` (CPU cores the actors share) and, for the GRPO trainer, the launch-fitted terms of `--fit-from`
(default ``outputs/launch``, the pipeline's own launch: global batch 16, 200 steps, async C4, so none of the runs
validated here), fitted by `asp.sim.sharing.fit_cpu_sharing` (what `asp simulate fit-training` prints): how the
engines and the trainer share the cores (the trainer's thread demand and a generation factor, from the launch's
own calls and steps) and the trainer's full-speed step time (base + per token). The Table 4(b) runs take the
generation factor (the same engines on the same machine); their simulated trainer computes nothing (it sleeps), so
it is not a sharer of the cores. ``--no-fit`` simulates with params.yaml's ``simulate`` terms instead; either way
the row "mean iteration time, params' terms" shows params.yaml's terms beside the fitted ones.
Targets: error within 15 % on iteration, generation and training time; depth within 25 % (Table 4(b)). Needs the
pipeline outputs up to `schedule` (`make run` or `dvc repro schedule`) and, for the fit, a GRPO launch; writes
nothing under outputs/ and logs nothing. The measured side is wall-clock time (every measured column is a real
launch under Ray): run it on an otherwise idle machine, or report the load average it prints. ``--keep DIR``
keeps each real GRPO run's tables and metrics; ``--measured-from DIR`` simulates against them again without
running them (a changed time model checked on the same measured runs). ``--trainer-threads X`` fixes the trainer's
demand on the cores instead of fitting it (the generation factor and training times are fitted under it): how much
of the fit's choice a launch actually pins down. ``--fit-from`` takes several launches (pooled), and ``--full-speed
launch`` fits full speed on them under the probe's slowdowns instead of taking the probe's processes alone.
``--leave-one-out`` (with ``--measured-from``) simulates each kept sync-table run with full speed fitted on the other
kept runs: fitted on other runs made minutes apart, where the probe may be further away in time than the machine's
drift allows. ``--measured-from`` takes several folders, repeats of the same runs (sittings apart, or one after
another): the measured side is then their mean with its range in brackets, the leave-one-out fit pools every repeat
of the other settings, and a last line gives the largest error on the three time rows and on how many of those
cells the simulated value lies inside the repeats' range (how far the machine itself moves). ``--probe FILE`` simulates
with another sharing probe than the stage's (the same runs under probes of other sittings: benchmarks/probe_spread.py).

    .venv/bin/python benchmarks/sim_validation.py                    # both tables: C0, C4; sync C0, async C0, C4
    .venv/bin/python benchmarks/sim_validation.py C0 C1 C2 C3 C4     # Table 4(b) for these conditions (and sync)
    .venv/bin/python benchmarks/sim_validation.py --table sync       # the sync-vs-async table only
    .venv/bin/python benchmarks/sim_validation.py --iterations 5 --simulate-only     # a quick smoke, no launch
    .venv/bin/python benchmarks/sim_validation.py --table sync --preset demo-vllm   # on vLLM actors (CPU build)
    .venv/bin/python benchmarks/sim_validation.py --table sync --keep runs/   # then --measured-from runs/
    .venv/bin/python benchmarks/sim_validation.py --table sync --measured-from runs/ --leave-one-out
    .venv/bin/python benchmarks/sim_validation.py --table sync --measured-from runs/ runs2/ runs3/ --leave-one-out
    .venv/bin/python benchmarks/sim_validation.py --table 4b --fit-from runs/* --full-speed launch
    .venv/bin/python benchmarks/sim_validation.py --table sync --measured-from runs/ --leave-one-out --probe p.json

Times on the idle 2-core machine: Table 4(b) C0 + C4 about 3 minutes, sync vs async about 7 minutes
(four GRPO launches of about 1.5 minutes each plus the simulations, a few seconds each).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from launch_conditions import measure as measure_4b
from launch_conditions import table_4b_params
from sync_vs_async import PARTIAL_RUN, SETTING, bench_params, run_name
from sync_vs_async import RUNS as SYNC_RUNS
from sync_vs_async import measure as measure_sync

from asp.cli.plan import load_params_with
from asp.config import Params
from asp.env import set_offline_defaults
from asp.errors import exit_user_error
from asp.io import read_json, write_json
from asp.pipeline import simulate as stage
from asp.sim.sharing import CpuSharing
from asp.sim.timemodel import TrainingTimeModel
from asp.steps.launch_check import with_token_split

# the rows every table has (measured / simulated / error)
ROWS_COMMON = {
    "mean_iteration_time_s": "mean iteration time (s)",
    "generation_time_mean_s": "generation time / minibatch (s)",
    "tokens_per_minibatch": "generated tokens / minibatch",  # generation time's two factors (`with_token_split`)
    "generation_time_per_token_s": "generation time / token (s)",
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
TIME_ROWS = ("mean_iteration_time_s", "generation_time_mean_s", "train_step_mean_s")  # the 15 % goal's rows
OLD_ROW = "mean iteration time (s), params.yaml's simulate terms (training, sharing factor, trainer threads)"


@dataclass(frozen=True)
class Terms:
    """Launch-fitted terms for GRPO runs: `simulate.training` values (full speed), the generation sharing factor
    and the trainer's thread demand on the shared cores (None: params')."""

    training: dict[str, float] | None
    sharing_factor: float | None
    trainer_threads: float | None
    note: str


def launch_tables(fit_from: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A kept launch's (minibatches, iterations) tables; exits with a message when one is missing."""
    iterations, minibatches = fit_from / "iterations.parquet", fit_from / "minibatches.parquet"
    for f in (iterations, minibatches):
        if not f.is_file():
            exit_user_error(f"{f}: missing; run the launch stage (GRPO) first, or pass --no-fit")
    return pd.read_parquet(minibatches), pd.read_parquet(iterations)


def pooled_fit(
    params: Params,
    launches: list[Path],
    fixed_trainer_threads: float | None,
    anchored: bool,
    paths: stage.Paths,
) -> tuple[CpuSharing, TrainingTimeModel, dict[str, float], pd.DataFrame]:
    """`asp.pipeline.simulate.fit_launch_sharing` on the kept launches' tables pooled, and their iterations
    (`paths`: the simulate stage's, the sharing probe's replaced by ``--probe``)."""
    tables = [launch_tables(d) for d in launches]
    sharing, train, report = stage.fit_launch_sharing(
        params,
        paths,
        [mb for mb, _ in tables],
        [it for _, it in tables],
        [params.runtime.sampling.n_samples] * len(tables),
        fixed_trainer_threads,
        anchored=anchored,
    )
    return sharing, train, report, pd.concat([it for _, it in tables])


def fitted_terms(
    params: Params,
    fit_from: list[Path],
    fixed_trainer_threads: float | None,
    among: list[Path] | None = None,
    full_speed: str = "probe",
    paths: stage.Paths | None = None,
) -> Terms:
    """The training-time model, sharing factor and trainer threads fitted on the launches in `fit_from` (each's
    iterations.parquet and minibatches.parquet, made with `params`' n_samples) against the profile's generation
    fit: `asp.pipeline.simulate.fit_launch_sharing`, what `asp simulate fit-training` prints. `full_speed`
    "launch" fits full speed on the launches even when the probe timed it (``anchored=False``)."""
    paths = paths or stage.Paths()
    sharing, train, report, it = pooled_fit(params, fit_from, fixed_trainer_threads, full_speed == "probe", paths)
    batch = int(it["train/prompts"].median()) if "train/prompts" in it else -1
    fixed = " (fixed)" if fixed_trainer_threads is not None else ""
    how = (
        f"the sharing probe's measured slowdowns ({paths.sharing_probe})"
        if report["contention"]
        else f"trainer threads {sharing.trainer_threads:g}{fixed}"
    )
    if report.get("anchored"):
        how += ": full speed is the probe's step and calls alone (the launch gives the refresh costs only)"
    inside = any(d.resolve().is_relative_to(a.resolve()) for d in fit_from for a in among or [])
    which = "among the runs below" if inside else "not a run below"
    note = (
        f"launch-fitted terms from {', '.join(map(str, fit_from))} ({len(it)} steps, global batch {batch} prompts; "
        f"{which}): "
        f"training at full speed {train.step_base_s:.4g} s + {train.step_per_token_s:.4g} s/token, {how}, "
        f"generation factor {sharing.generation_factor:.3f} (MdAPE of the "
        f"launch's calls {100 * report['mdape_generation']:.0f} %, steps {100 * report['mdape_training']:.0f} %, "
        f"{int(report['calls'])} calls)"
    )
    return Terms(train.to_dict(), sharing.generation_factor, sharing.trainer_threads, note)


def kept_folder(kept: Path, name: str) -> Path:
    """Where `--keep` puts a sync-table run (its name, spaces as underscores)."""
    return kept / name.replace(" ", "_")


def left_out_terms(
    params: Params, kept: list[Path], fixed_trainer_threads: float | None, paths: stage.Paths | None = None
) -> dict[str, Terms]:
    """Per sync-table run (by name), full speed (the training model and generation factor) fitted on the other runs
    kept under the `kept` folders (all repeats of the other settings), under the sharing probe's slowdowns rather
    than from the probe's processes alone: the runs are minutes apart, the probe may not be (``anchored=False``);
    the refresh costs come from the same runs."""
    names = [run_name(*run) for run in (*SYNC_RUNS, PARTIAL_RUN)]
    return {
        name: _left_out(
            params,
            [kept_folder(folder, n) for folder in kept for n in names if n != name],
            fixed_trainer_threads,
            len(kept),
            paths or stage.Paths(),
        )
        for name in names
    }


def _left_out(
    params: Params, others: list[Path], fixed_trainer_threads: float | None, repeats: int, paths: stage.Paths
) -> Terms:
    sharing, train, report, _ = pooled_fit(params, others, fixed_trainer_threads, False, paths)
    which = ", ".join(dict.fromkeys(d.name for d in others))
    if repeats > 1:
        which += f" ({repeats} repeats each)"
    note = (
        f"fitted on {which}: training at full speed {train.step_base_s:.4g} s + "
        f"{train.step_per_token_s:.4g} s/token, generation factor {sharing.generation_factor:.3f} (MdAPE of their "
        f"calls {100 * report['mdape_generation']:.0f} %, steps {100 * report['mdape_training']:.0f} %)"
    )
    return Terms(train.to_dict(), sharing.generation_factor, sharing.trainer_threads, note)


def with_terms(p: Params, terms: Terms) -> Params:
    """`p` with the launch-fitted terms (``simulate.full_speed: params``, so they are used as fitted): the generation
    factor for every run (the engines are this machine's), the training times and the trainer's demand for a GRPO run
    (the simulated trainer computes nothing)."""
    if terms.training is None:
        return p
    update: dict[str, object] = {"sharing_factor": terms.sharing_factor, "full_speed": "params"}
    if p.runtime.trainer.kind == "grpo":
        training = p.simulate.training.model_copy(update=terms.training)
        update.update(training=training, trainer_threads=terms.trainer_threads)
    return p.model_copy(update={"simulate": p.simulate.model_copy(update=update)})


def simulated(
    p: Params, condition: str, paths: stage.Paths, lengths: str = "empirical"
) -> tuple[dict[str, float], float]:
    """The simulator's ``runtime/summary/...`` for the run `p` describes (its ``runtime:``, mode included) on
    `condition`'s schedule (the stage's inputs at `paths`), and its wall seconds."""
    update = {"conditions": [condition], "lengths": lengths}
    p = p.model_copy(update={"simulate": p.simulate.model_copy(update=update)})
    t0 = time.perf_counter()
    result = stage.simulate_conditions(p, paths, stage.fit_models(p, paths))[condition]
    return result.metrics, time.perf_counter() - t0


def error(measured: float, sim: float) -> str:
    """The relative error in %, or the absolute difference where the measured value is 0 (a lag of 0)."""
    if measured == 0:
        return f"{sim - measured:+.3g} (abs.)"
    return f"{100 * (sim - measured) / measured:+.1f} %"


def measured_values(runs: list[dict[str, float]], key: str) -> list[float]:
    """``runtime/summary/<key>`` of each repeated measured run of one setting (nan where a run lacks it)."""
    return [float(with_token_split(r).get(f"runtime/summary/{key}", float("nan"))) for r in runs]


def cell(measured: list[dict[str, float]] | None, sim: dict[str, float], key: str) -> str:
    """'measured | simulated | error' (or '- | simulated | -' with --simulate-only); several repeated runs give
    their mean, with their range in brackets, and the error against the mean."""
    s = float(with_token_split(sim).get(f"runtime/summary/{key}", float("nan")))
    if not measured:
        return f"- | {s:.4g} | -"
    values = measured_values(measured, key)
    m = sum(values) / len(values)
    if len(values) > 1:
        return f"{m:.4g} ({min(values):.4g}-{max(values):.4g}) | {s:.4g} | {error(m, s)}"
    return f"{m:.4g} | {s:.4g} | {error(m, s)}"


def table_4b(
    params: Params, conditions: list[str], iterations: int | None, measure: bool, terms: Terms, paths: stage.Paths
) -> None:
    print(
        "Table 4(b) setting (simulated trainer: not a sharer of the cores; simulate.lengths: empirical, unless said)"
    )
    print(terms.note)
    print(f"| metric | {' | '.join(f'{c} measured | {c} simulated | error' for c in conditions)} | target |")
    print("|---|" + "---|---|---|" * len(conditions) + "---|")
    cells: dict[str, list[str]] = {k: [] for k in ROWS_4B}
    alt: list[str] = []
    for cond in conditions:
        p = table_4b_params(params, cond, iterations)
        real = [numeric(measure_4b(params, cond, iterations))] if measure else None
        sim, wall = simulated(with_terms(p, terms), cond, paths)
        other, _ = simulated(with_terms(p, terms), cond, paths, "lognormal")
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


def numeric(metrics: dict[str, object]) -> dict[str, float]:
    """A run's numeric metrics (not its notes, such as "not measured: runtime.heldout_problems is 0")."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def measured_sync(p: Params, name: str, keep: Path | None, measured_from: list[Path] | None) -> list[dict[str, float]]:
    """The real launch's metrics: run now (its tables and metrics kept under `keep`/<name> when given) or read
    back from each `measured_from`/<name>/metrics.json (runs kept earlier, to simulate against them again; several
    folders are repeats of the same runs)."""
    if measured_from:
        runs = []
        for folder in measured_from:
            f = kept_folder(folder, name) / "metrics.json"
            if not f.is_file():
                exit_user_error(f"{f}: missing; keep the runs first (--keep {folder})")
            runs.append(numeric(read_json(f)))
        return runs
    real = measure_sync(p, kept_folder(keep, name) if keep else None)
    numbers = numeric(real)
    if keep is not None:
        write_json(numbers, kept_folder(keep, name) / "metrics.json")  # atomic: a killed run leaves none, not half
    return [numbers]


def within_summary(
    measured: dict[str, list[dict[str, float]]], sims: dict[str, dict[str, float]], keys: tuple[str, ...] = TIME_ROWS
) -> str:
    """One line over the runs' time rows: the largest error against the repeats' mean, and on how many cells the
    simulated value lies inside the measured range (repeats only)."""
    errors, inside, cells = [], 0, 0
    for name, runs in measured.items():
        for key in keys:
            values, s = measured_values(runs, key), float(sims[name][f"runtime/summary/{key}"])
            m = sum(values) / len(values)
            if m > 0:
                errors.append(abs(s - m) / m)
            inside += int(min(values) <= s <= max(values))
            cells += 1
    repeats = min(len(r) for r in measured.values())
    line = f"largest error on iteration, generation and training time: {100 * max(errors, default=0.0):.1f} %"
    if repeats > 1:
        line += f"; simulated inside the range of {repeats} repeats on {inside} of {cells} of those cells"
    return line


def table_sync(
    params: Params,
    iterations: int | None,
    measure: bool,
    terms: Terms,
    paths: stage.Paths,
    keep: Path | None = None,
    measured_from: list[Path] | None = None,
    per_run: dict[str, Terms] | None = None,
) -> None:
    """The sync-vs-async table; with `per_run` (`left_out_terms`) each run is simulated with its own terms; with
    several `measured_from` folders (repeats) the measured side is their mean and range."""
    runs = (*SYNC_RUNS, PARTIAL_RUN)
    names = [run_name(*run) for run in runs]
    print("sync-vs-async setting (benchmarks/sync_vs_async.py; simulate.lengths: empirical)")
    if measured_from and len(measured_from) > 1:
        print(
            f"measured: the mean of {len(measured_from)} repeats ({', '.join(map(str, measured_from))}), "
            "their range in brackets; the error is against the mean"
        )
    if per_run is None:
        print(terms.note)
    else:
        print("leave-one-out: each run simulated with full speed fitted on the other runs (the probe's slowdowns)")
        for n in names:
            print(f"  {n}: {per_run[n].note}")
    print(f"| metric | {' | '.join(f'{n} measured | {n} simulated | error' for n in names)} |")
    print("|---|" + "---|---|---|" * len(names))
    cells: dict[str, list[str]] = {k: [] for k in ROWS_SYNC}
    old: list[str] = []
    reals: dict[str, list[dict[str, float]]] = {}
    sims: dict[str, dict[str, float]] = {}
    for (mode, cond, partial), name in zip(runs, names, strict=True):
        p = bench_params(params, mode, cond, iterations or SETTING["iterations"], partial)
        real = measured_sync(p, name, keep, measured_from) if measure else None
        sim, wall = simulated(with_terms(p, terms if per_run is None else per_run[name]), cond, paths)
        before, _ = simulated(p, cond, paths)
        old.append(cell(real, before, "mean_iteration_time_s"))
        if real:
            reals[name], sims[name] = real, sim
            loads = ", ".join(f"{r['bench/load_start']:.1f}-{r['bench/load_end']:.1f}" for r in real)
            load = f"load {loads}"
        else:
            load = "not measured"
        print(f"{name}: measured ({load}) and simulated (simulation {wall:.2f} s)", file=sys.stderr)
        for key in ROWS_SYNC:
            cells[key].append(cell(real, sim, key))
    for key, label in ROWS_SYNC.items():
        print(f"| {label} | {' | '.join(cells[key])} |")
    print(f"| {OLD_ROW} | {' | '.join(old)} |")
    if reals:
        print(within_summary(reals, sims))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conditions", nargs="*", default=["C0", "C4"], help="Table 4(b) conditions")
    parser.add_argument("--table", choices=["4b", "sync", "both"], default="both")
    parser.add_argument("--iterations", type=int, default=None, help="trainer steps of every run (default 30)")
    parser.add_argument("--simulate-only", action="store_true", help="skip the real launches (a quick smoke)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--preset", help="a preset of configs/ over the params (e.g. demo-vllm: vLLM actors)")
    parser.add_argument(
        "--fit-from", nargs="+", type=Path, default=[Path("outputs/launch")], help="launches to fit the terms on"
    )
    parser.add_argument(
        "--full-speed",
        choices=["probe", "launch"],
        default="probe",
        help="full speed from the sharing probe's processes alone (default) or fitted on the --fit-from launches",
    )
    parser.add_argument("--no-fit", action="store_true", help="params' simulate.training and sharing factor")
    parser.add_argument(
        "--trainer-threads", type=float, help="fix the trainer's demand on the cores instead of fitting it"
    )
    parser.add_argument("--keep", type=Path, help="sync table: keep each real run's tables and metrics here")
    parser.add_argument(
        "--measured-from",
        nargs="+",
        type=Path,
        help="sync table: simulate against runs kept by --keep (several folders: repeats, their mean and range)",
    )
    parser.add_argument(
        "--leave-one-out",
        action="store_true",
        help="sync table, with --measured-from: full speed fitted on the other kept runs, not the probe's",
    )
    parser.add_argument(
        "--probe",
        type=Path,
        help="the sharing probe to simulate with (default: the stage's, metrics/sharing_probe.json)",
    )
    args = parser.parse_args(argv)
    paths = stage.Paths()
    if args.probe is not None:
        if not args.probe.is_file():
            exit_user_error(f"--probe {args.probe}: no such file; `asp simulate probe-sharing --out FILE` writes one")
        paths = replace(paths, sharing_probe=args.probe)
    if args.leave_one_out and (args.measured_from is None or args.table != "sync"):
        parser.error("--leave-one-out needs --table sync and --measured-from DIR (runs kept by --keep)")
    set_offline_defaults()
    params = load_params_with(Path(args.params), args.preset, [])
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}", file=sys.stderr)
    no_fit = Terms(None, None, None, "params' simulate.training, sharing factor and trainer threads (--no-fit)")
    among = args.measured_from or ([args.keep] if args.keep else None)
    fit = not (args.no_fit or args.leave_one_out)  # leave-one-out fits per run: no launch needed
    terms = fitted_terms(params, args.fit_from, args.trainer_threads, among, args.full_speed, paths) if fit else no_fit
    if args.table in ("4b", "both"):
        table_4b(params, args.conditions, args.iterations, not args.simulate_only, terms, paths)
    if args.table in ("sync", "both"):
        if args.table == "both":
            print()
        per_run = (
            left_out_terms(params, args.measured_from, args.trainer_threads, paths) if args.leave_one_out else None
        )
        table_sync(
            params, args.iterations, not args.simulate_only, terms, paths, args.keep, args.measured_from, per_run
        )


if __name__ == "__main__":
    main()
