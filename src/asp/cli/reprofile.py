"""`asp reprofile`: re-profile a stopped launch run by hand (what the drift action `reprofile` does in-process).

    asp reprofile                                           # outputs/launch_state/<runtime.condition>
    asp reprofile --state-dir outputs/launch_state/C4 --run-id <launch run id>    # log into the launch's run
    asp reprofile --set evaluate.min_tau=0.6 --strict       # exit 1 when the tau gate rejects the new predictor
    asp reprofile --from-run                                # no generation: fine-tune on the run's own lengths

Profiles `drift.reprofile_prompts` of the run's remaining prompts with the current policy, fine-tunes the predictor
from its newest accepted version, gates it on held-out Kendall tau (`evaluate.min_tau`) and, when accepted, writes
``<state-dir>/predictors/v<k>/`` with the schedule of the remaining prompts, which the next `launch` applies
(`asp.adaptation.reprofile`). With `--from-run` (the default when `drift.action` is `refit_from_run`) nothing
is generated: the predictor is fine-tuned on the realized lengths of the run's `drift.refit_prompts` most recently
trained prompts, which the checkpoint keeps with `runtime.history` (`asp.adaptation.refit`). Logs to its own MLflow
run (`reprofile`) unless `--run-id` names one. Prints a result table. Exit codes: 0 done (accepted or rejected),
1 rejected with `--strict` (its MLflow run FAILED), 2 a user error (no checkpoint, a finished run, missing pipeline
outputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from asp.env import set_offline_defaults
from asp.errors import UserError


def reprofile(
    params: Annotated[Path, typer.Option("--params", "-p", help="params file")] = Path("params.yaml"),
    state_dir: Annotated[
        Path | None, typer.Option(help="the run's state directory (default outputs/launch_state/<condition>)")
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="log into this MLflow run (e.g. the launch's)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="SECTION.KEY=VALUE override (repeatable)")] = None,
    strict: Annotated[bool, typer.Option(help="exit 1 when the tau gate rejects the new predictor")] = False,
    reason: Annotated[str, typer.Option(help="why (recorded in the report)")] = "manual",
    from_run: Annotated[
        bool | None,
        typer.Option(
            "--from-run/--generate",
            help="fine-tune on the run's own realized lengths, no generation / profile fresh prompts "
            "(default: --from-run when drift.action is refit_from_run)",
        ),
    ] = None,
) -> None:
    """Re-profile the current policy on the run's remaining prompts and re-schedule them (drift)."""
    from asp.adaptation.position import check_checkpoint
    from asp.adaptation.refit import ACTION as REFIT
    from asp.adaptation.refit import refit_from_run
    from asp.adaptation.reprofile import load_train_prompts
    from asp.adaptation.reprofile import reprofile as generate
    from asp.cli.plan import load_params_with
    from asp.steps.paths import LaunchPaths
    from asp.tracking import attach_run, open_tracker

    set_offline_defaults()
    p = load_params_with(params, None, list(set_ or []))
    directory = state_dir or Path("outputs/launch_state") / p.runtime.condition
    run_reprofile = refit_from_run if (p.drift.action == REFIT if from_run is None else from_run) else generate
    check_checkpoint(directory)  # what the user must fix comes before MLflow opens (or creates) its store
    if not LaunchPaths().prompts.is_file():
        load_train_prompts(LaunchPaths().prompts)  # raises, naming the file and the stage that writes it
    common = p.common
    if run_id:
        tracker = attach_run(run_id, common.tracking_uri)
        if tracker is None:
            raise UserError(f"--run-id {run_id}: no such MLflow run in the tracking store; drop --run-id.")
        _report(run_reprofile(p, directory, tracker, reason=reason), run_reprofile is refit_from_run, strict)
    else:
        with open_tracker(
            "reprofile", experiment=common.experiment, tracking_uri=common.tracking_uri, tags={"asp.kind": "reprofile"}
        ) as new_run:
            new_run.log_params({"drift": p.drift.model_dump(), "evaluate.min_tau": p.evaluate.min_tau})
            result = run_reprofile(p, directory, new_run, reason=reason)
            _report(result, run_reprofile is refit_from_run, strict)  # --strict's exit 1 inside: the run FAILED


def _report(result: Any, from_run: bool, strict: bool) -> None:
    """The result as a table and its message; `typer.Exit(1)` for a rejected predictor under --strict."""
    rows = [
        ("version", f"v{result.version}"),
        ("accepted", str(result.accepted).lower()),
        ("held-out Kendall tau", f"{result.tau:.3f}"),
        ("evaluate.min_tau", f"{result.min_tau:g}"),
        ("policy step", str(result.policy_step)),
        ("source", "the run's own lengths" if from_run else "generated"),
        ("prompts profiled", str(result.prompts)),
        ("seconds", f"{result.seconds:.1f}"),
        ("directory", str(result.directory)),
    ]
    typer.echo("| reprofile | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows))
    typer.echo(result.message)
    if strict and not result.accepted:
        raise typer.Exit(1)
