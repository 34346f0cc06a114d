"""`asp schedule build|ablation|sweep`: schedule a dataset or evaluate the scheduler from a lengths file.

Examples:
    asp schedule build preds.parquet --out schedule.parquet --b 32 --kappa 2 --k 6
    asp schedule ablation lengths.csv --tau 0.64 --seeds 3
    asp schedule ablation preds.csv --cross-fit 5 --b 16 --k 4   # a predictor's loads, cross-fitted
    asp schedule sweep --synthetic 39000 --out sweep.json        # ends with where C4 stops beating C0

Mounted by asp.cli as `asp schedule`; runnable alone as `python -m asp.cli.schedule`. Bad input prints one
message on stderr and exits with code 2, writing nothing: `build` checks its output paths and formats before it
computes and rejects lengths that are not in (0, 1e15]; all three refuse a dataset that cannot be cut into
minibatches of b..b+kappa prompts unless --allow-partial is given (the message names the b and kappa that would
work), and --seeds / --synthetic must be >= 1.
numpy, pandas, numba and the scheduler itself are imported inside the commands, so `asp --help` and
`asp schedule --help` stay fast. Scheduler flags left out (None) take the paper's settings,
`asp.schedule.PAPER_SPEC` (and `PAPER_TAUS`); the help texts state them and tests/schedule/test_cli.py checks
that they agree. (The pipeline's `schedule` stage takes the `schedule:` params instead.)
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer

from asp.errors import UserError

if TYPE_CHECKING:
    import numpy as np

    from asp.schedule.spec import ScheduleSpec

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    help="Length-aware rollout scheduling (ASP steps 2-3): build schedules, run C0-C4 ablations.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

# Scheduler flags: None means "PAPER_SPEC's value", which show_default states (checked by a test).
B = Annotated[int | None, typer.Option("--b", help="Base minibatch size (prompts).", show_default="32")]
KAPPA = Annotated[
    int | None, typer.Option("--kappa", help="Extra minibatch size allowed: sizes b..b+kappa.", show_default="2")
]
K = Annotated[int | None, typer.Option("--k", help="Minibatches per batch group.", show_default="6")]
ITERS = Annotated[int | None, typer.Option("--iterations", help="Annealing proposals.", show_default="2000000")]
METHOD = Annotated[
    str | None,
    typer.Option("--method", help="Balancing: asp, paper_sa, kk, lpt, snake or sorted.", show_default="asp"),
]
TAUS = Annotated[
    str | None,
    typer.Option(help="Comma-separated Kendall tau targets.", show_default="1.0,0.75,0.64,0.5,0.25,0.0"),
]
SEEDS = Annotated[int, typer.Option("--seeds", min=1, help="Number of seeds (0..N-1) to average over.")]
ALLOW_PARTIAL = Annotated[
    bool,
    typer.Option(
        "--allow-partial",
        help="Accept n prompts that cannot be cut into minibatches of b..b+kappa prompts (e.g. n < b): one "
        "minibatch then holds fewer than b prompts and the summary says feasible: false. Without it such "
        "input is an error that names the b and kappa that would work.",
    ),
]
SYNTH = Annotated[int | None, typer.Option("--synthetic", min=1, help="Use N synthetic DeepScaleR-like lengths.")]
ORDER = Annotated[
    str,
    typer.Option(
        "--order",
        help="The prompts' order per seed: shuffled (a seeded permutation: C0's minibatches vary with the seed) or "
        "given (the file's order in every seed).",
    ),
]
INPUT = Annotated[Path | None, typer.Argument(help="Parquet/CSV/JSON/JSONL with length columns.")]


_LOCAL_FORMAT = {
    "tau_measured": "{:.3f}".format,
    "MAE": "{:.0f}".format,
    **{f"D_{c}": "{:.0f}".format for c in ("C0", "C1", "C2-C4")},
    **{f"P_{c}": "{:.3f}".format for c in ("C0", "C1", "C2-C4")},
}


def _user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn UserError/ValueError into one stderr line and exit code 2 (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (UserError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def _spec(b: int | None, kappa: int | None, k: int | None, iterations: int | None, method: str | None) -> ScheduleSpec:
    """The ScheduleSpec of the given flags; flags left out keep the paper's (`PAPER_SPEC`). ValueError on a bad
    value."""
    from asp.schedule.spec import PAPER_SPEC

    given: dict[str, Any] = {"b": b, "kappa": kappa, "k": k, "iterations": iterations, "method": method}
    return replace(PAPER_SPEC, **{name: value for name, value in given.items() if value is not None})


def _source(path: Path | None, synthetic: int | None) -> str:
    """What the lengths came from, for messages: the file, or `--synthetic N`."""
    return str(path) if path is not None else f"--synthetic {synthetic}"


def _true_lengths(path: Path | None, synthetic: int | None, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(true lengths, the file's predicted lengths or None) of a lengths file or `--synthetic N`."""
    from asp.io.schedule import read_lengths
    from asp.schedule.ablation import synthetic_lengths

    if synthetic is not None and path is None:
        return synthetic_lengths(synthetic, seed), None
    if path is None or synthetic is not None:
        raise UserError("give exactly one of a lengths file or --synthetic N")
    data = read_lengths(path, need_predictions=False)
    if data["true_length"] is None:
        raise UserError(f"{path}: needs a 'true_length' or 'length' column for this command")
    return data["true_length"], data["predicted_length"]


@app.command()
@_user_errors
def build(
    input: Annotated[Path, typer.Argument(help="Predictions: prompt_id, predicted_length[, true_length].")],
    out: Annotated[Path, typer.Option(help="Schedule Parquet (one row per prompt).")] = Path("schedule.parquet"),
    summary: Annotated[Path | None, typer.Option(help="JSON summary; default: OUT with .json.")] = None,
    b: B = None,
    kappa: KAPPA = None,
    k: K = None,
    iterations: ITERS = None,
    seed: Annotated[
        int | None, typer.Option(help="Balancing / shuffle seed (default: common.seed's default).")
    ] = None,
    method: METHOD = None,
    loads: Annotated[
        str | None, typer.Option(help="raw or calibrated (default: calibrated iff --calibration).")
    ] = None,
    calibration: Annotated[Path | None, typer.Option(help="Knots JSON {x, y} or table x,y.")] = None,
    shuffle: Annotated[bool, typer.Option(help="Shuffle whole batch groups.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Also save the Figure-7 style plot (format from the suffix: png, pdf, svg...).")
    ] = None,
    allow_partial: ALLOW_PARTIAL = False,
) -> None:
    """Build a schedule from predicted lengths and write it (Parquet + JSON summary [+ plot]).

    Every output path and format is checked before anything is computed, and the outputs are written together
    (temporary files renamed at the end): on any error nothing is written.
    """
    from asp import io
    from asp.config import SEED
    from asp.io.schedule import read_calibration, read_lengths
    from asp.schedule.schedule import build_schedule, schedule_summary, schedule_to_frame

    spec = _spec(b, kappa, k, iterations, method)
    outputs = _check_outputs(out, summary or out.with_suffix(".json"), plot)
    data = read_lengths(input, need_predictions=True)
    predicted = data["predicted_length"]
    assert predicted is not None  # need_predictions: read_lengths refuses a file without them
    _check_feasible(len(data["prompt_id"]), spec, str(input), allow_partial)
    cal = read_calibration(calibration) if calibration else None
    sched = build_schedule(
        data["prompt_id"],
        predicted,
        **spec.kwargs(),
        seed=SEED if seed is None else seed,
        calibration=cal,
        loads=loads,
        shuffle=shuffle,
        on_infeasible="short" if allow_partial else "error",
    )
    info = schedule_summary(sched, data["true_length"])
    figure = None
    if plot is not None:
        from asp.plots.schedule import plot_schedule

        figure = plot_schedule(sched, data["true_length"])
    _write_build(outputs, schedule_to_frame(sched), io.json_text(info), figure)
    pm = info["predicted"]
    typer.echo(
        f"{sched.n_prompts} prompts -> {sched.n_minibatches} minibatches, {sched.n_groups} groups; "
        f"predicted padding {pm['P']:.3f}, group-load CV {pm['CV']:.2e}; wrote {outputs[0]}"
    )
    if "realized" in info:
        rm = info["realized"]
        typer.echo(f"realized on true lengths: D {rm['D']:.0f}, padding {rm['P']:.3f}, CV {rm['CV']:.3f}")


PARQUET_SUFFIXES = (".parquet", ".pq")


def _check_feasible(n: int, spec: ScheduleSpec, source: str, allow_partial: bool) -> None:
    """The rule of build, ablation and sweep: n prompts must cut into minibatches of b..b+kappa prompts unless
    --allow-partial accepts one short minibatch; the message names the b and kappa that would work."""
    from asp.schedule.dp import infeasible_message, is_feasible

    if not allow_partial and not is_feasible(n, spec.b, spec.kappa):
        raise UserError(
            f"{source}: {infeasible_message(n, spec.b, spec.kappa)}. Change --b / --kappa accordingly, or pass "
            "--allow-partial to accept one minibatch of fewer than b prompts."
        )


def _check_outputs(out: Path, summary: Path, plot: Path | None) -> tuple[Path, Path, Path | None]:
    """Check the formats and writability of `asp schedule build`'s outputs before anything is computed."""
    if out.suffix.lower() not in PARQUET_SUFFIXES:
        raise UserError(f"--out {out}: the schedule is written as Parquet; give a path ending in .parquet")
    if summary.suffix.lower() != ".json":
        raise UserError(f"--summary {summary}: the summary is written as JSON; give a path ending in .json")
    if plot is not None:
        _check_plot_format(plot)
    paths = [out, summary] + ([plot] if plot is not None else [])
    resolved = [p.resolve() for p in paths]
    if len(set(resolved)) < len(resolved):
        raise UserError(f"the output paths {', '.join(map(str, paths))} must differ; give each its own file")
    for path in paths:
        _check_writable(path)
    return out, summary, plot


def _check_plot_format(plot: Path) -> None:
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    fmt = plot.suffix.lstrip(".").lower() or "png"
    if fmt not in formats:
        raise UserError(f"--plot {plot}: unknown image format {fmt!r}; use one of {', '.join(sorted(formats))}")


def _check_writable(path: Path) -> None:
    """UserError unless `path` can be created or replaced: not a directory, its nearest existing ancestor a writable
    directory."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give a file path for this output")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{path}: cannot be created because {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"{path}: no permission to write in {ancestor}; choose another output path")


def _write_build(outputs: tuple[Path, Path, Path | None], frame: Any, summary_text: str, figure: Any) -> None:
    """Write the schedule, its summary and the plot together: all renamed into place, or none on an error."""
    from asp import io

    out, summary, plot = outputs
    paths = [out, summary] + ([plot] if plot is not None else [])
    writers: list[Callable[[Path], object]] = [
        lambda tmp: frame.to_parquet(tmp, index=False),
        lambda tmp: tmp.write_text(summary_text),
    ]
    if plot is not None:
        image = plot.suffix.lstrip(".").lower() or "png"
        writers.append(lambda tmp: figure.savefig(tmp, format=image, dpi=120))
    current = ", ".join(map(str, paths))  # while the temporary files are created
    try:
        with io.atomic_paths(*paths) as tmps:
            for path, tmp, write in zip(paths, tmps, writers, strict=False):
                current = str(path)
                write(tmp)
            current = ", ".join(map(str, paths))  # while they are renamed into place
    except OSError as exc:
        raise UserError(f"{current}: cannot be written ({exc.strerror or exc}); nothing was written") from None


@app.command("ablation")
@_user_errors
def ablation_cmd(
    input: INPUT = None,
    synthetic: SYNTH = None,
    tau: Annotated[float | None, typer.Option(help="Simulate predictions at this Kendall tau.")] = None,
    b: B = None,
    kappa: KAPPA = None,
    k: K = None,
    iterations: ITERS = None,
    seeds: SEEDS = 3,
    method: METHOD = None,
    loads: Annotated[str | None, typer.Option(help="raw or calibrated.")] = None,
    calibration: Annotated[Path | None, typer.Option(help="Knots JSON {x, y} or table x,y.")] = None,
    cross_fit: Annotated[
        int,
        typer.Option(
            "--cross-fit",
            min=0,
            help="K >= 2: every condition sees the K-fold cross-fitted isotonic calibration of the predictions "
            "against the true lengths (folds drawn per seed), as the schedule stage's ablation; 0: --loads / "
            "--calibration as given.",
        ),
    ] = 0,
    order: ORDER = "shuffled",
    out: Annotated[Path | None, typer.Option(help="Write the table as CSV or JSON.")] = None,
    allow_partial: ALLOW_PARTIAL = False,
) -> None:
    """C0-C4 table (D, padding, group-load CV, spread) on true lengths: mean and standard deviation over seeds.
    Every condition of a seed sees the same prompts' order and loads; the output says what the seeds varied."""
    import numpy as np

    from asp.io.schedule import read_calibration
    from asp.schedule.ablation import perturb_predictions, run_ablation

    spec = _spec(b, kappa, k, iterations, method)
    _check_table_out(out)
    true, file_preds = _true_lengths(input, synthetic, seed=0)
    _check_feasible(true.size, spec, _source(input, synthetic), allow_partial)
    seed_list = list(range(seeds))
    if tau is not None:
        preds = np.stack([perturb_predictions(true, tau, s)[0] for s in seed_list])
    elif file_preds is not None:
        preds = file_preds
    else:
        raise UserError("no predictions: give a file with 'predicted_length' or pass --tau")
    cal = read_calibration(calibration) if calibration else None
    res = run_ablation(
        true, preds, spec, seeds=seed_list, calibration=cal, loads=loads, cross_fit=cross_fit, order=order
    )
    table = res.mean.join(res.sd.add_suffix("_sd"))
    typer.echo(table.to_string(formatters={c: _ABLATION_FORMAT[c.removesuffix("_sd")] for c in table.columns}))
    typer.echo(f"{len(seed_list)} seeds; they vary {res.varies}; loads' Kendall tau {res.loads_tau:.3f}")
    if out is not None:
        _write_table({"ablation": table}, out)


_ABLATION_FORMAT = {"D": "{:.0f}".format, "P": "{:.3f}".format, "CV": "{:.3f}".format, "spread": "{:.3f}".format}


@app.command("sweep")
@_user_errors
def sweep_cmd(
    input: INPUT = None,
    synthetic: SYNTH = None,
    taus: TAUS = None,
    b: B = None,
    kappa: KAPPA = None,
    k: K = None,
    iterations: ITERS = None,
    seeds: SEEDS = 3,
    method: METHOD = None,
    calibration_size: Annotated[int, typer.Option(help="Profiled prompts for the isotonic fit.")] = 4000,
    out: Annotated[Path | None, typer.Option(help="Write both tables as JSON (or two CSVs: stem_local/_cv).")] = None,
    allow_partial: ALLOW_PARTIAL = False,
    order: ORDER = "shuffled",
) -> None:
    """Controlled-tau sweep: Tables 9 (dispersion, padding) and 10 (group-load CV) of the paper, and the tau below
    which C4 (balanced on calibrated loads) stops beating C0 (the original order) on group-load CV."""
    from asp.schedule.ablation import sweep
    from asp.schedule.spec import PAPER_TAUS

    spec = _spec(b, kappa, k, iterations, method)
    _check_table_out(out)
    true, _ = _true_lengths(input, synthetic, seed=0)
    _check_feasible(true.size, spec, _source(input, synthetic), allow_partial)
    try:
        tau_list = list(PAPER_TAUS) if taus is None else [float(t) for t in taus.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--taus {taus!r}: give comma-separated numbers in [0, 1], e.g. 1,0.75,0.5") from None
    res = sweep(true, spec, taus=tau_list, seeds=list(range(seeds)), calibration_size=calibration_size, order=order)
    typer.echo("Table 9 analogue: dispersion D (tokens) and mean padding rate P, on true lengths")
    typer.echo(res.local.to_string(formatters=_LOCAL_FORMAT))
    typer.echo("\nTable 10 analogue: batch-group load CV on true lengths (C4_cal: balanced on calibrated loads)")
    typer.echo(res.cv.to_string(float_format=lambda v: f"{v:.3f}"))
    typer.echo(crossover_line(res, seeds))
    if out is not None:
        _write_table({"local": res.local, "cv": res.cv}, out)


def crossover_line(res: Any, seeds: int) -> str:
    """Where C4_cal stops beating C0 on the sweep's tau grid (means over seeds; with 2+ seeds also by more than
    two paired standard errors): what `evaluate.min_tau` is set from (benchmarks/min_tau.py)."""
    from asp.schedule.min_tau import describe_crossover

    return "\n" + describe_crossover(res, seeds)


def _check_table_out(out: Path | None) -> None:
    """Check an ablation / sweep --out path before the (long) computation."""
    if out is None:
        return
    if out.suffix.lower() not in (".json", ".csv"):
        raise UserError(f"{out}: use a .json or .csv output path")
    _check_writable(out)


def _write_table(tables: dict[str, Any], out: Path) -> None:
    from asp import io

    if out.suffix.lower() == ".json":
        io.write_json({name: t.reset_index().to_dict(orient="records") for name, t in tables.items()}, out)
        return
    if out.suffix.lower() != ".csv":
        raise UserError(f"{out}: use a .json or .csv output path")
    for name, t in tables.items():
        target = out if len(tables) == 1 else out.with_name(f"{out.stem}_{name}.csv")
        with io.atomic_path(target) as tmp:
            t.to_csv(tmp)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
