"""`asp plan layout`: how many Generation Units, actors per unit, TU devices, `q_max`, `b` and `k` for a cluster,
by paper appendix B.6 and by a search over simulated runs (`asp.sim.planner`).

    asp plan layout                                        # the cluster of simulate.plan (8 devices in the demo)
    asp plan layout --devices 32 --set simulate.plan.tu_min_devices=4 --out plan.yaml
    asp plan layout --curve 4,8,16,32 --plot plots/plan_layout.png    # iteration time vs devices (Figure 2)

It fits the `simulate` stage's models (profile timings, held-out lengths; training from ``simulate.training`` or
the simulated trainer), samples the realized lengths of the predicted prompts, and scores every layout by
simulating `runtime:` with it (one device per actor; the TU's step time scaled by Amdahl's law from its
minimum size). Prints the B.6 choice and the search's best with their predicted iteration time and bottleneck;
`--out` writes the best layout as a params overlay (`asp preset apply`-style YAML). Bad input exits 2.

`asp plan memory`: does the run fit in memory? GiB per component on one trainer rank (FSDP2 shards, gathered
layers, activations, logits, reference model, reserve; host bytes with CPU offload) and on one vLLM GPU (weights,
allowance, KV cache, max-length sequences that fit); exits 2 with the numbers and what to change when it does not
fit (formulas: src/asp/sim/memory.py, docs/memory.md).

    asp plan memory                                        # params.yaml (the CPU demo: estimate only)
    asp plan memory -c gpu-cluster                         # the preset overlaid on params.yaml
    asp plan memory -c gpu-cluster --set runtime.grpo.world_size=1 --set runtime.grpo.mixed_precision=none
    asp plan memory --list                                 # built-in architectures (runtime.memory.architecture)
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from asp.errors import UserError

if TYPE_CHECKING:
    from asp.config import Params
    from asp.sim.evaluate import Evaluator
    from asp.sim.planner import Candidate, Cluster, Grid

app = typer.Typer(
    help="Plan a cluster layout from simulated runs (paper appendix B.6) and check that it fits in memory.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _ints(text: str | None, default: tuple[int, ...], name: str) -> tuple[int, ...]:
    if not text:
        return default
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise UserError(f"--{name} {text!r}: expected comma-separated integers, e.g. 16,32.") from None
    if not values or min(values) < 1:
        raise UserError(f"--{name} {text!r}: values must be >= 1.")
    return values


def _row(label: str, c: Candidate, m: dict[str, float], span: str = "") -> str:
    """One layout row; `span` (e.g. " [0.5-1.2]") follows the iteration time."""
    from asp.sim.planner import bottleneck, objective_s

    return (
        f"| {label} | {c.generation_units} x {c.actors_per_unit} | {c.tu_devices} | {c.q_max} | {c.b} | {c.k} | "
        f"{objective_s(m):.3f}{span} | {m['runtime/summary/depth_at_arrival_batches_mean']:.2f} | "
        f"{m['sim/policy_lag_max']:.0f} | {bottleneck(m)} |"
    )


HEADER = (
    "| layout | GUs x actors | TU devices | q_max | b | k | iteration (s) | depth at arrival | lag max "
    "| bottleneck |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def cluster_for(params: Params) -> Cluster:
    """The `Cluster` of `simulate.plan` (the TU minimum raised to what the memory estimate needs); `UserError` when
    the numbers do not make a cluster."""
    from asp.sim.planner import Cluster
    from asp.steps.memory_check import min_trainer_devices

    plan = params.simulate.plan
    tu_min = plan.tu_min_devices
    fitted = min_trainer_devices(params)
    if fitted is not None and fitted[0] > tu_min:
        tu_min = fitted[0]
        typer.echo(f"TU minimum {tu_min} devices (simulate.plan.tu_min_devices {plan.tu_min_devices}): {fitted[1]}")
    try:
        return Cluster(
            devices=plan.devices,
            devices_per_actor=plan.devices_per_actor,
            tu_min_devices=tu_min,
            tu_serial_fraction=plan.tu_serial_fraction,
            devices_per_node=plan.devices_per_node,
        )
    except ValueError as exc:
        raise UserError(f"simulate.plan: {exc}") from None


def evaluator_for(params: Params, cluster: Cluster) -> Evaluator:
    """The evaluator that simulates candidates on `cluster` (fits the `simulate` stage's models: seconds)."""
    import pandas as pd

    from asp.io import read_json
    from asp.pipeline import simulate as stage
    from asp.predictor.calibration import CalibrationMap
    from asp.sim.evaluate import make_evaluator

    paths = stage.Paths()
    models = stage.fit_models(params, paths)
    preds = pd.read_parquet(paths.predictions, columns=["prompt_id", "predicted_length"])
    cal = CalibrationMap.from_dict(read_json(paths.calibration)) if paths.calibration.is_file() else None
    load = stage.workload(params, models, preds, cal)
    base = stage.control_settings(params, "C4")
    s = params.schedule
    ev = make_evaluator(
        preds["prompt_id"].to_numpy(),
        preds["predicted_length"].to_numpy(),
        load,
        models.gen,
        models.train,
        base,
        cluster=cluster,
        iterations=s.iterations,
        kappa=s.kappa,
        calibration=cal,
        loads=s.loads if cal is not None else "raw",
        method=s.method,
        shuffle=s.shuffle_groups,
        condition="C4",
    )
    return ev


@app.command("layout")
def layout(
    params: Annotated[Path, typer.Option("--params", "-p", help="params file")] = Path("params.yaml"),
    devices: Annotated[int | None, typer.Option(help="accelerators (default simulate.plan.devices)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="SECTION.KEY=VALUE override (repeatable)")] = None,
    q_max: Annotated[str | None, typer.Option("--q-max", help="q_max values to search (default G, 2G, 4G)")] = None,
    b: Annotated[str | None, typer.Option("--b", help="minibatch sizes b to search (default schedule.b)")] = None,
    k: Annotated[str | None, typer.Option("--k", help="group sizes k to search (default k-2, k, k+2)")] = None,
    tu_devices: Annotated[
        str | None, typer.Option(help="TU sizes to search, e.g. 8,16 (default: the minimum, then one node more each)")
    ] = None,
    actors_per_unit: Annotated[
        str | None, typer.Option(help="actors per GU to search, e.g. 4,8 (default: 1 to a node's worth)")
    ] = None,
    generation_units: Annotated[
        str | None, typer.Option(help="GU counts to search, e.g. 1,2,4,8 (default: every count that fits)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="write the best layout as a params overlay (YAML)")] = None,
    curve: Annotated[str | None, typer.Option(help="device counts for an iteration-time curve, e.g. 4,8,16")] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG of the curve (with --curve)")] = None,
    max_candidates: Annotated[
        int, typer.Option(min=1, help="refuse larger grids (counted before anything is simulated)")
    ] = 2000,
) -> None:
    """Choose a layout by B.6 and by simulated search; print both side by side.

    Sizes are checked before the models are fitted: a device count outside 2..MAX_PLAN_DEVICES (4096) or a grid of
    more than --max-candidates layouts is refused at once, naming the options that narrow it."""
    import yaml

    from asp.io import atomic_path
    from asp.sim.planner import Grid, Limits, b6_curve, b6_heuristic, scaling_curve, search_layout

    _check_devices(devices, f"--devices {devices}")
    counts = _ints(curve, (), "curve") if curve else ()
    for n in counts:
        _check_devices(n, f"--curve {curve}: device count {n}")
    overrides = list(set_ or []) + ([f"simulate.plan.devices={devices}"] if devices is not None else [])
    p = load_params_with(params, None, overrides)
    cluster = cluster_for(p)
    g, s = p.runtime.global_batch_prompts, p.schedule
    grid = Grid(
        q_max=_ints(q_max, (g, 2 * g, 4 * g), "q-max"),
        b=_ints(b, (s.b,), "b"),
        k=_ints(k, tuple(v for v in (s.k - 2, s.k, s.k + 2) if v >= 1), "k"),
        generation_units=_ints(generation_units, (), "generation-units") or None,
        actors_per_unit=_ints(actors_per_unit, (), "actors-per-unit") or None,
        tu_devices=_ints(tu_devices, (), "tu-devices") or None,
    )
    _check_grid_size(cluster, grid, max_candidates, "")
    one = replace(grid, q_max=(1,), b=(1,), k=(1,))  # a curve point: the search's TU / GU axes, one q_max, b, k
    for n in counts:
        _check_grid_size(_resized(cluster, n, curve), one, max_candidates, f"--curve {curve}: at {n} devices, ")
    ev = evaluator_for(p, cluster)
    lag = p.runtime.queue.max_policy_lag
    limits = Limits(depth_batches=p.simulate.plan.max_depth_batches, policy_lag=None if lag is None else float(lag))
    try:
        b6 = b6_heuristic(cluster, ev, b=s.b, k=s.k, q_max=p.runtime.queue.q_max)
        ranked = search_layout(cluster, ev, grid, limits=limits, max_candidates=max_candidates)
    except ValueError as exc:
        raise UserError(f"cannot plan this cluster: {exc}") from None
    best, metrics = ranked[0]
    c0 = cluster
    typer.echo(f"cluster: {c0.devices} devices, {c0.devices_per_actor} per actor, TU >= {c0.tu_min_devices} devices")
    shown = [("B.6 heuristic", b6, ev(b6))]
    shown += [("search best" if i == 0 else f"search #{i + 1}", c, m) for i, (c, m) in enumerate(ranked[:5])]
    preset = p.simulate.time_model
    if preset == "fit":
        typer.echo(HEADER)
        for label, c, m in shown:
            typer.echo(_row(label, c, m))
    else:
        _echo_ranges(preset, ev, shown)
    typer.echo(f"{len(ranked)} layouts simulated; feasible: {sum(bool(m['planner/feasible']) for _, m in ranked)}")
    if not metrics["planner/feasible"]:
        typer.echo("warning: no layout met the queue-depth and lag bounds; the best infeasible one is shown", err=True)
    if out is not None:
        overlay: dict[str, dict[str, Any]] = best.overlay()
        overlay["plan"]["predicted_iteration_s"] = round(float(metrics["planner/objective_s"]), 4)
        with atomic_path(out) as tmp:
            head = f"# asp plan layout, {cluster.devices} devices\n"
            tmp.write_text(head + yaml.safe_dump(overlay, sort_keys=False))
        typer.echo(f"wrote {out}", err=True)
    if curve:
        fixed = replace(grid, q_max=(best.q_max,), b=(best.b,), k=(best.k,))  # layouts vary; queue, schedule fixed
        try:
            rows = scaling_curve(cluster, ev, counts, fixed, limits=limits, max_candidates=max_candidates)
        except ValueError as exc:
            raise UserError(f"--curve {curve}: {exc}") from None
        b6_rows = b6_curve(cluster, ev, counts, b=s.b, k=s.k, q_max=p.runtime.queue.q_max)
        typer.echo("| devices | search: layout | search: iteration (s) | B.6: layout | B.6: iteration (s) |")
        typer.echo("|---|---|---|---|---|")
        for (n, c, m), (_, c6, m6) in zip(rows, b6_rows, strict=True):
            it6 = m6.get("runtime/summary/mean_iteration_time_s_excl_first", math.nan)
            typer.echo(f"| {n} | {c.label()} | {m['planner/objective_s']:.3f} | {c6.label()} | {it6:.3f} |")
        if plot is not None:
            from asp.plots import save_figure
            from asp.plots.planner import scaling_figure

            save_figure(scaling_figure(rows, b6_rows, cluster=cluster), plot)
            typer.echo(f"wrote {plot}", err=True)


def _echo_ranges(preset: str, ev: Evaluator, shown: list[tuple[str, Candidate, dict[str, float]]]) -> None:
    """The layout table with each shown layout's iteration time as ``value [min-max]`` over the presets'
    sensitivity grid (the shown layouts re-simulated at every grid point, not the whole search), and at how many
    points each one is the fastest of those shown."""
    from asp.sim.evaluate import layout_ranges
    from asp.sim.presets import SENSITIVITY_GRID

    lows, highs, wins = layout_ranges(ev, [c for _, c, _ in shown], SENSITIVITY_GRID)
    n = len(SENSITIVITY_GRID)
    typer.echo(
        f"time model: preset {preset} (published measurements; docs/simulator.md). iteration (s): the preset's "
        f"value [min-max over the {n}-point sensitivity grid: decode x0.5-2, trainer x0.5-2, reload x0.5-4]; "
        f"fastest: at how many of the {n} points the layout is the fastest of those shown"
    )
    typer.echo(HEADER.replace("| bottleneck |", "| bottleneck | fastest |") + "---|")
    for (label, c, m), low, high, win in zip(shown, lows, highs, wins, strict=True):
        typer.echo(f"{_row(label, c, m, f' [{low:.3f}-{high:.3f}]')} {win}/{n} |")


def _check_devices(n: int | None, what: str) -> None:
    """`UserError` unless the device count `n` (None: not given) lies in 2..MAX_PLAN_DEVICES; `what` names it."""
    from asp.config import MAX_PLAN_DEVICES

    if n is not None and n < 2:
        raise UserError(f"{what}: a cluster needs at least 2 devices (the Training Unit and one generation actor).")
    if n is not None and n > MAX_PLAN_DEVICES:
        raise UserError(
            f"{what}: asp plan layout plans clusters of up to {MAX_PLAN_DEVICES} devices (it simulates every "
            "generation actor). For a larger cluster, plan one slice of it (e.g. the devices of one Training Unit "
            "and its actors) and replicate that layout."
        )


def _resized(cluster: Cluster, devices: int, curve: str | None) -> Cluster:
    """`cluster` with `devices` devices (a `--curve` point); `UserError` naming the point when it does not fit."""
    try:
        return replace(cluster, devices=devices)
    except ValueError as exc:
        raise UserError(f"--curve {curve}: at {devices} devices, {exc}") from None


def _check_grid_size(cluster: Cluster, grid: Grid, max_candidates: int, where: str) -> None:
    """Refuse, before any model is fitted, a search grid of more than `max_candidates` layouts."""
    from asp.sim.planner import count_candidates

    if count_candidates(cluster, grid, limit=max_candidates) <= max_candidates:
        return
    raise UserError(
        f"{where}cannot plan this cluster: the search grid has more than --max-candidates {max_candidates} layouts "
        f"({cluster.devices} devices). Narrow it with --tu-devices, --actors-per-unit or --generation-units "
        "(comma-separated values, e.g. --tu-devices 8,16 --actors-per-unit 8 --generation-units 1,2,4,8), fewer "
        "--q-max / --b / --k values, or raise --max-candidates (each layout is one simulated run)."
    )


def load_params_with(params: Path, preset: str | None, overrides: list[str]) -> Params:
    """params.yaml with a preset in configs/ overlaid, then `--set` overrides, validated."""
    from asp.config import check_stage_keys_beside, deep_merge, read_yaml, validate_params
    from asp.orchestration.request import parse_set_args, preset_path, read_preset, set_dotted

    raw, source = read_yaml(params), str(params)
    if preset:
        path = preset_path(preset)
        raw, source = deep_merge(raw, read_preset(preset)), f"{source} + {path}"
    values = parse_set_args(overrides)
    if values:
        raw = set_dotted(raw, values)
        source += "".join(f" + {k}={v}" for k, v in values.items())
    return check_stage_keys_beside(validate_params(raw, source, overrides=values), params, source)


def _list_architectures() -> None:
    from asp.sim.architecture import BUILTIN

    typer.echo(
        "| name | parameters | active | vocab | hidden | layers | heads / kv heads | intermediate | experts | tied |"
    )
    typer.echo("|---|---|---|---|---|---|---|---|---|---|")
    for name, a in BUILTIN.items():
        inter = a.expert_intermediate_size if a.is_moe else a.intermediate_size
        shared = f" + shared {a.shared_expert_intermediate_size}" if a.shared_expert_intermediate_size else ""
        experts = f"{a.experts_per_token} of {a.num_experts}{shared}" if a.is_moe else "-"
        typer.echo(
            f"| {name} | {a.num_params / 1e9:.2f}B | {a.active_params / 1e9:.2f}B | {a.vocab_size} | {a.hidden_size} "
            f"| {a.num_layers} | {a.num_heads} / {a.num_kv_heads} | {inter} | {experts} | {a.tie_word_embeddings} |"
        )


@app.command("memory")
def memory(
    params: Annotated[Path, typer.Option("--params", "-p", help="params file")] = Path("params.yaml"),
    preset: Annotated[str | None, typer.Option("--preset", "-c", help="preset name in configs/ to overlay")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="SECTION.KEY=VALUE override (repeatable)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the built-in architectures and exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the estimate as JSON (bytes)")] = False,
) -> None:
    """Estimate trainer and vLLM memory per device; exit 2 with what to change when the layout does not fit."""
    from asp.steps.memory_check import format_report, memory_report, report_dict, skip_note

    if list_:
        _list_architectures()
        return
    p = load_params_with(params, preset, list(set_ or []))
    report = memory_report(p)
    if report is None:
        raise UserError(skip_note(p).replace("memory check skipped", "cannot estimate memory"))
    typer.echo(json.dumps(report_dict(report), indent=2) if as_json else format_report(report))
    if report.problems:
        raise UserError("the layout does not fit in memory:\n" + "\n".join(report.problems))
