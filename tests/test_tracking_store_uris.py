"""Tracking stores that used to fail late or loudly (issue 39, item 10) get one message and exit 2 within seconds.

A folder as MLFLOW_TRACKING_URI (a bare path or ``file:///``, MLflow's filesystem backend, refused by MLflow 3), an
SQLite store whose folder cannot be created, and an existing store that cannot be opened for writing (tried, so it
holds for root on a read-only mount too) are refused by `asp.tracking.check_store` before a stage computes anything;
a 0-byte ``mlflow.db`` is a warning. The stage runs for real (`asp stage prepare` in a copy of the project's layout).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asp.errors import UserError
from asp.tracking import PARENT_ENV, check_store
from asp.tracking import store as store_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """dvc.yaml, stages/ and params.yaml of the repository in a fresh folder (no outputs)."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "stages", root / "stages")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, root / name)
    return root


def _stage(project: Path, uri: str, prefix: list[str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in (PARENT_ENV, "MLFLOW_ALLOW_FILE_STORE")}
    env.update(MLFLOW_TRACKING_URI=uri, ASP_PROGRESS="0")
    started = time.monotonic()
    cmd = [*(prefix or []), sys.executable, "-m", "asp", "stage", "prepare"]
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return done, time.monotonic() - started


@pytest.mark.parametrize("form", ["path", "file-uri"])
@pytest.mark.parametrize("exists", [True, False])
def test_folder_store_exits_2_with_the_sqlite_uri_to_use(
    project: Path, tmp_path: Path, form: str, exists: bool
) -> None:
    folder = tmp_path / "mlruns"
    if exists:
        folder.mkdir()
    uri = str(folder) if form == "path" else folder.as_uri()
    out, took = _stage(project, uri)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    first = out.stderr.splitlines()[0]
    what = "is a folder" if exists else f"is a path ({folder} does not exist) read as a folder"  # not "a folder"
    assert f"the MLflow store {uri} (MLFLOW_TRACKING_URI or common.tracking_uri) {what}, MLflow's" in first, first
    assert f"MLFLOW_TRACKING_URI=sqlite:///{folder}/mlflow.db" in first
    assert took < 60 and not (project / "outputs").exists()


def test_store_folder_that_cannot_be_created_exits_2(project: Path) -> None:
    store = Path("/proc/asp-no-such-folder/store/mlflow.db")  # /proc takes no new folder, not even from root
    out, took = _stage(project, f"sqlite:///{store}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    first = out.stderr.splitlines()[0]
    assert f"cannot be created: the folder {store.parent} cannot be made" in first, first
    assert took < 60


def test_unwritable_store_is_refused_by_trying_not_by_permission_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.access says yes to root for any file; the check opens the file for writing instead (here: made to fail as
    on a read-only mount, where root cannot write either)."""
    db = tmp_path / "mlflow.db"
    import sqlite3

    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    real_open = Path.open

    def read_only_mount(self: Path, mode: str = "r", *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if self == db and mode.replace("b", "") != "r":
            raise OSError(30, "Read-only file system", str(self))
        return real_open(self, mode, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", read_only_mount)
    started = time.monotonic()
    with pytest.raises(UserError, match=r"is on a read-only filesystem \(a read-only mount\)") as err:
        check_store(f"sqlite:///{db}")
    assert "chmod" not in str(err.value)  # permissions cannot help on a read-only mount
    assert time.monotonic() - started < 10


def test_empty_store_file_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="asp.tracking"):
        check_store(f"sqlite:///{db}")
    assert any(f"{db} is empty (0 bytes)" in r.getMessage() for r in caplog.records), caplog.text


def test_other_stores_are_left_to_mlflow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert store_module.file_store_problem("http://127.0.0.1:5000") is None
    assert store_module.file_store_problem("databricks") is None
    assert store_module.file_store_problem("postgresql://u@h/db") is None
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the user opted into MLflow's folder backend
    assert store_module.file_store_problem(str(tmp_path)) is None
