"""`asp simulate`: the `launch` run predicted on a simulated clock, for any params override, without a launch.

    asp simulate                                    # runtime: + simulate: of params.yaml, C0 and C4
    asp simulate -c C4 --set runtime.ray.actors_per_unit=4 --set schedule.k=6 --out sim-out
    asp simulate -c C0 --set runtime.mode=sync      # the synchronous baseline (rounds of one global batch, lag 0)
    asp simulate fit-training outputs/launch/iterations.parquet    # simulate.training + sharing_factor, a launch
    asp simulate fit-training run16/iterations.parquet run32/iterations.parquet   # + the per-sequence cost
    asp simulate probe-sharing                      # metrics/sharing_probe.json: engines + trainer on these cores

It needs the pipeline's outputs up to `schedule` (and metrics/profile_timings.csv); it fits the same models as
the `simulate` stage (`asp.pipeline.simulate`) and prints the Table 4(b) columns, lag, duty cycle and
utilizations per condition, then its error against the last launch when that launch ran the same setting
(dvc.lock's launch params; otherwise one line naming what differs). `--out DIR` also writes DIR/simulate.json
and DIR/timeline.png. Nothing under outputs/ or metrics/ is written and nothing is logged to MLflow (the stage
does that). Bad params or inputs exit 2 with one message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from asp.errors import UserError

if TYPE_CHECKING:
    from asp.config import Params
    from asp.sim.timemodel import TrainingTimeModel

app = typer.Typer(
    help="Simulate the launch run, async or sync (runtime.mode), with asp.sim from the pipeline's outputs.",
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

COLUMNS = {
    "mean_iteration_time_s": "mean iter (s)",
    "mean_iteration_time_s_excl_first": "mean iter excl. first (s)",
    "generation_time_mean_s": "gen time / mb (s)",
    "train_step_mean_s": "train step (s)",
    "iteration_time_trend": "trend (Spearman)",
    "queue_std_samples": "queue STD (samples)",
    "queue_max_samples": "queue max (samples)",
    "generation_time_std_s": "gen-time STD / mb (s)",
    "padding_rate_mean": "padding rate",
    "depth_at_arrival_batches_mean": "depth at arrival (batches)",
    "policy_lag_mean": "policy lag mean",
    "policy_lag_max": "policy lag max",
    "d_off_estimate": "d_off estimate",
    "duty_cycle": "duty cycle",
    "generation_utilization": "generation utilization",
    "training_utilization": "training utilization",
    "events": "events",
}

# Under a preset nothing on this machine checks the result; the ASP paper's own runs are the one check at GPU scale.
PRESET_GAIN_NOTE = (
    "note: a preset's scheduling gain (one condition against another) is the simulator's least-checked number: "
    "recomputing the ASP paper's runs (benchmarks/sim_paper.py) it lands their iteration times but finds much less "
    "than the paper's measured C4-over-C0 gain (docs/simulator.md, \"The paper's results, recomputed\")"
)


def load_with_overrides(params_path: Path, overrides: list[str], conditions: list[str]) -> Params:
    """params.yaml with `--set` overrides (and the conditions) applied and validated."""
    from asp.config import read_yaml, validate_params
    from asp.orchestration.request import parse_set_args, set_dotted

    values = parse_set_args(overrides)
    if conditions:
        values["simulate.conditions"] = list(conditions)
    raw = set_dotted(read_yaml(params_path), values) if values else read_yaml(params_path)
    source = str(params_path) + ("".join(f" + {k}={v}" for k, v in values.items()) if values else "")
    return validate_params(raw, source, overrides=values)


def markdown_table(metrics: dict[str, Any], conditions: list[str]) -> str:
    """The per-condition metrics of `asp.pipeline.simulate.run_metrics` as a Markdown table."""
    lines = ["| metric | " + " | ".join(conditions) + " |", "|---|" + "---|" * len(conditions)]
    for key, label in COLUMNS.items():
        cells = [f"{metrics[f'simulate/{c}/{key}']:.4g}" for c in conditions]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def range_table(
    metrics: dict[str, Any], ranges: dict[str, dict[str, tuple[float, float]]], conditions: list[str]
) -> str:
    """`markdown_table` with each cell's min-max (`ranges`: over a preset's sensitivity grid, or the sharing probe's
    intervals) beside its value."""
    lines = ["| metric | " + " | ".join(conditions) + " |", "|---|" + "---|" * len(conditions)]
    for key, label in COLUMNS.items():
        cells = []
        for c in conditions:
            full = next((k for k in ranges[c] if k.split("/")[-1] == key), None)
            low, high = ranges[c][full] if full is not None else (float("nan"), float("nan"))
            cells.append(f"{metrics[f'simulate/{c}/{key}']:.4g} [{low:.4g}-{high:.4g}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@app.callback(invoke_without_command=True)
def simulate_command(
    ctx: typer.Context,
    params: Annotated[Path, typer.Option("--params", "-p", help="params file")] = Path("params.yaml"),
    condition: Annotated[
        list[str] | None, typer.Option("--condition", "-c", help="C0..C4 (repeatable); default simulate.conditions")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="SECTION.KEY=VALUE override (repeatable)")] = None,
    out: Annotated[Path | None, typer.Option(help="also write simulate.json and timeline.png here")] = None,
) -> None:
    """Simulate `runtime:` over the schedule conditions and print the predicted run metrics."""
    if ctx.invoked_subcommand is not None:
        return
    from asp.io import write_json
    from asp.pipeline import simulate as stage
    from asp.plots import save_figure
    from asp.plots.sim import timeline_figure

    p = load_with_overrides(params, set_ or [], condition or [])
    if not p.simulate.enabled:
        raise UserError("simulate.enabled is false; pass --set simulate.enabled=true to simulate anyway.")
    paths = stage.Paths()
    models = stage.fit_models(p, paths)
    results = stage.simulate_conditions(p, paths, models)
    preset = stage.time_model_preset(p)
    probe = stage.probe_ranges(p, paths, models, results) if preset is None else None
    metrics = stage.run_metrics(models, results, probe)
    if preset is None:
        fit = models.gen_report
        typer.echo(
            f"generation-time model ({models.gen.form}): held-out R² {fit['r2_heldout']:.3f}, "
            f"MdAPE {100 * fit['mdape_heldout']:.1f} % over {int(fit['minibatches'])} profiled minibatches; "
            f"runtime.mode: {p.runtime.mode}"
        )
        for warning in stage.fit_warnings(p, paths, fit):
            typer.echo(warning, err=True)
        if probe is None:
            typer.echo(markdown_table(metrics, list(results)))
        else:
            typer.echo(
                f"Each cell: the simulated value [min-max with the sharing probe's slowdowns ({paths.sharing_probe}) "
                "at the ends of the range another sitting's probe falls in 9 times in 10: each one's "
                f"{100 * stage.PROBE_LEVEL:.0f} % interval over the probe's rounds, {stage.SITTING_WIDTH:g}x as wide]"
            )
            typer.echo(range_table(metrics, probe, list(results)))
    else:
        typer.echo(
            f"time model: preset {preset.name} ({preset.description}; published measurements, "
            f"extrapolated: {', '.join(preset.extrapolated) or 'none'}; docs/simulator.md); runtime.mode: "
            f"{p.runtime.mode}. Each cell: the preset's value [min-max over the sensitivity grid: decode x0.5-2, "
            "trainer x0.5-2, reload x0.5-4]"
        )
        typer.echo(range_table(metrics, stage.sensitivity_ranges(p, paths, models), list(results)))
        typer.echo(PRESET_GAIN_NOTE)
    _check_against_launch(p, params, {c: r.metrics for c, r in results.items()}, probe)
    if out is not None:
        write_json(metrics, out / "simulate.json")
        save_figure(timeline_figure({c: r.iterations for c, r in results.items()}), out / "timeline.png")
        typer.echo(f"wrote {out / 'simulate.json'} and {out / 'timeline.png'}", err=True)


def _check_against_launch(
    p: Params,
    params_path: Path,
    sims: dict[str, dict[str, float]],
    ranges: dict[str, dict[str, tuple[float, float]]] | None = None,
) -> None:
    """The simulator's error against the last launch of the same setting (or one line saying why there is none),
    with the simulated range beside a metric that has one (`ranges`: the sharing probe's, `probe_ranges`)."""
    from asp.pipeline import simulate as stage
    from asp.steps.launch_check import launch_errors

    if p.simulate.time_model != "fit":
        typer.echo(
            f"no launch to check against: the time model is the preset {p.simulate.time_model} (published GPU/NPU "
            "times), not this machine's"
        )
        return
    if params_path.resolve() != Path("params.yaml").resolve():
        typer.echo(f"no launch to check against: dvc.lock's launch ran params.yaml, not {params_path}")
        return
    found = stage.last_launch(p)
    if isinstance(found, str):
        typer.echo(found)
        return
    condition, measured = found
    if condition not in sims:
        typer.echo(f"no launch to check against: the last launch ran {condition}, not simulated here (-c {condition})")
        return
    typer.echo(f"against the last launch ({condition}, metrics/launch.json; same runtime/schedule/profile params):")
    typer.echo("| metric | measured | simulated | error |\n|---|---|---|---|")
    spans = (ranges or {}).get(condition, {})
    for key, label, m, s, err in launch_errors(sims[condition], measured):
        low, high = spans.get(f"runtime/summary/{key}", (None, None))
        span = f" [{low:.4g}-{high:.4g}]" if low is not None and high is not None else ""
        typer.echo(f"| {label} | {m:.4g} | {s:.4g}{span} | {100 * err:+.1f} % |")


@app.command("fit-training")
def fit_training(
    iterations: Annotated[
        list[Path] | None, typer.Argument(help="GRPO launches' iterations.parquet (default outputs/launch/...)")
    ] = None,
    params: Annotated[
        Path, typer.Option("--params", "-p", help="the launch's params file (runtime.grpo.device: where it trained)")
    ] = Path("params.yaml"),
    n_samples: Annotated[
        str | None,
        typer.Option(help="samples per prompt of each launch, comma-separated (default runtime.sampling.n_samples)"),
    ] = None,
) -> None:
    """Fit the Training Unit's times and the CPU sharing of the launches (generation sharing factor, the
    trainer's thread demand) and print them as a `simulate` params overlay.

    With each launch's minibatches.parquet (beside its iterations.parquet) and the profile's timings, the sharing
    is fitted from the launches' own calls and steps (`asp.sim.sharing.fit_cpu_sharing`) and the training times
    are the trainer's at full speed; otherwise the training times are fitted as measured. Several launches of
    different global batch sizes fit the trainer's per-sequence cost too; one launch fits the base and per-token
    costs."""
    import pandas as pd
    import yaml

    from asp.sim.timemodel import fit_training_model

    files = list(iterations or [Path("outputs/launch/iterations.parquet")])
    for f in files:
        if not f.is_file():
            raise UserError(f"{f}: not found. Run the launch stage with runtime.trainer.kind: grpo first.")
    p = load_with_overrides(params, [], [])
    counts = [p.runtime.sampling.n_samples] * len(files)
    if n_samples:
        try:
            counts = [int(v) for v in n_samples.split(",")]
        except ValueError:
            raise UserError(f"--n-samples {n_samples!r}: expected comma-separated integers, e.g. 8,8.") from None
    frames = [pd.read_parquet(f) for f in files]
    overlay: dict[str, Any] = {}
    fitted = _cpu_sharing(p, files, frames, counts)
    try:
        model, report = fitted if fitted is not None else fit_training_model(frames, n_samples=counts)
    except ValueError as exc:
        raise UserError(f"{', '.join(map(str, files))}: {exc}") from None
    if fitted is not None:
        overlay["sharing_factor"] = round(report["generation_factor"], 4)
        if not report["contention"]:  # measured sharing: the probe's slowdowns, no demand fitted
            overlay["trainer_threads"] = report["trainer_threads"]
    device = p.runtime.grpo.device
    overlay["training"] = {**model.to_dict(), "measured_on": "cuda" if device.startswith("cuda") else "cpu"}
    typer.echo(f"# from {', '.join(map(str, files))}: " + ", ".join(f"{k}={v:.4g}" for k, v in report.items()))
    if p.simulate.full_speed == "auto" and report.get("generation_anchored"):  # the probe timed calls alone
        typer.echo("# used under simulate.full_speed: params (auto takes full speed from the profile and the probe)")
    typer.echo(yaml.safe_dump({"simulate": overlay}, sort_keys=False).rstrip())


@app.command("probe-sharing")
def probe_sharing_command(
    params: Annotated[Path, typer.Option("--params", "-p", help="params file (runtime.engine, runtime.ray)")] = Path(
        "params.yaml"
    ),
    engines: Annotated[
        int | None, typer.Option(help="most engines decoding at once (default: the launch's actors + 1)")
    ] = None,
    repeats: Annotated[int, typer.Option(help="rounds: each times the baselines, then every setting")] = 10,
    call_prompts: Annotated[
        int | None,
        typer.Option(help="prompts per timed call, the profile's first ones (default: schedule.b, the minibatch)"),
    ] = None,
    out: Annotated[Path, typer.Option(help="where to write the probe")] = Path("metrics/sharing_probe.json"),
) -> None:
    """Measure how k = 1..ENGINES generation engines and a training step slow each other on this machine's cores
    (`asp.runtime.contention`) and write the slowdowns `simulate.sharing: measured` uses."""
    import datetime
    import platform

    from asp.io import write_json
    from asp.pipeline.simulate import Paths as SimPaths
    from asp.rollout.base import SamplingParams
    from asp.runtime.config import RuntimeConfig
    from asp.runtime.contention import probe_sharing
    from asp.steps.engine import engine_spec
    from asp.steps.loaders import policy_model_path
    from asp.steps.paths import LaunchPaths, ProfilePaths
    from asp.steps.probe_trainer import first_profile_prompts, timing_trainer_factory

    p = load_with_overrides(params, [], [])
    call_prompts = p.schedule.b if call_prompts is None else call_prompts  # the launch's calls are minibatches
    if repeats < 1 or call_prompts < 1 or (engines is not None and engines < 1):
        raise UserError(
            f"--engines, --repeats and --call-prompts must be >= 1, got {engines}, {repeats}, {call_prompts}."
        )
    runtime = RuntimeConfig.from_params(p)
    k = engines or runtime.total_actors + 1
    launch, sim = LaunchPaths(), SimPaths()
    if not sim.timings.is_file():
        raise UserError(f"{sim.timings}: not found. Run the profile stage first (`dvc repro profile`).")
    texts, answers = first_profile_prompts(ProfilePaths().prompts / "profile.parquet", call_prompts)
    s = p.runtime.sampling
    sampling = SamplingParams(s.n_samples, s.max_new_tokens, s.temperature, s.top_p, seed=0)
    model = policy_model_path(launch.policy)
    grpo = p.runtime.grpo
    # learning rate 0: every step trains the same weights on the same batch
    trainer = timing_trainer_factory(p, runtime, model, texts, answers)
    if getattr(trainer, "needs_process_group", False):  # as the Training Unit asks it (asp.runtime.trainer)
        raise UserError(
            "the sharing probe runs one Training Unit rank on this machine's cores; runtime.grpo.world_size "
            f"{grpo.world_size}, mixed_precision {grpo.mixed_precision!r} and cpu_offload {grpo.cpu_offload} need "
            "a process group: probe with world_size 1 and neither (CPU sharing is for the one-machine demo)."
        )
    typer.echo(
        f"probing 1..{k} {p.runtime.engine.kind} engines beside the GRPO Training Unit, {repeats} rounds, calls of "
        f"{len(texts)} prompts x {s.n_samples} samples ..."
    )
    try:
        result = probe_sharing(
            runtime,
            engine_spec(p.runtime, model),
            sampling,
            texts,
            trainer,
            max_engines=k,
            repeats=repeats,
            seed=p.common.seed,
        )
    except ValueError as exc:  # e.g. no training step fitted in a setting's window
        raise UserError(f"the sharing probe could not measure: {exc}") from None
    result.update(
        engine=p.runtime.engine.kind,
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs",
        date=datetime.date.today().isoformat(),
        command=f"asp simulate probe-sharing --engines {k} --repeats {repeats} --call-prompts {call_prompts}",
    )
    write_json(result, out)
    lines = ["| engines decoding | call, alone | call, beside training | training step |", "|---|---|---|---|"]
    for i, (row, step) in enumerate(zip(result["generation_slowdown"], result["training_slowdown"], strict=True)):
        lines.append(f"| {i + 1} | {row[0]:.2f}x | {row[1]:.2f}x | {step:.2f}x |")
    typer.echo("\n".join(lines))
    steps = result["alone_steps_s"]
    spread = max(steps) / min(steps) - 1.0
    typer.echo(
        f"the training step alone: {result['alone_step_s']:.3f} s (median of {len(steps)} rounds, "
        f"{min(steps):.3f}-{max(steps):.3f} s)"
    )
    if spread > 0.15:
        typer.echo(
            f"warning: the step alone varied by {100 * spread:.0f} % between rounds: this machine's speed drifted "
            "during the probe (other jobs, or a shared host). The slowdowns are ratios within a round, but the "
            "full-speed times are these medians: probe on an idle machine, close in time to the runs it predicts."
        )
    typer.echo(f"wrote {out}")


def _cpu_sharing(
    p: Params, files: list[Path], frames: list[Any], counts: list[int]
) -> tuple[TrainingTimeModel, dict[str, float]] | None:
    """(full-speed training model, report) of `asp.sim.sharing.fit_cpu_sharing` on the launches, or None (saying
    why) without shared cores, minibatch tables or timed profile."""
    import pandas as pd

    from asp.pipeline import simulate as stage

    paths = stage.Paths()
    tables = [f.with_name("minibatches.parquet") for f in files]
    if p.simulate.cores is None:
        typer.echo("# no CPU sharing fitted: simulate.cores is null (a device per actor)")
        return None
    if not all(t.is_file() for t in tables) or not paths.timings.is_file() or stage.untimed(paths):
        typer.echo(f"# no CPU sharing fitted: needs {paths.timings} (timed) and each launch's minibatches.parquet")
        return None
    try:
        _, model, report = stage.fit_launch_sharing(p, paths, [pd.read_parquet(t) for t in tables], frames, counts)
    except ValueError as exc:
        raise UserError(f"{', '.join(map(str, [*files, *tables]))}: {exc}") from None
    return model, report
