"""The stage registry and the shared entry of the thin `stages/<name>.py` scripts.

`stage_names()` is the list of stages in `dvc.yaml` order (the one list; nothing copies it). `run_stage` loads
the typed params, opens the stage's MLflow run (nested under the pipeline's parent run), calls
`asp.pipeline.<stage>.run` and prints a one-line summary. `asp stage NAME` accepts registered names only.
A stage interrupted by Ctrl-C or SIGTERM ends its run KILLED (and exits non-zero); a run left RUNNING by an
earlier attempt that died (SIGKILL) is marked KILLED when the stage starts again (`asp.tracking.open_tracker`).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from asp.config import Params, load_params, pipeline_stages
from asp.env import set_offline_defaults, sigterm_as_interrupt
from asp.errors import UserError
from asp.io.inputs import damaged_files
from asp.tracking import Tracker, dvc_parent, open_tracker, record_in_parent

StageFn = Callable[[Params, Any, Tracker], dict[str, Any]]
DVC_FILE = Path("dvc.yaml")
HOLD_ENV = "ASP_HOLD_FILE"  # tests only: see `_hold`


def stage_names(dvc_file: str | Path = DVC_FILE) -> list[str]:
    """The pipeline's stage names in the order `dvc.yaml` lists them (a topological order of the DAG).

    Raises:
        UserError: `dvc.yaml` is missing (not run from the repository root) or has no stages.
    """
    path = Path(dvc_file)
    if not path.is_file():
        raise UserError(f"{path}: not found. Run from the repository root (where dvc.yaml is).")
    stages = pipeline_stages(path)
    if not stages:
        raise UserError(f"{path}: no stages defined under 'stages:'.")
    return stages


def check_stage(name: str, dvc_file: str | Path = DVC_FILE) -> str:
    """Return `name` if it is a registered stage; otherwise raise `UserError` listing the stages."""
    names = stage_names(dvc_file)
    if name not in names:
        raise UserError(f"no stage {name!r}: dvc.yaml defines {', '.join(names)}.")
    return name


def _entry_path(entry: Any) -> str:
    return next(iter(entry)) if isinstance(entry, dict) else str(entry)


def stage_inputs(name: str, root: str | Path = ".") -> list[tuple[Path, str]]:
    """The outputs of other stages that stage `name` depends on (dvc.yaml's deps inside another stage's outs,
    metrics or plots), each with the stage that writes it: what a stage reads from the pipeline."""
    dvc_file = Path(root) / DVC_FILE
    if not dvc_file.is_file():  # a stage run outside a DVC project (tests, a script): no declared inputs
        return []
    stages = (yaml.safe_load(dvc_file.read_text()) or {}).get("stages") or {}
    owners = {
        _entry_path(entry): other
        for other, spec in stages.items()
        if other != name
        for key in ("outs", "metrics", "plots")
        for entry in (spec or {}).get(key) or []
    }
    found = []
    for dep in (stages.get(name) or {}).get("deps") or []:
        dep = _entry_path(dep)
        owner = next((o for out, o in owners.items() if dep == out or dep.startswith(f"{out}/")), None)
        if owner is not None:
            found.append((Path(root) / dep, owner))
    return found


def check_stage_inputs(name: str, root: str | Path = ".") -> None:
    """Refuse to run stage `name` on a damaged input: a Parquet or JSON file written by an earlier stage that cannot
    be read whole (truncated, corrupt). Called by the stage itself (`run_stage`) and, before DVC starts it (DVC
    deletes a stage's outputs before it runs the command), by `asp repro` and the Prefect flow.

    Raises:
        UserError: naming the file, what is wrong and how to get it back.
    """
    for path, owner in stage_inputs(name, root):
        bad = damaged_files([path])
        if bad:
            file, why = bad[0]
            shown = file.relative_to(root) if file.is_relative_to(root) else file
            raise UserError(
                f"{shown}: {why}; it is an output of stage '{owner}' that stage '{name}' reads, damaged since that "
                "stage wrote it. Nothing was run and no output was deleted. Restore it from DVC's cache (`dvc "
                f"checkout --force {owner}`, for cached outputs) or rebuild it (`asp repro {owner}`), then run again."
            )


RESUME_ENV = "ASP_RESUME_DIR"  # set by the orchestrator for a DVC experiment: where a stopped one kept its progress


def persistent_outputs(name: str, root: str | Path = ".") -> list[str]:
    """The outputs of stage `name` that dvc.yaml marks `persist: true` (launch's resume state)."""
    dvc_file = Path(root) / DVC_FILE
    if not dvc_file.is_file():
        return []
    spec = ((yaml.safe_load(dvc_file.read_text()) or {}).get("stages") or {}).get(name) or {}
    return [
        _entry_path(entry)
        for key in ("outs", "metrics", "plots")
        for entry in spec.get(key) or []
        if isinstance(entry, dict) and (next(iter(entry.values())) or {}).get("persist")
    ]


def seed_progress(name: str, root: str | Path = ".") -> list[str]:
    """In a DVC experiment's temporary copy, which starts without the persistent outputs (or with what git holds of
    them): bring in what a stopped run of the same experiment kept (`$ASP_RESUME_DIR/<output>`, kept when it was
    stopped), so the stage resumes it instead of training again. Returns the outputs brought in."""
    source = os.environ.get(RESUME_ENV)
    if not source:
        return []
    seeded = []
    for rel in persistent_outputs(name, root):
        kept, target = Path(source) / rel, Path(root) / rel
        if kept.exists():
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
            shutil.copytree(kept, target, symlinks=True) if kept.is_dir() else shutil.copy2(kept, target)
            seeded.append(rel)
            print(
                f"[{name}] {rel}: the progress a stopped run of this experiment kept ({kept}); resuming it",
                file=sys.stderr,
            )
    return seeded


def keep_progress_on_stop(name: str, root: str | Path = ".") -> list[str]:
    """A stage of a DVC experiment stopped (Ctrl-C, SIGTERM): move its persistent outputs out of the temporary copy,
    which DVC removes, to `$ASP_RESUME_DIR` (a rename: the same filesystem, so checkpoints of any size move within
    the stop's grace time), so the same run brings them back in and resumes (`seed_progress`; whether the state is
    resumable is the stage's own decision then). Returns the outputs kept."""
    dest = os.environ.get(RESUME_ENV)
    if not dest:
        return []
    kept = []
    for rel in persistent_outputs(name, root):
        source, target = Path(root) / rel, Path(dest) / rel
        if not source.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        shutil.move(source, target)
        kept.append(rel)
        print(f"[{name}] {rel}: kept in {target} for the same run to resume", file=sys.stderr, flush=True)
    return kept


def run_stage(
    name: str,
    fn: StageFn,
    paths: Any,
    params_path: str | Path = "params.yaml",
    resume_run: Callable[[Params, Any], str | None] | None = None,
) -> dict[str, Any]:
    """Run one pipeline stage with tracking; returns its metrics.

    `resume_run(params, paths)` may name the MLflow run of an interrupted earlier attempt that this one
    continues (the `launch` stage when it resumes from its checkpoint); None opens a new run."""
    set_offline_defaults()
    params = load_params(params_path)
    seed_progress(name)  # before `resume_run` reads the state it brings in
    t0 = time.perf_counter()
    previous = resume_run(params, paths) if resume_run is not None else None
    common = params.common
    with (
        sigterm_as_interrupt(),
        dvc_parent(common.experiment, common.tracking_uri) as parent,
        open_tracker(
            name,
            experiment=common.experiment,
            tracking_uri=common.tracking_uri,
            tags={"asp.stage": name},
            resume_run_id=previous,
            description=describe_stage(name, fn),
            source=(f"stages/{name}.py", "LOCAL"),  # the file dvc.yaml's `asp stage NAME` runs
        ) as tracker,
    ):
        _hold(name)
        check_stage_inputs(name)  # under plain `dvc repro` too, where DVC has deleted the outputs already
        try:
            metrics = fn(params, paths, tracker)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: in an experiment, keep what a rerun resumes
                keep_progress_on_stop(name)
            raise
        elapsed = time.perf_counter() - t0
        tracker.log_metrics({f"{name}/stage_wall_s": elapsed})
        if parent is not None:  # plain `dvc repro`: the DVC command's parent run collects every stage
            record_in_parent(parent, params, params_path, {**metrics, f"{name}/stage_wall_s": elapsed})
    shown = ", ".join(f"{k.split('/')[-1]}={_fmt(v)}" for k, v in list(metrics.items())[:8])
    print(f"[{name}] done in {elapsed:.1f}s: {shown}", file=sys.stderr)
    return metrics


def describe_stage(name: str, fn: StageFn) -> str:
    """A stage run's description: what the stage does (the first paragraph of its `asp.pipeline` module's
    docstring) and how it runs."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    what = " ".join(((module.__doc__ if module else None) or "").split("\n\n")[0].split())
    how = f"Run by `asp stage {name}` (dvc.yaml's command): params from the `{name}` section of params.yaml."
    return f"{what}\n\n{how}" if what else how


def _hold(name: str, limit_s: float = 600.0) -> None:
    """Tests only (unset elsewhere): while the file named by $ASP_HOLD_FILE exists and holds this stage's name, the
    stage waits with its MLflow run open and its outputs deleted by DVC, so a test can cancel, interrupt or time
    out a real stage at a known point (tests/e2e/test_three_doors.py, tests/orchestration/test_cancel.py). It
    writes its pid to `<file>.held` when it starts waiting. Here, not in `asp.runtime.testhooks`, which is a
    dependency of dvc.yaml stages; this module is none."""
    hold = Path(os.environ.get(HOLD_ENV) or "")
    if not os.environ.get(HOLD_ENV) or not hold.is_file() or hold.read_text().strip() != name:
        return
    print(f"[{name}] holding while {hold} exists ({HOLD_ENV}, tests only)", file=sys.stderr, flush=True)
    Path(f"{hold}.held").write_text(str(os.getpid()))
    deadline = time.monotonic() + limit_s
    while hold.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
