"""Small file helpers shared by the stages: atomic writes of Parquet, JSON, YAML and whole directories.

Nothing is half-written: every writer writes to a temporary name in the same directory and renames.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `path` only if the block succeeds.

    Works for files and directories (the block creates whichever it wants at the yielded path).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    target = tmp / path.name
    try:
        yield target
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    """Write a DataFrame to Parquet atomically (no index)."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def write_json(obj: Any, path: str | Path) -> None:
    """Write JSON atomically, pretty-printed with sorted keys."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text())
