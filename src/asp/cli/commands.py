"""The `asp` typer app and its top-level commands (`stage`, `params check|migrate`, `preset list|apply`, `repro`,
`serve`) plus `main`, the console entry point; the command groups live in the sibling modules (plan, schedule,
simulate, ui, heldout, reprofile). `asp.cli` re-exports `app` and `main`; the command list and exit codes are in
its docstring. Heavy libraries are imported inside the commands, so `asp --help` starts fast
(tests/test_architecture.py checks it).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from asp.cli.heldout import heldout_reward
from asp.cli.init import explain, init
from asp.cli.plan import app as plan_app
from asp.cli.reprofile import reprofile
from asp.cli.schedule import app as schedule_app
from asp.cli.simulate import app as simulate_app
from asp.cli.ui import app as ui_app
from asp.env import set_offline_defaults, sigterm_as_interrupt
from asp.errors import UserError

if TYPE_CHECKING:
    from asp.config import Params

# Plain click help (no rich): rendering help through rich costs ~0.5 s of imports on every `asp --help`.
PLAIN: dict[str, Any] = {"no_args_is_help": True, "rich_markup_mode": None, "pretty_exceptions_enable": False}
app = typer.Typer(help="Adaptive Scheduling Pipeline: length-aware rollout scheduling for RL.", **PLAIN)
params_app = typer.Typer(help="Validate params files; migrate them to the current keys.", **PLAIN)
preset_app = typer.Typer(help="Presets in configs/ overlaid on params.yaml.", **PLAIN)
app.add_typer(params_app, name="params")
app.add_typer(preset_app, name="preset")
app.add_typer(ui_app, name="ui")
app.add_typer(schedule_app, name="schedule", help="Build schedules, ablations and τ sweeps from a lengths file.")
app.add_typer(simulate_app, name="simulate")
app.add_typer(plan_app, name="plan")
app.command("heldout-reward")(heldout_reward)
app.command("reprofile")(reprofile)
app.command("init")(init)

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params file")]


@app.command()
def stage(name: Annotated[str, typer.Argument(help="stage name in dvc.yaml, e.g. prepare")]) -> None:
    """Run one pipeline stage (stages/NAME.py) with tracking; dvc.yaml calls this."""
    from asp.stage import check_stage

    script = Path("stages") / f"{check_stage(name)}.py"
    if not script.is_file():
        raise UserError(f"stage {name!r} is in dvc.yaml but {script} is missing; restore it from git.")
    runpy.run_path(str(script), run_name="__asp_stage__")["main"]()


@params_app.command("check")
def params_check(
    params: ParamsOpt = Path("params.yaml"),
    preset: Annotated[str | None, typer.Option(help="preset name in configs/ to overlay")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="SECTION.KEY=VALUE override (repeatable)")] = None,
) -> None:
    """Validate params (and a preset overlay); check the layout fits the declared GPUs and the run fits in memory;
    print the resolved sections."""
    import yaml

    from asp.cli.plan import load_params_with
    from asp.steps.layout_check import enforce_layout
    from asp.steps.lengths_file import check_lengths_file
    from asp.steps.policy_path import check_policy_path

    resolved = load_params_with(params, preset, list(set_ or []))
    layout = enforce_layout(resolved)  # ranks and actors vs the declared GPUs, before the per-rank memory verdict
    memory = "\n".join(line for line in (layout, _memory_check(resolved)) if line)
    simulate_note = _simulate_check(resolved)
    lengths_note = check_lengths_file(resolved, experiment=bool(preset or set_))  # missing / not committed
    policy_note = check_policy_path(resolved)  # `asp repro` refuses it; a preset may name another machine's path
    overlay = _preset_path(preset) if preset else None
    typer.echo(f"{params}{' + ' + str(overlay) if overlay else ''}: OK")
    if overlay:
        typer.echo(f"{overlay} sets (each key with where its value came from):")
        typer.echo("\n".join(f"  {line}" for line in explain(overlay)))
    typer.echo(yaml.safe_dump(resolved.model_dump(mode="json"), sort_keys=False))
    if memory:
        typer.echo(memory)
    if simulate_note:
        typer.echo(simulate_note)
    if lengths_note:
        typer.echo(lengths_note)
    if policy_note:
        typer.echo(policy_note)


@params_app.command("migrate")
def params_migrate(
    files: Annotated[list[Path] | None, typer.Argument(help="params files or presets (default: params.yaml)")] = None,
) -> None:
    """Rewrite params files and presets written in an earlier shape into the current one, keeping comments and
    order (`asp.config.moved_keys`: e.g. profile.device -> profile.engine.device); prints each key moved."""
    from asp.cli.migrate import migrate_file

    for path in files or [Path("params.yaml")]:
        moved = migrate_file(path)
        if not moved:
            typer.echo(f"{path}: already in the current shape")
            continue
        typer.echo(f"{path}: {len(moved)} key(s) moved")
        for old, new in moved:
            typer.echo(f"  {old} -> {new}")


def _simulate_check(params: Params) -> str:
    """What the simulator lacks for a GPU run: `UserError` when the simulate stage is on, a note when it is off."""
    from asp.pipeline.simulate import check_gpu_gaps, gpu_gaps, numbered

    if params.simulate.enabled:
        check_gpu_gaps(params)
        return ""
    gaps = gpu_gaps(params)
    if not gaps:
        return ""
    return "note: simulate is off; before turning it on (simulate.enabled: true): " + numbered(gaps)


def _memory_check(params: Params) -> str:
    """`runtime.memory.check` with the grpo trainer or a vLLM engine: `UserError` on a misfit, else a one-line
    summary (or why the check was skipped, or that a CPU trainer is not checked)."""
    from asp.sim.memory import gib
    from asp.steps.memory_check import checked, enforce, skip_note

    if not checked(params):
        return ""
    report = enforce(params)
    if report is None:
        return skip_note(params)
    parts = []
    if report.trainer is not None:
        t = report.trainer
        parts.append(f"trainer rank {gib(t.device_total)} of {gib(t.capacity)} GiB")
    if report.generation is not None:
        g = report.generation
        kv = f"vLLM KV cache {g.kv_cache / 2**30:.3g} GiB"
        parts.append(f"{kv}: {g.sequences} sequences of {g.max_seq_len} tokens per instance")
    line = f"memory ({report.source}): " + ", ".join(parts) + " (asp plan memory prints the table)"
    return "\n".join([line, *(f"note: {n}" for n in report.notes)])


def _preset_path(name: str) -> Path:
    from asp.orchestration.request import preset_path

    return preset_path(name)


@preset_app.command("list")
def preset_list() -> None:
    """List the presets in configs/."""
    for path in sorted(Path("configs").glob("*.yaml")):
        first = path.read_text().splitlines()[:1]
        typer.echo(f"{path.stem:20s} {first[0].lstrip('# ') if first else ''}")


@preset_app.command("apply")
def preset_apply(name: str, params: ParamsOpt = Path("params.yaml")) -> None:
    """Overlay configs/NAME.yaml on params.yaml (validated first, written atomically)."""
    import yaml

    from asp.config import deep_merge, read_yaml, validate_params
    from asp.orchestration.request import read_preset

    merged = deep_merge(read_yaml(params), read_preset(name))
    validate_params(merged, f"{params} + configs/{name}.yaml")
    from asp.io import atomic_path

    if not os.access(params, os.W_OK):  # a read-only file is not replaced behind its owner's back
        raise UserError(f"{params} is read-only; nothing was changed. Make it writable (chmod u+w {params}) first.")
    try:
        with atomic_path(params) as tmp:
            header = f"# preset '{name}' applied over the previous params.yaml\n"
            tmp.write_text(header + yaml.safe_dump(merged, sort_keys=False))
    except OSError as exc:
        raise UserError(
            f"{params}: cannot be replaced ({exc.strerror or exc}); nothing was changed. The preset is written to a "
            f"new file in {params.resolve().parent} that then replaces {params.name}: fix that folder's permissions "
            "(or free disk space) and run again."
        ) from None
    typer.echo(f"applied preset '{name}' to {params}; `git diff {params}` shows what changed.")


@app.command()
def repro(
    stages: Annotated[list[str] | None, typer.Argument(help="stages to run (default: all, in dvc.yaml order)")] = None,
    preset: Annotated[str | None, typer.Option(help="preset in configs/ for this run only (a DVC experiment)")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-S", help="param override SECTION.KEY=VALUE (repeatable)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="rerun stages DVC finds up to date")] = False,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Run the pipeline through DVC under one MLflow parent run (what `make run` calls).

    Each stage runs as `dvc repro --single-item STAGE` (up-to-date stages are skipped by DVC); with --preset or
    --set the run is a DVC experiment (`dvc exp run --temp`), so params.yaml and outputs/ stay as they are.
    Retries and per-stage timeouts come from `orchestration:` in params.yaml. A failed stage fails the command
    (the stage's exit code, 2 for bad input; dvc's where it names none) and the parent run; Ctrl-C / SIGTERM stop
    the running stage (its run and the parent end KILLED) and exit 130 / 143."""
    from asp.orchestration.pipeline import StageFailed, run_pipeline
    from asp.orchestration.request import RunRequest, parse_set_args

    request = RunRequest(tuple(stages or ()), preset, parse_set_args(set_ or []), force)
    try:
        run_pipeline(request, params_path=params)
    except StageFailed as exc:
        typer.echo(f"error: {exc}; dvc repro failed with exit code {exc.returncode}", err=True)
        raise typer.Exit(exc.exit_code) from None


@app.command()
def serve(name: Annotated[str, typer.Option(help="deployment name")] = "asp-pipeline") -> None:
    """Serve the pipeline flow and the drift loop as Prefect deployments (run them from the Prefect UI; Ctrl-C stops).

    Registers on PREFECT_API_URL, else on the `asp ui prefect` server at http://127.0.0.1:4200 (never on a
    throw-away server), and prints the deployment's URL."""
    from asp.orchestration.request import RunRequest, check_request
    from asp.orchestration.serve import check_server, prefect_api_url  # imports no prefect

    check_request(RunRequest())  # dvc.yaml and params.yaml are here and valid
    api = prefect_api_url()
    os.environ["PREFECT_API_URL"] = api  # before prefect is imported: its settings are read once
    os.environ.setdefault("PREFECT_RUNNER_POLL_FREQUENCY", "5")
    check_server(api)
    from asp.cli.procs import exit_like, run_server

    # In a child process group: Prefect's own shutdown can hang for minutes on a busy machine, so on Ctrl-C /
    # SIGTERM the wrapper stops the whole tree (SIGTERM, then SIGKILL) and exits 130 / 143.
    typer.echo(
        f"serving deployments 'asp-pipeline/{name}' and 'asp-drift-loop/asp-drift-loop' on Prefect at {api}; "
        "Ctrl-C stops them",
        err=True,
    )
    cmd = [sys.executable, "-m", "asp.orchestration.serve", name]
    exit_like(*run_server(cmd, dict(os.environ)))


def main(args: list[str] | None = None) -> None:
    """Console entry point: offline defaults, then the app; always ends with `SystemExit` (the exit codes are
    in `asp.cli`'s docstring). Click prints usage errors (exit 2); `UserError` becomes one `error: ...` line
    (exit 2), and so does a run that cannot go on (`asp.control.core.RuntimeFailure`, e.g. launch after losing a
    node; exit 1); Ctrl-C and SIGTERM stop the command after its cleanup (exit 130 / 143)."""
    set_offline_defaults()
    with sigterm_as_interrupt() as terminated:
        try:
            app(args=args, prog_name="asp")  # standalone: usage errors, typer.Exit codes and Ctrl-C -> SystemExit
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except RuntimeError as exc:  # a launch that cannot go on (a lost node): its message names the checkpoint
            core = sys.modules.get("asp.control.core")  # loaded when it raised one; not imported here (fast --help)
            if core is None or not isinstance(exc, core.RuntimeFailure):
                raise
            typer.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except SystemExit as exc:
            code = 128 + terminated[0] if exc.code == 130 and terminated else exc.code  # click: Ctrl-C -> 130
            if code in (130, 143):
                typer.echo("interrupted" if code == 130 else "terminated", err=True)
            sys.exit(code)
