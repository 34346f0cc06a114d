"""Whether a stage's input files can be read, checked before the stage computes anything.

A Parquet file cut short (a full disk, an interrupted copy, `truncate`) or a JSON file that is not JSON would
otherwise stop a stage minutes in with pyarrow's or json's traceback. `damaged(path)` reads the file whole (Parquet:
every page, so a truncated footer and a damaged page are both found; JSON: parsed) and says what is wrong, or None;
`damaged_files(paths)` does it for files and the Parquet and JSON files under folders.

    for path, why in damaged_files([Path("outputs/schedule"), Path("outputs/calibration.json")]):
        print(f"{path}: {why}")

`asp.stage.check_stage_inputs` applies it to the outputs of other stages that a stage depends on (dvc.yaml's deps).
Tests: tests/test_stage_inputs.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

CHECKED_SUFFIXES = (".parquet", ".json")


def damaged(path: Path) -> str | None:
    """What is wrong with a Parquet or JSON file (it cannot be read whole), or None when it reads."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_table(path)
        elif path.suffix == ".json":
            json.loads(path.read_bytes())
    except PermissionError as exc:  # (pyarrow's own errors may be OSErrors too: those are damage)
        return f"cannot be read ({exc.strerror or exc})"
    except Exception as exc:  # pyarrow.ArrowInvalid and friends, json.JSONDecodeError, UnicodeDecodeError
        kind = "Parquet" if path.suffix == ".parquet" else "JSON"
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        return f"not a readable {kind} file ({reason})"
    return None


def _files(path: Path) -> Iterator[Path]:
    if path.is_file():
        if path.suffix in CHECKED_SUFFIXES:
            yield path
    elif path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.suffix in CHECKED_SUFFIXES and p.is_file())


def damaged_files(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """(file, what is wrong) for every damaged Parquet / JSON file among `paths` and under the folders among them;
    missing paths are skipped (the stage says what to run for those)."""
    return [(f, why) for path in paths for f in _files(path) if (why := damaged(f)) is not None]
