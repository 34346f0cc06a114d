"""Run DVC commands for the orchestrator: stream their output, classify what each stage did, stop them cleanly.

`dvc_repro_cmd` / `dvc_exp_cmd` build the command lines; `run_streaming` runs one, hands every output line
to a callback (the terminal for `asp repro`, the Prefect run logger for the flow), enforces a timeout and
turns SIGTERM / Ctrl-C / a Prefect cancellation into a clean stop of the running stage (it receives SIGTERM,
so its MLflow run ends KILLED, and DVC releases its lock). It returns or re-raises only once DVC and every process
under it have ended, so the caller can put the stage's outputs back (`asp.orchestration.workspace`). A stopped
`dvc exp run --temp` leaves its temporary copy when DVC is killed before it cleans up: `remove_experiment_copies`
removes the copies made since `experiment_copies` listed them (tests/orchestration/test_exp_cleanup.py).

Whether DVC will skip a stage is read from its Python API (`dvc.repo.Repo.status`, what `dvc status --json
STAGE` prints), asked right before `dvc repro --single-item STAGE` runs (`up_to_date`). Two things are still read
from DVC's messages (`classify`), because DVC offers no structured account of them:

* that `dvc repro` restored a changed stage from its run cache instead of running it: the run-cache lookup is
  internal (`StageCache._load`); the public `StageCache.restore(stage, dry=True)` looks the stage up with its
  *locked* dependency hashes, so it answers "cached" for every stage whose dependencies changed (found while
  writing tests/orchestration/test_dvc.py), and `dvc repro` has no JSON output;
* what happened to each stage of a `dvc exp run` (ran, skipped, restored, which one failed, when each started):
  `dvc exp run` has no JSON output, and `dvc exp show --json` lists a finished experiment's params, metrics, deps
  and outs, not what happened to its stages.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
import yaml

from asp.env import Terminated, pid_alive, sigterm_as_interrupt

StageStatus = Literal["ran", "skipped", "restored", "failed", "timeout"]
# DVC's messages, for what it offers no structured output for (see the module docstring).
_MESSAGES: tuple[tuple[re.Pattern[str], StageStatus], ...] = (
    (re.compile(r"Running stage '([^']+)'"), "ran"),
    (re.compile(r"Stage '([^']+)' didn't change, skipping"), "skipped"),
    (re.compile(r"Stage '([^']+)' is cached - skipping run, checking out outputs"), "restored"),
    (re.compile(r"failed to reproduce '([^']+)'"), "failed"),
)
STOP_GRACE_S = 60.0
# A SIGTERM'd orchestrator is SIGKILLed soon after (Prefect's runner: 30 s after a cancellation's SIGTERM; Docker
# 10 s): its stage gets this long to end (its MLflow run KILLED) before it is killed, leaving time to put the
# workspace back (asp.orchestration.workspace).
INTERRUPT_GRACE_S = 16.0


@dataclass(frozen=True)
class CommandResult:
    """How a DVC command ended: exit code, seconds, whether it timed out, and its output."""

    returncode: int
    seconds: float
    timed_out: bool
    lines: tuple[str, ...]


def classify(lines: Iterable[str]) -> dict[str, StageStatus]:
    """What DVC says it did with each stage: ran, skipped (up to date) or restored (from its run cache).

    >>> classify(["Stage 'prepare' didn't change, skipping", "Running stage 'schedule':"])
    {'prepare': 'skipped', 'schedule': 'ran'}
    """
    out: dict[str, StageStatus] = {}
    for line in lines:
        for pattern, status in _MESSAGES:
            match = pattern.search(line)
            if match:
                out[match.group(1)] = status
    return out


_STAGE_EXIT = re.compile(r"failed to run: .*, exited with (-?\d+)\s*$")


def stage_exit_code(lines: Iterable[str]) -> int | None:
    """The exit code of the stage command that failed under DVC (DVC itself exits 255 for any failed stage), from
    its `ERROR: failed to reproduce 'X': failed to run: CMD, exited with N` line; None when DVC names none. A
    negative code (killed by signal k) is given as 128 + k, as a shell does.

    >>> stage_exit_code(["ERROR: failed to reproduce 'prepare': failed to run: asp stage prepare, exited with 2"])
    2
    """
    for line in reversed(list(lines)):
        match = _STAGE_EXIT.search(line)
        if match:
            code = int(match.group(1))
            return 128 - code if code < 0 else code
    return None


def up_to_date(root: str | Path, stage: str) -> bool:
    """Whether DVC finds `stage` of the project in `root` unchanged (`Repo.status` of that stage alone, which
    `dvc status --json STAGE` prints): `dvc repro --single-item STAGE` without --force then skips it. Ask right
    before that command, with nothing else changing the workspace meanwhile.

    Raises:
        dvc.exceptions.DvcException: DVC could not read the project (dvc.yaml, its lock) or the stage.
    """
    return not stage_status(root, stage)


def stage_status(root: str | Path, stage: str) -> list[Any]:
    """DVC's status of `stage` alone (`Repo.status`, what `dvc status --json STAGE` prints for it): empty when the
    stage is unchanged, else entries such as ``{"changed outs": {"outputs/launch_state": "modified"}}``.

    Raises:
        dvc.exceptions.DvcException: DVC could not read the project (dvc.yaml, its lock) or the stage.
    """
    from dvc.repo import Repo

    # DVC's Python API resolves stage files against the working directory (as its CLI does): run it from `root`
    # (the orchestrator's own directory already, so this changes nothing there; tests use other roots).
    with _dvc_log_level(logging.WARNING), contextlib.chdir(root), Repo(".") as repo:
        return list(repo.status(targets=[stage]).get(stage) or [])


def changed_outputs(status: list[Any]) -> set[str]:
    """The outputs a `stage_status` names as changed (modified, deleted, not in dvc.lock)."""
    changed: set[str] = set()
    for entry in status:
        if isinstance(entry, dict) and isinstance(entry.get("changed outs"), dict):
            changed.update(entry["changed outs"])
    return changed


@contextlib.contextmanager
def _dvc_log_level(level: int) -> Iterator[None]:
    """DVC's logger at `level` for the block: its in-process checks log what `dvc repro` prints anyway."""
    logger = logging.getLogger("dvc")
    old = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


def _dvc() -> list[str]:
    return [sys.executable, "-m", "dvc"]


def dvc_repro_cmd(stage: str, force: bool = False) -> list[str]:
    """`dvc repro --single-item STAGE`: this stage only, skipped by DVC when it is up to date."""
    return [*_dvc(), "repro", "--single-item", *(["--force"] if force else []), stage]


def format_value(value: Any) -> str:
    """A param value as `dvc exp run -S` parses it (YAML flow style: 3, 0.5, true, [a, b], null)."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def dvc_exp_cmd(
    name: str,
    stages: Iterable[str],
    overrides: Mapping[str, Any],
    force: bool = False,
    copy_paths: Iterable[str] = (),
) -> list[str]:
    """`dvc exp run --temp -n NAME -S k=v ... STAGES`: in a temporary copy of the workspace, so params.yaml and
    outputs/ stay as they are; the result is an experiment (`dvc exp show`, `dvc exp apply NAME`).

    `copy_paths` are uncached outputs (plots, metrics, timings) the temporary copy would otherwise lack when git
    does not hold them, which would make DVC rerun stages that are up to date.

    `force` reruns the named `stages` only, as `dvc_repro_cmd` does outside an experiment: DVC's `--force` alone
    forces every stage upstream of them too (policy, prepare, profile, ... for `launch`), so it comes with
    `--single-item` (DVC still checks the upstream outputs out into the copy)."""
    sets = [arg for k, v in overrides.items() for arg in ("-S", f"{k}={format_value(v)}")]
    copies = [arg for path in copy_paths for arg in ("-C", path)]
    forced = ["--force", "--single-item"] if force else []
    return [*_dvc(), "exp", "run", "--temp", "-n", name, *copies, *sets, *forced, *stages]


def stage_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment for DVC and its stage commands: this interpreter's bin first on PATH (so `asp stage`
    is the installed one), offline defaults inherited, plus `extra` (parent run id, Prefect run, store)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DVC_NO_ANALYTICS"] = "1"
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bars: \r noise in a log
    env.update(extra)
    return env


def _descendants(pid: int) -> list[Any]:
    """The processes under `pid` (the stage command under DVC), as `psutil.Process` objects."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "fish"})


def _is_wrapper_shell(proc: Any) -> bool:
    """Whether `proc` is the shell DVC runs a stage command through (``$SHELL -c CMD``) and the command runs under it.
    Such a shell is left to end with its command: stopped first (dash does not exec the command, bash does), it
    would end at once, and DVC, seeing the stage end, would remove its experiment copy while the stage still
    moves its progress out of it (`asp.stage.keep_progress_on_stop`)."""
    with contextlib.suppress(psutil.Error):
        return proc.name() in SHELLS and bool(proc.children())
    return False


def _signal(procs: Iterable[Any], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _wait_all(proc: subprocess.Popen, others: list[Any], timeout_s: float) -> bool:
    """Wait up to `timeout_s` for DVC (`proc`) and the processes that were under it; True when all have ended."""
    deadline = time.monotonic() + timeout_s
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return False
    _, alive = psutil.wait_procs(others, timeout=max(deadline - time.monotonic(), 0))
    return not alive


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the stage processes (DVC's descendants), then DVC itself; SIGKILL whatever is left after
    `grace_s`. Returns once DVC and every process that was under it have ended, so nothing writes into the
    workspace after it (the orchestrator may then put the stage's outputs back)."""
    tree = _descendants(proc.pid)
    _signal([p for p in tree if not _is_wrapper_shell(p)], signal.SIGTERM)
    if not tree:
        proc.terminate()
    if _wait_all(proc, tree, grace_s / 2):
        return
    if proc.poll() is None:
        proc.terminate()
    if _wait_all(proc, tree, grace_s / 2):
        return
    _signal([*tree, *_descendants(proc.pid)], signal.SIGKILL)
    proc.kill()
    proc.wait()
    _wait_all(proc, tree, 5.0)


RWLOCK = Path(".dvc") / "tmp" / "rwlock"  # DVC's record of which process reads / writes which path


def release_locks_of(root: str | Path, pids: Iterable[int]) -> int:
    """Remove from `root`'s DVC rwlock (``.dvc/tmp/rwlock``) every entry held by one of `pids` that has ended.

    A DVC process that is SIGTERMed or SIGKILLed never runs its `finally` that releases its entries, so they stay
    until a later DVC command finds the PID dead, warns "had been killed. Auto removed it from the lock file" and
    drops them one by one -- or, when the PID has been reused, refuses the paths as busy. The file is edited under
    DVC's own guard of it (``rwlock.lock``, `dvc.lock.make_lock`), as DVC edits it.

    Args:
        root: the DVC project's root.
        pids: the processes of the stopped DVC command (DVC itself and what ran under it).

    Returns:
        The number of entries removed (0 when there is no rwlock file or nothing of `pids` in it).
    """
    from dvc.lock import make_lock

    path = Path(root) / RWLOCK
    dead = {pid for pid in pids if not psutil.pid_exists(pid)}
    if not dead or not path.is_file():
        return 0
    with make_lock(str(path.with_name("rwlock.lock")), tmp_dir=str(path.parent), wait=True):
        try:
            lock = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return 0  # DVC itself reports an unreadable lock file, naming it
        removed = 0
        writes = lock.get("write", {})
        for target in [t for t, info in writes.items() if info.get("pid") in dead]:
            del writes[target]
            removed += 1
        reads = lock.get("read", {})
        for target, infos in list(reads.items()):
            kept = [info for info in infos if info.get("pid") not in dead]
            removed += len(infos) - len(kept)
            if kept:
                reads[target] = kept
            else:
                del reads[target]
        if removed:
            lock = {k: v for k, v in lock.items() if v}
            tmp = path.with_name(f"rwlock.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(lock), encoding="utf-8")
            os.replace(tmp, path)
    return removed


def run_streaming(
    cmd: list[str],
    *,
    env: Mapping[str, str],
    on_line: Callable[[str], None],
    timeout_s: float | None = None,
    cwd: str | Path | None = None,
    grace_s: float = STOP_GRACE_S,
) -> CommandResult:
    """Run `cmd` to the end, passing each output line (stdout and stderr, `\\r` progress split into lines) to
    `on_line`. Past `timeout_s` the stage is stopped (SIGTERM, then SIGKILL after `grace_s`) and the result says
    `timed_out`. An interrupt of this process (Ctrl-C, SIGTERM, a Prefect cancellation) stops it the same way and
    is re-raised after the stage has ended. A stop leaves DVC's rwlock as it found it (`release_locks_of`)."""
    t0 = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(
        cmd, env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    pending: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            for part in raw.replace("\r", "\n").splitlines():
                if part.strip():
                    pending.put(part.rstrip())
        pending.put(None)

    reader = threading.Thread(target=read, name="dvc-output", daemon=True)
    reader.start()
    timed_out = False
    stopped: set[int] = set()

    def stop(grace: float) -> None:
        stopped.update([proc.pid, *(p.pid for p in _descendants(proc.pid))])
        _stop(proc, grace)

    try:
        with sigterm_as_interrupt():
            while True:
                try:
                    line = pending.get(timeout=0.2)
                except queue.Empty:
                    if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                        timed_out = True
                        on_line(f"timeout: stopping after {timeout_s:g} s (orchestration.timeout_s)")
                        stop(grace_s)
                        break
                    continue
                if line is None:
                    break
                lines.append(line)
                on_line(line)
    except BaseException as exc:  # Ctrl-C, SIGTERM (Terminated), Prefect's cancellation / termination signal
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Terminated):
            # Ctrl-C in a terminal reached the whole process group: the stage is already ending its run KILLED
            # and DVC then exits; a SIGTERM now would cut that short. A second Ctrl-C stops them at once.
            tree = _descendants(proc.pid)
            stopped.update([proc.pid, *(p.pid for p in tree)])
            try:
                if not _wait_all(proc, tree, grace_s):
                    stop(INTERRUPT_GRACE_S)
            except KeyboardInterrupt:
                stop(INTERRUPT_GRACE_S)
        if proc.poll() is None:
            # a SIGTERM (a job scheduler, Prefect's cancellation) is followed by SIGKILL within ~30 s: stop sooner
            stop(min(grace_s, INTERRUPT_GRACE_S))
        stopped.add(proc.pid)  # DVC itself, also when a signal ended it before it was stopped here
        release_locks_of(cwd or ".", stopped)
        with contextlib.suppress(BaseException):  # what the stopped stage said last (what it kept): shown too
            _drain(reader, pending, lines, on_line, 2.0)
        raise
    rc = proc.wait()
    if stopped:
        release_locks_of(cwd or ".", stopped)
    _drain(reader, pending, lines, on_line, 5.0)
    return CommandResult(rc, time.monotonic() - t0, timed_out, tuple(lines))


def _drain(
    reader: threading.Thread, pending: queue.Queue, lines: list[str], on_line: Callable[[str], None], wait_s: float
) -> None:
    """Pass on the output lines still queued once the command has ended (waiting up to `wait_s` for its pipe)."""
    reader.join(wait_s)
    while not pending.empty():
        item = pending.get_nowait()
        if item is not None:
            lines.append(item)
            on_line(item)


# ---- the temporary copies of `dvc exp run --temp` ------------------------------------------------------------------
EXP_TMP = Path(".dvc") / "tmp" / "exps"  # DVC makes each temporary experiment copy in here (standalone/tmpXXXXXXXX/)


def experiment_copies(root: str | Path) -> set[Path]:
    """The temporary experiment copies now in `root`'s ``.dvc/tmp/exps`` (DVC's ``tmp*`` folders, directly in it or
    one level down: ``standalone/`` for `dvc exp run --temp`)."""
    folder = Path(root) / EXP_TMP
    found = [*folder.glob("tmp*"), *folder.glob("*/tmp*")] if folder.is_dir() else []
    return {p for p in found if p.is_dir()}


def remove_experiment_copies(root: str | Path, before: set[Path]) -> list[Path]:
    """Remove the copies made since `before` (`experiment_copies` when the experiment started): DVC removes its copy
    when an experiment ends, but not when it is stopped (SIGTERM, a cancellation, a timeout), and the copy (the
    outputs of every stage it ran: the policy, checkpoints) stayed until a later experiment succeeded. Call it after
    the DVC process has ended. Returns what was removed."""
    gone = sorted(experiment_copies(root) - before)
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


EXP_MARKS = Path(".dvc") / "tmp" / "asp-exps"  # one file per running `asp` experiment: its pid and its copy


def mark_experiment(root: str | Path, name: str, progress: Path | None = None) -> Path:
    """Record that this process runs experiment `name` (`note_copy` adds its temporary copy once DVC made it), so
    a later run can remove the copy if this one is killed with SIGKILL, which no handler sees (`clear_stale_copies`).
    """
    folder = Path(root) / EXP_MARKS
    folder.mkdir(parents=True, exist_ok=True)
    mark = folder / f"{os.getpid()}.{name}.json"
    record = {"pid": os.getpid(), "name": name, "copies": [], "progress": str(progress) if progress else None}
    mark.write_text(json.dumps(record))
    return mark


def note_copy(mark: Path, root: str | Path, before: set[Path]) -> bool:
    """Write the experiment's new temporary copies (made since `before`) into its mark; True once there is one."""
    made = sorted(experiment_copies(root) - before)
    if not made:
        return False
    record = json.loads(mark.read_text())
    record["copies"] = [str(p) for p in made]
    mark.write_text(json.dumps(record))
    return True


def clear_stale_copies(root: str | Path, keep: Callable[[Path, Path], list[str]] | None = None) -> list[str]:
    """Remove the temporary copies of experiments whose `asp` process died (SIGKILL, the OOM killer), with their
    marks; one line each for the log, saying what was removed and how large it was. `keep(copy, progress_dir)`
    first moves what the killed run would resume from out of the copy (the mark's progress folder)."""
    folder = Path(root) / EXP_MARKS
    lines = []
    for mark in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(mark.read_text())
            pid, name, copies = int(record["pid"]), str(record["name"]), [Path(p) for p in record["copies"]]
            progress = Path(record["progress"]) if record.get("progress") else None
        except (OSError, ValueError, KeyError, TypeError):
            mark.unlink(missing_ok=True)
            continue
        if pid_alive(pid):
            continue
        for copy in (c for c in copies if c.is_dir()):
            kept = keep(copy, progress) if keep is not None and progress is not None else []
            size = sum(f.stat().st_size for f in copy.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(copy, ignore_errors=True)
            base = Path(root).resolve()
            shown = copy.relative_to(base) if copy.is_relative_to(base) else copy
            lines.append(
                f"removed {shown} ({size / 2**20:.1f} MB): the temporary copy of DVC experiment {name}, whose run "
                f"(pid {pid}) was killed (SIGKILL) before it could remove it"
                + (f"; its progress ({', '.join(kept)}) is kept for the same run to resume" if kept else "")
            )
        mark.unlink(missing_ok=True)
    return lines
