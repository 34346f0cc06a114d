"""A lengths file (``profile.source: file``) that is missing or not committed is caught up front (issue 39, item 11):
`asp params check` and every pipeline run's request check (`asp.steps.lengths_file`), instead of DVC's raw
``[Errno 2]`` naming a temporary folder of the experiment. Runs in a real git repository with the project's params.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asp.errors import UserError
from asp.orchestration.request import RunRequest, check_request

ROOT = Path(__file__).resolve().parents[2]
FILE = "data/rollouts/mine.jsonl"
SET = ["--set", "profile.source=file", "--set", f"profile.lengths.path={FILE}"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with the project's params.yaml, dvc.yaml and configs/, committed."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "configs", root / "configs")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return root


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, timeout=60)


def _check(root: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "asp", "params", "check", *args]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)


def _write_rollouts(root: Path) -> None:
    (root / FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / FILE).write_text('{"prompt": "p", "length": 3}\n')


def test_missing_lengths_file_fails_params_check_naming_it(repo: Path) -> None:
    out = _check(repo, *SET)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"profile.lengths.path = '{FILE}': not found" in out.stderr and "dvc add" in out.stderr


def test_uncommitted_lengths_file_fails_a_set_run_and_is_a_note_otherwise(repo: Path) -> None:
    _write_rollouts(repo)
    out = _check(repo, *SET)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    first = out.stderr.splitlines()[0]
    assert f"{FILE} is not committed" in first and "reads committed files only" in first, first
    assert f"git add {FILE}" in first and f"dvc add {FILE}" in first
    overrides = {"profile.source": "file", "profile.lengths.path": FILE}
    with pytest.raises(UserError, match="is not committed"):  # asp repro --set / a Prefect run with overrides
        check_request(RunRequest(overrides=overrides), root=repo)
    raw = (repo / "params.yaml").read_text()  # the same params as a plain run: the work tree is read, a note
    plain = raw.replace("  source: generate", "  source: file", 1).replace(
        "    path: data/rollouts", f"    path: {FILE}", 1
    )
    assert plain != raw
    (repo / "params.yaml").write_text(plain)
    out = _check(repo)
    assert out.returncode == 0, out.stderr
    assert f"note: profile.lengths.path = '{FILE}': {FILE} is not committed" in out.stdout
    check_request(RunRequest(), root=repo)


@pytest.mark.parametrize("how", ["git", "dvc"])
def test_committed_lengths_file_passes(repo: Path, how: str) -> None:
    _write_rollouts(repo)
    if how == "git":
        _git(repo, "add", FILE)
    else:  # what `dvc add` leaves: a pointer beside it (the file itself is ignored by git)
        (repo / f"{FILE}.dvc").write_text("outs:\n- md5: 0\n  path: mine.jsonl\n")
    out = _check(repo, *SET)
    assert out.returncode == 0, out.stderr
    assert "not committed" not in out.stdout
