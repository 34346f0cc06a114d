"""Atomic file writers and the JSON readers the stages share (re-exported by `asp.io`): `read_user_json` and
`read_user_jsonl` read a user's dataset or rollouts file (one `UserError` naming the line of bad JSON).

Nothing is half-written: every writer writes to a temporary name in the same directory and renames; on an error
the temporary files and the directories the writer created are removed. `atomic_paths` does the same for several
outputs at once (all are renamed into place, or none). JSON is always valid JSON: a non-finite float (NaN, an
undefined metric such as a mean over nothing; or +-inf) is written as null, never as NaN/Infinity.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from asp.errors import UserError


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `path` only if the block succeeds.

    Works for files and directories (the block creates whichever it wants at the yielded path).
    """
    path = Path(path)
    created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except BaseException:
        _remove_empty(created)
        raise
    target = tmp / path.name
    try:
        yield target
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(target, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_empty(dirs: list[Path]) -> None:
    """Remove the directories a failed write created (deepest first), if they are still empty."""
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """`atomic_path` for several outputs: yields one temporary path per output; all are renamed into place only if
    the block succeeds, none if it raises."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_path(p)) for p in paths]


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    """Write a DataFrame to Parquet atomically (no index)."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def json_safe(obj: Any) -> Any:
    """`obj` with numpy scalars / arrays as Python values and every non-finite float (NaN, +-inf) as None.

    JSON has no NaN or Infinity (Python's json module writes them anyway, giving files other parsers reject).
    """
    if isinstance(obj, dict):
        return {key: json_safe(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(value) for value in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, str | bytes):  # numpy arrays and scalars
        return json_safe(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(obj: Any) -> str:
    """Strict JSON text of `obj` (see `json_safe`), pretty-printed with sorted keys and a final newline."""
    return json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False, default=_number) + "\n"


def _number(obj: Any) -> float | None:
    """Fallback for objects json cannot write (Decimal, ...): their float value, None when not finite."""
    value = float(obj)
    return value if math.isfinite(value) else None


def write_json(obj: Any, path: str | Path) -> None:
    """Write JSON atomically, pretty-printed with sorted keys; non-finite floats are written as null."""
    with atomic_path(path) as tmp:
        tmp.write_text(json_text(obj))


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text())


def read_json_lines(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file that its writers append to, in order ([] when it does not exist); a
    line that is not a whole JSON object (cut short by a kill mid-append) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_user_jsonl(path: Path) -> list[tuple[int, Any]]:
    """A user's JSON-lines file (UTF-8): ``(line number, value)`` of every line that is not blank, in order.

    Raises:
        UserError: bytes that are not UTF-8 (`read_utf8_text`), or a line that is not valid JSON (named).
    """
    values = []
    for lineno, line in enumerate(read_utf8_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            values.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: line {lineno} is not valid JSON ({exc.msg}). Fix or remove it.") from None
    return values


def read_user_json(path: Path) -> Any:
    """A user's JSON file (UTF-8): its value, with an object whose ``data`` is a list read as that list (the
    shape of dataset exports such as ``{"data": [...]}``).

    Raises:
        UserError: bytes that are not UTF-8 (`read_utf8_text`), or text that is not valid JSON (line named).
    """
    try:
        data = json.loads(read_utf8_text(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}).") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    return data


def read_utf8_text(path: Path) -> str:
    """The file decoded as UTF-8 (a leading byte-order mark is skipped); UserError naming the first bad byte."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        lineno, column = data.count(b"\n", 0, exc.start) + 1, exc.start - line_start + 1
        raise UserError(
            f"{path}: line {lineno}, byte {column} of that line (byte 0x{data[exc.start]:02x}) is not valid UTF-8. "
            "JSON/JSONL datasets must be UTF-8: re-encode the file (e.g. `iconv -f latin1 -t utf-8 IN > OUT` "
            "if it is Latin-1) or fix that line."
        ) from None
