"""The `asp` command.

    asp repro [DVC ARGS]        dvc repro under one MLflow parent run (what `make run` calls)
    asp stage NAME              run one pipeline stage (what dvc.yaml calls; stages/NAME.py)
    asp params check            validate params.yaml (optionally with a preset overlaid)
    asp preset list|apply NAME  list presets in configs/ or write one over params.yaml
    asp schedule build|ablation|sweep   schedule a lengths/predictions file without the pipeline
    asp heldout-reward [--weights F]    demo reward of the policy (or trained weights) on new problems
    asp serve                   serve the Prefect flow (trigger stages from the Prefect UI)
    asp ui mlflow|prefect       MLflow / Prefect UI on 127.0.0.1 (MLflow: one worker)

User errors print one message and exit with code 2, without a traceback. Heavy libraries (pydantic models,
numpy, torch, mlflow, prefect, dvc) are imported inside the commands, so `asp --help` starts fast.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from asp.cli.heldout import heldout_reward
from asp.cli.schedule import app as schedule_app
from asp.env import set_offline_defaults
from asp.errors import UserError

# Plain click help (no rich): rendering help through rich costs ~0.5 s of imports on every `asp --help`.
PLAIN = {"no_args_is_help": True, "rich_markup_mode": None, "pretty_exceptions_enable": False}
app = typer.Typer(help="Adaptive Scheduling Pipeline: length-aware rollout scheduling for RL.", **PLAIN)
params_app = typer.Typer(help="Validate params files.", **PLAIN)
preset_app = typer.Typer(help="Presets in configs/ overlaid on params.yaml.", **PLAIN)
ui_app = typer.Typer(help="Local web UIs (bound to 127.0.0.1).", **PLAIN)
app.add_typer(params_app, name="params")
app.add_typer(preset_app, name="preset")
app.add_typer(ui_app, name="ui")
app.add_typer(schedule_app, name="schedule", help="Build schedules, ablations and τ sweeps from a lengths file.")
app.command("heldout-reward")(heldout_reward)

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
) -> None:
    """Validate params (and a preset overlay); print the resolved sections."""
    import yaml

    from asp.config import load_params

    overlay = _preset_path(preset) if preset else None
    resolved = load_params(params, overlay)
    typer.echo(f"{params}{' + ' + str(overlay) if overlay else ''}: OK")
    typer.echo(yaml.safe_dump(resolved.model_dump(mode="json"), sort_keys=False))


def _preset_path(name: str) -> Path:
    path = Path("configs") / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in Path("configs").glob("*.yaml"))
        raise UserError(f"no preset '{name}' ({path} not found). Presets: {', '.join(known) or 'none'}.")
    return path


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

    merged = deep_merge(read_yaml(params), read_yaml(_preset_path(name)))
    validate_params(merged, f"{params} + configs/{name}.yaml")
    from asp.io import atomic_path

    with atomic_path(params) as tmp:
        header = f"# preset '{name}' applied over the previous params.yaml\n"
        tmp.write_text(header + yaml.safe_dump(merged, sort_keys=False))
    typer.echo(f"applied preset '{name}' to {params}; `git diff {params}` shows what changed.")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def repro(ctx: typer.Context, params: ParamsOpt = Path("params.yaml")) -> None:
    """`dvc repro` (extra args passed through) under one MLflow parent run; stage runs nest under it."""
    from asp.config import load_params
    from asp.tracking import PARENT_ENV, end_run, open_tracker

    loaded = load_params(params)
    with open_tracker(
        "pipeline",
        experiment=loaded.common.experiment,
        tracking_uri=loaded.common.tracking_uri,
        tags={"asp.kind": "pipeline", "asp.dvc_args": " ".join(ctx.args)},
    ) as parent:
        env = dict(os.environ, **({PARENT_ENV: parent.run_id} if parent.run_id else {}))
        rc = subprocess.call([sys.executable, "-m", "dvc", "repro", *ctx.args], env=env)
        parent.log_artifact(params)
        for metrics_file in sorted(Path("metrics").glob("*.json")):
            data = json.loads(metrics_file.read_text())
            parent.log_metrics({k: v for k, v in data.items() if isinstance(v, int | float)})
        if rc != 0:
            end_run(parent, "FAILED")
    if rc != 0:
        typer.echo(f"dvc repro failed with exit code {rc}", err=True)
        raise typer.Exit(rc)


@app.command()
def serve(name: str = "asp-pipeline") -> None:
    """Serve the Prefect flow as a deployment that can be triggered from the Prefect UI (Ctrl-C stops)."""
    sys.path.insert(0, str(Path.cwd()))
    from flows.pipeline import asp_pipeline

    asp_pipeline.serve(name=name)


@ui_app.command("prefect")
def ui_prefect(port: int = 4200, host: Annotated[str, typer.Option(help="keep 127.0.0.1")] = "127.0.0.1") -> None:
    """Start the Prefect server and UI on 127.0.0.1 (analytics off)."""
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=f"http://{host}:{port}/api")
    typer.echo(
        f"Prefect UI: http://{host}:{port}; in another shell: PREFECT_API_URL={env['PREFECT_API_URL']} asp serve",
        err=True,
    )
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    raise typer.Exit(subprocess.call(cmd, env=env))


@ui_app.command("mlflow")
def ui_mlflow(
    port: int = 5000, host: Annotated[str, typer.Option(help="interface; keep 127.0.0.1")] = "127.0.0.1"
) -> None:
    """Start the MLflow UI on the project's store (one worker, loopback only)."""
    from asp.config import load_params
    from asp.tracking import ARTIFACT_DIR, resolve_tracking_uri

    uri = resolve_tracking_uri(load_params().common.tracking_uri if Path("params.yaml").is_file() else None)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--default-artifact-root",
        Path(ARTIFACT_DIR).resolve().as_uri(),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    typer.echo(f"MLflow UI: http://{host}:{port}  (store {uri}); Ctrl-C stops it", err=True)
    raise typer.Exit(subprocess.call(cmd))


def main() -> None:
    """Console entry point: offline defaults, then the app; user errors exit 2 without a traceback."""
    set_offline_defaults()
    try:
        app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
