"""Put a stage's outputs back as they were when its run is cancelled, interrupted (Ctrl-C, SIGTERM) or timed out.

`dvc repro` deletes a stage's outputs (its outs, metrics and plots, except `persist: true` ones) before it runs the
command and writes the stage's `dvc.lock` entry after it. A stage stopped half-way would leave its outputs gone
(`dvc status`: deleted; the stages after it: changed; git: `D metrics/<stage>.json`), and `dvc checkout` brings back
only what DVC caches, never the metrics and plots. So the orchestrator (`asp.orchestration.pipeline.PipelineRun`)
keeps a copy of them while the stage runs:

    snap = take(root, "schedule")   # hard links of the outputs (no data copied) + dvc.lock's bytes
    ...                             # dvc repro --single-item schedule, stopped half-way
    done = restore(snap)            # outputs and dvc.lock as they were; done.message says what was put back
    discard(snap)                   # after a run that finished or failed (DVC's own outcome then stands)

The copy lives in `.dvc/tmp/asp-snapshots/<stage>.<pid>.<id>/` (same filesystem: hard links, and renames to put it
back; a plain copy where hard links are refused). Hard links are safe because DVC unlinks the outputs before the
command runs, so nothing writes into the linked files.

Persistent outputs (`persist: true`; `outputs/launch_state`: launch's resume state, not cached, so DVC can never
restore it) are not deleted by DVC, but the stage itself may rewrite them (a forced or changed `launch` starts
afresh and drops the old run's checkpoints). The caller says which of them to keep (`take(..., persisted=...)`):
`PipelineRun` keeps those that match `dvc.lock` (the result of the last finished run: put back byte for byte, so
`dvc status` is as before) and leaves the others, an interrupted attempt's resume state, to the stage (they keep
the stopped run's progress, which a rerun resumes). A kept persistent output is a copy, since the stage writes into
it (appends to its logs): files are copied, except those of finished checkpoint directories (a directory holding a
``manifest.json``: written whole under another name and renamed into place, never written into again), which are
hard links. Where something cannot be put back, the message names it and says what to run. Pure file operations: no
DVC, MLflow or Prefect imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asp.env import pid_alive

SNAPSHOTS = Path(".dvc/tmp/asp-snapshots")
LOCK_FILE = "dvc.lock"


@dataclass(frozen=True)
class Snapshot:
    """What `take` kept of stage `stage` in project `root`: `paths` (its outputs that DVC deletes), which of them
    `existed`, and dvc.lock's bytes (None: no dvc.lock) in `where`."""

    stage: str
    root: Path
    where: Path
    paths: tuple[str, ...]
    existed: frozenset[str]
    lock: bytes | None
    left: tuple[str, ...] = ()  # persistent outputs not kept (an interrupted attempt's state): the stage's to change
    copied: tuple[str, ...] = ()  # persistent outputs kept (copies of the last finished run's state)


@dataclass
class Restored:
    """What `restore` did: paths put back, paths the stopped run created and that were removed, what happened to
    dvc.lock (`unchanged`, `restored` or `kept`: other stages' entries changed too), and anything it could not do."""

    stage: str
    put_back: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    lock: str = "unchanged"
    problems: list[str] = field(default_factory=list)
    left: tuple[str, ...] = ()
    progress: list[str] = field(default_factory=list)  # persistent outputs left with the stopped run's progress

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def message(self) -> str:
        """One paragraph for the run's log: what is back as it was, or what to run where that was impossible."""
        if self.ok:
            what = ", ".join(self.put_back) or "no outputs existed"
            extra = f"; removed what it had created ({', '.join(self.removed)})" if self.removed else ""
            lock = "dvc.lock restored" if self.lock == "restored" else "dvc.lock unchanged"
            left = (
                f" {', '.join(self.left)} keeps the stopped run's progress (it held an interrupted run's resume state "
                f"before, which `asp repro {self.stage}` resumes)."
                if self.left
                else ""
            )
            if self.progress:
                left += (
                    f" {', '.join(self.progress)} keeps the stopped run's progress, not the last finished run's state "
                    f"(the stage had changed, so that state was not the one a rerun uses): `asp repro {self.stage}` "
                    "resumes it."
                )
            return (
                f"the workspace is as it was before stage '{self.stage}' started: {what} put back{extra}, {lock} "
                f"(`dvc status` and `git status` show what they showed before).{left}"
            )
        return (
            f"the workspace could not be fully put back after stage '{self.stage}' stopped: "
            + "; ".join(self.problems)
            + f". Run `asp repro {self.stage}` (or `dvc repro --single-item {self.stage}`) to rebuild its outputs, "
            "then `dvc status` to check."
        )


def stage_outputs(stage: str, dvc_file: str | Path) -> tuple[list[str], list[str]]:
    """The outputs `dvc.yaml` declares for `stage` (outs, metrics, plots): (those `dvc repro` deletes before it
    runs the command, the persistent ones it keeps)."""
    spec = ((yaml.safe_load(Path(dvc_file).read_text()) or {}).get("stages") or {}).get(stage) or {}
    deleted: list[str] = []
    kept: list[str] = []
    for key in ("outs", "metrics", "plots"):
        for entry in spec.get(key) or []:
            path, opts = next(iter(entry.items())) if isinstance(entry, dict) else (str(entry), {})
            (kept if (opts or {}).get("persist") else deleted).append(path)
    return sorted(set(deleted)), sorted(set(kept))


def _owner_alive(name: str) -> bool:
    """Whether the process that made snapshot directory `name` (<stage>.<pid>.<id>) still runs."""
    try:
        pid = int(name.split(".")[-2])
    except (IndexError, ValueError):
        return False
    return pid_alive(pid)


def stale_snapshots(root: str | Path) -> list[Path]:
    """Snapshot directories left by processes that no longer run (killed with SIGKILL mid-stage)."""
    base = Path(root) / SNAPSHOTS
    return sorted(p for p in base.glob("*.*.*") if p.is_dir() and not _owner_alive(p.name)) if base.is_dir() else []


def clear_stale(root: str | Path) -> list[str]:
    """Remove the snapshots of killed runs; one line each for the log, with what to run if they broke the workspace."""
    lines = []
    for stale in stale_snapshots(root):
        stage = stale.name.split(".")[0]
        shutil.rmtree(stale, ignore_errors=True)
        lines.append(
            f"removed {stale.relative_to(Path(root).resolve())}: the outputs of stage {stage} kept by a run that was "
            f"killed (SIGKILL) while it ran; if `dvc status` shows them deleted, `asp repro {stage}` rebuilds them"
        )
    return lines


MANIFEST = "manifest.json"  # a finished checkpoint directory (asp.runtime.checkpoint.write_manifest)


def _link_tree(src: Path, dst: Path, link: bool = True) -> None:
    """`dst` as hard links of `src` (a file, a symlink or a directory tree); copies where links are refused.
    `link=False` (a persistent output): copies, except inside finished checkpoint directories (`MANIFEST`)."""
    if src.is_symlink() or src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
            return
        try:
            if not link:
                raise OSError("a copy")
            os.link(src, dst)
        except OSError:  # a persistent output, another filesystem, or one without hard links
            shutil.copy2(src, dst)
        return
    dst.mkdir(parents=True, exist_ok=True)
    link = link or (src / MANIFEST).is_file()
    for child in src.iterdir():
        _link_tree(child, dst / child.name, link)


def take(root: str | Path, stage: str, dvc_file: str | Path | None = None, persisted: Iterable[str] = ()) -> Snapshot:
    """Keep `stage`'s outputs (hard links) and dvc.lock's bytes, before `dvc repro` of it runs; of its persistent
    outputs, those named in `persisted` (copies; see the module docstring). A partial snapshot is removed if this
    is interrupted."""
    root = Path(root).resolve()
    deleted, kept = stage_outputs(stage, dvc_file or root / "dvc.yaml")
    copied = sorted(set(kept) & set(persisted))
    deleted = sorted({*deleted, *copied})
    where = root / SNAPSHOTS / f"{stage}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        where.mkdir(parents=True)
        existed = []
        for rel in deleted:
            path = root / rel
            if path.exists() or path.is_symlink():
                _link_tree(path, where / "files" / rel, link=rel not in copied)
                existed.append(rel)
        lock_path = root / LOCK_FILE
        lock = lock_path.read_bytes() if lock_path.is_file() else None
        (where / "manifest.json").write_text(json.dumps({"stage": stage, "paths": deleted, "existed": existed}))
    except BaseException:
        shutil.rmtree(where, ignore_errors=True)
        raise
    left = tuple(p for p in kept if p not in copied and (root / p).exists())
    return Snapshot(stage, root, where, tuple(deleted), frozenset(existed), lock, left, tuple(copied))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _stage_entries(text: bytes | None) -> dict[str, Any]:
    if not text:
        return {}
    return dict((yaml.safe_load(text) or {}).get("stages") or {})


def _restore_lock(snap: Snapshot, done: Restored) -> None:
    """dvc.lock as it was, when only this stage's entry changed (what `dvc repro --single-item` writes)."""
    path = snap.root / LOCK_FILE
    now = path.read_bytes() if path.is_file() else None
    if now == snap.lock:
        return
    before, after = _stage_entries(snap.lock), _stage_entries(now)
    before.pop(snap.stage, None)
    after.pop(snap.stage, None)
    if before != after:
        done.lock = "kept"
        done.problems.append("dvc.lock changed for other stages too, so it was left as it is")
        return
    if snap.lock is None:
        path.unlink(missing_ok=True)
    else:
        tmp = path.with_name(f".{LOCK_FILE}.{os.getpid()}.tmp")
        tmp.write_bytes(snap.lock)
        os.replace(tmp, path)
    done.lock = "restored"


def restore(snap: Snapshot, keep_progress: Callable[[Path], bool] | None = None) -> Restored:
    """Put `snap`'s outputs and dvc.lock back (call it once the stage's processes have ended); removes what the
    stopped run created in their place. Never raises for a path it cannot restore: `Restored.problems` says.

    `keep_progress(path)`: whether a kept persistent output now holds the stopped run's progress that a rerun
    resumes (it is then left as the run left it, not put back); None: every kept output is put back."""
    done = Restored(snap.stage, left=snap.left)
    with deferred_signals():
        for rel in snap.paths:
            target = snap.root / rel
            if rel in snap.copied and keep_progress is not None and target.exists() and keep_progress(target):
                done.progress.append(rel)
                continue
            try:
                had = target.exists() or target.is_symlink()
                _remove(target)
                if rel in snap.existed:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(snap.where / "files" / rel, target)
                    done.put_back.append(rel)
                elif had:
                    done.removed.append(rel)
            except OSError as exc:
                done.problems.append(f"{rel}: {exc}")
        try:
            _restore_lock(snap, done)
        except (OSError, yaml.YAMLError) as exc:
            done.lock = "kept"
            done.problems.append(f"{LOCK_FILE}: {exc}")
        discard(snap)
    return done


def discard(snap: Snapshot) -> None:
    """Remove the snapshot's directory (the workspace keeps what the run left)."""
    shutil.rmtree(snap.where, ignore_errors=True)


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM recorded, not acted on, while the block runs (main thread only; elsewhere a no-op): a
    second Ctrl-C or a repeated SIGTERM must not cut the putting back of the workspace short. Yields the signals
    received; the handlers in place before are restored afterwards (the stop in progress goes on)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous = {sig: handler for sig, handler in previous.items() if handler is not None}  # None: not Python's
    for sig in previous:
        signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def keep_progress(copy: Path, dest: Path, outputs: Iterable[str], holds: Callable[[Path], bool]) -> list[str]:
    """Move the persistent `outputs` of a stopped DVC experiment's temporary `copy` that hold progress (`holds`)
    to `dest`, replacing what an earlier stop kept there, before the copy is removed; the next run of the same
    experiment brings them in (`asp.stage.seed_progress`). Returns those kept."""
    kept = []
    for rel in outputs:
        source = copy / rel
        if not source.exists() or not holds(source):
            continue
        target = dest / rel
        _remove(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), target)
        kept.append(rel)
    return kept
