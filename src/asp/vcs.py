"""Git facts for run records: the commit a run used, whether the tree was dirty, refs and a file of a commit.

Every function returns '' / None outside a git repository or without git, so tracking never fails over it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git(*args: str, cwd: str | Path = ".") -> str:
    """Output of `git ARGS` (stripped); '' when git or the repository is missing or the command fails."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def commit(cwd: str | Path = ".") -> str:
    """The commit the code in `cwd` comes from: DVC's baseline inside a `dvc exp run` (DVC_EXP_BASELINE_REV),
    else HEAD; '' outside git."""
    return os.environ.get("DVC_EXP_BASELINE_REV") or git("rev-parse", "HEAD", cwd=cwd)


PIPELINE_STATE = ("params.yaml", "dvc.lock", "metrics")


def dirty(cwd: str | Path = ".") -> bool:
    """Whether tracked files differ from HEAD. Untracked files and the pipeline's own state (params.yaml, whose
    values every run logs, and dvc.lock and metrics/, which runs write) do not count, so a `dvc exp run -S` or a
    finished run does not make the code look modified."""
    excludes = [f":(exclude){p}" for p in PIPELINE_STATE]
    return bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", *excludes, cwd=cwd))


def commit_label(cwd: str | Path = ".") -> str:
    """The short commit of HEAD, with `*` when tracked files have uncommitted changes ('' outside git)."""
    sha = git("rev-parse", "--short", "HEAD", cwd=cwd)
    return sha + "*" if sha and dirty(cwd) else sha


def experiment_ref(name: str, cwd: str | Path = ".") -> str | None:
    """The git ref DVC stored experiment `name` under (refs/exps/.../NAME), or None."""
    refs = git("for-each-ref", "--format=%(refname)", "refs/exps/", cwd=cwd).splitlines()
    found = [r for r in refs if r.rsplit("/", 1)[-1] == name]
    return found[-1] if found else None


def file_at(ref: str, path: str, cwd: str | Path = ".") -> str | None:
    """The text of `path` in commit `ref`, or None."""
    try:
        out = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None
