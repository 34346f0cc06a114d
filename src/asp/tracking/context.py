"""Where a run comes from, in MLflow's own system tags, and names that tell runs apart.

MLflow's UI reads a run's origin from its system tags (the fluent API sets them itself; runs made through an
explicit `MlflowClient`, as here, get them from `context_tags`): `mlflow.source.name` and `mlflow.source.type`
(the Source column: the type's icon and the name, shown from its last `/`), `mlflow.source.git.commit` (the
Version column and the run page's commit), `mlflow.source.git.branch` / `.repoURL` / `.dirty`, `mlflow.user`; and
a description in `mlflow.note.content` (Markdown, the run page's Description). Tags under `mlflow.` are MLflow's
and its UI keeps them out of the user-facing tag lists.

    context_tags(source=("asp repro", "LOCAL"))   # {"mlflow.source.name": "asp repro", ..., "mlflow.user": ...}
    stamped("840e457 demo all")                   # "840e457 demo all @ 05-14 10:32:07" (local start time)
"""

from __future__ import annotations

import getpass
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from asp import vcs
from asp.tracking.protocol import PREFECT_RUN_ENV, PREFECT_URL_ENV

NOTE_TAG = "mlflow.note.content"
SOURCE_TYPES = ("LOCAL", "JOB", "NOTEBOOK", "PROJECT", "UNKNOWN")  # mlflow.entities.SourceType's names
STAMP_FORMAT = "%m-%d %H:%M:%S"


def stamped(label: str, when: float | None = None) -> str:
    """`label @ MM-DD HH:MM:SS` (`when`, seconds since the epoch, in local time; default now): the name of a run,
    so two runs of the same thing (an up-to-date Quick run twice, `make run` again) get different names."""
    return f"{label} @ {time.strftime(STAMP_FORMAT, time.localtime(when))}"


def default_source() -> tuple[str, str]:
    """What MLflow's fluent API records for a run it starts: the script this process runs (`sys.argv[0]`, relative
    to the working directory when inside it) and type LOCAL."""
    main = sys.argv[0] if sys.argv and sys.argv[0] else "<console>"
    path = Path(main)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        main = str(path.relative_to(Path.cwd()))
    return main, "LOCAL"


def _public_url(url: str) -> str:
    """A git remote's URL without credentials (`https://user:token@host/x` -> `https://host/x`)."""
    parts = urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return url


def git_tags(cwd: str | Path = ".") -> dict[str, str]:
    """MLflow's git tags of the code in `cwd`: commit (DVC's baseline inside `dvc exp run`), whether tracked code
    differs from it (`asp.vcs.dirty`), branch and remote URL when there are any; {} outside git."""
    sha = vcs.commit(cwd)
    if not sha:
        return {}
    tags = {"mlflow.source.git.commit": sha, "mlflow.source.git.dirty": str(vcs.dirty(cwd)).lower()}
    branch = vcs.git("rev-parse", "--abbrev-ref", "HEAD", cwd=cwd)
    if branch and branch != "HEAD":  # HEAD: detached (a DVC experiment's temporary copy, a CI checkout)
        tags["mlflow.source.git.branch"] = branch
    remote = vcs.git("config", "--get", "remote.origin.url", cwd=cwd)
    if remote:
        tags["mlflow.source.git.repoURL"] = _public_url(remote)
    return tags


def context_tags(cwd: str | Path = ".", source: tuple[str, str] | None = None) -> dict[str, str]:
    """Where a run comes from: MLflow's source tags (`source`: (name, type), e.g. ("asp repro", "LOCAL"); default
    what MLflow records itself, `default_source`), its git tags (`git_tags`) and user, the DVC experiment
    (`asp.dvc_exp`, set by `dvc exp run` in DVC_EXP_NAME) and the Prefect flow run that started it
    (`asp.prefect_flow_run_id` / `_url`, set by the orchestrator)."""
    name, kind = source or default_source()
    if kind not in SOURCE_TYPES:
        raise ValueError(f"source type {kind!r} is not one of MLflow's: {', '.join(SOURCE_TYPES)}")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    tags = {"mlflow.user": user, "mlflow.source.name": name, "mlflow.source.type": kind, **git_tags(cwd)}
    for env, tag in (
        ("DVC_EXP_NAME", "asp.dvc_exp"),
        (PREFECT_RUN_ENV, "asp.prefect_flow_run_id"),
        (PREFECT_URL_ENV, "asp.prefect_flow_run_url"),
    ):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    return tags
