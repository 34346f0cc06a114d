"""The `asp` command.

    asp repro [DVC ARGS]        dvc repro under one MLflow parent run (what `make run` calls)
    asp stage NAME              run one pipeline stage (what dvc.yaml calls; stages/NAME.py)
    asp params check            validate params.yaml (optionally with a preset overlaid)
    asp preset list|apply NAME  list presets in configs/ or write one over params.yaml
    asp schedule build|ablation|sweep   schedule a lengths/predictions file without the pipeline
    asp heldout-reward [--weights F]    demo reward of the policy (or trained weights) on new problems
    asp serve                   serve the Prefect flow (trigger stages from the Prefect UI)
    asp ui mlflow|prefect       MLflow / Prefect UI on 127.0.0.1 (MLflow: one worker)

Exit codes: 0 done; 2 a user or usage error (one message, no traceback); 130 Ctrl-C, 143 SIGTERM (MLflow runs
end KILLED); a failed sub-process (`dvc repro`, a server) passes its own code on. Heavy libraries (pydantic
models, numpy, torch, mlflow, prefect, dvc) are imported inside the commands, so `asp --help` starts fast.
"""

from __future__ import annotations

import contextlib
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
from asp.env import set_offline_defaults, sigterm_as_interrupt
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
    """`dvc repro` (extra args passed through) under one MLflow parent run; stage runs nest under it.

    Fails with dvc's exit code when a stage fails (the parent run ends FAILED, or KILLED when a stage was
    killed); Ctrl-C / SIGTERM stop the running stage, end the parent KILLED and exit 130 / 143."""
    from asp.config import load_params
    from asp.tracking import PARENT_ENV, end_run, nested_statuses, open_tracker

    loaded = load_params(params)
    with open_tracker(
        "pipeline",
        experiment=loaded.common.experiment,
        tracking_uri=loaded.common.tracking_uri,
        tags={"asp.kind": "pipeline", "asp.dvc_args": " ".join(ctx.args)},
    ) as parent:
        env = dict(os.environ, **({PARENT_ENV: parent.run_id} if parent.run_id else {}))
        rc, signals = call_forwarding_signals([sys.executable, "-m", "dvc", "repro", *ctx.args], env=env)
        parent.log_artifact(params)
        for metrics_file in sorted(Path("metrics").glob("*.json")):
            data = json.loads(metrics_file.read_text())
            parent.log_metrics({k: v for k, v in data.items() if isinstance(v, int | float)})
        if signals or rc != 0:
            end_run(parent, "KILLED" if signals or "KILLED" in nested_statuses(parent) else "FAILED")
    if rc != 0 and not signals:
        typer.echo(f"dvc repro failed with exit code {rc}", err=True)
    _exit_like(rc, signals)


def call_forwarding_signals(cmd: list[str], env: dict[str, str], *, to_children: bool = True) -> tuple[int, list[int]]:
    """Run `cmd` to the end; returns its exit code and the SIGINT / SIGTERM this process received meanwhile.

    Ctrl-C reaches the whole foreground process group (the command and its stage processes) from the terminal,
    so SIGINT is only noted here. SIGTERM is passed on: with `to_children`, to the command's descendants (under
    `dvc repro`: the running stage, which ends its run KILLED, after which dvc fails and unlocks), or to the
    command itself when it has none; else to the command (a server, which stops its own workers)."""
    import signal

    import psutil  # a dependency of dvc

    received: list[int] = []
    procs: list[subprocess.Popen] = []

    def note(signum: int, frame: object) -> None:
        received.append(signum)
        if signum != signal.SIGTERM or not procs:
            return
        with contextlib.suppress(psutil.Error):  # it may have ended meanwhile
            top = psutil.Process(procs[0].pid)
            for target in (top.children(recursive=True) if to_children else []) or [top]:
                with contextlib.suppress(psutil.Error):
                    target.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        procs.append(subprocess.Popen(cmd, env=env))
        return procs[0].wait(), received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    _exit_like(*call_forwarding_signals(cmd, env=env, to_children=False))


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
    _exit_like(*call_forwarding_signals(cmd, env=dict(os.environ), to_children=False))


def _exit_like(rc: int, signals: list[int]) -> None:
    """Exit as a command stopped by Ctrl-C / SIGTERM (130 / 143; main() says so), else with the sub-process's
    code (128 + N when signal N killed it, as a shell reports it)."""
    raise typer.Exit(128 + signals[0] if signals else rc if rc >= 0 else 128 - rc)


def main(args: list[str] | None = None) -> None:
    """Console entry point: offline defaults, then the app; always ends with `SystemExit` (see the exit codes
    above). Click prints usage errors (exit 2); `UserError` becomes one `error: ...` line (exit 2); Ctrl-C and
    SIGTERM stop the command after its cleanup (exit 130 / 143)."""
    set_offline_defaults()
    with sigterm_as_interrupt() as terminated:
        try:
            app(args=args, prog_name="asp")  # standalone: usage errors, typer.Exit codes and Ctrl-C -> SystemExit
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except SystemExit as exc:
            code = 128 + terminated[0] if exc.code == 130 and terminated else exc.code  # click: Ctrl-C -> 130
            if code in (130, 143):
                typer.echo("interrupted" if code == 130 else "terminated", err=True)
            sys.exit(code)
