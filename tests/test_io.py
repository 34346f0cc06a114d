"""asp.io: JSON is always strict JSON (non-finite floats as null), and failed writes leave nothing behind."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp import io


def strict_load(path: Path) -> object:
    def reject(token: str) -> None:
        raise AssertionError(f"{path} holds {token}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=reject)


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_write_json_writes_non_finite_floats_as_null(tmp_path: Path) -> None:
    obj = {
        "nan": float("nan"),
        "inf": math.inf,
        "ninf": -math.inf,
        "np_nan": np.float64("nan"),
        "np_int": np.int64(3),
        "np_bool": np.bool_(True),
        "array": np.array([1.5, np.nan, np.inf]),
        "nested": [{"x": (1.0, float("nan"))}],
        "decimal": Decimal("2.5"),
        "ok": 0.25,
    }
    io.write_json(obj, tmp_path / "m.json")
    assert strict_load(tmp_path / "m.json") == {
        "nan": None,
        "inf": None,
        "ninf": None,
        "np_nan": None,
        "np_int": 3,
        "np_bool": True,
        "array": [1.5, None, None],
        "nested": [{"x": [1.0, None]}],
        "decimal": 2.5,
        "ok": 0.25,
    }
    assert (tmp_path / "m.json").read_text().endswith("}\n")


def test_failed_json_write_leaves_no_file_temp_or_new_directory(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "m.json"
    with pytest.raises(TypeError):
        io.write_json({"x": object()}, target)
    assert tree(tmp_path) == set()


def test_atomic_path_replaces_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_text("new")
        raise RuntimeError("boom")
    assert target.read_text() == "old" and tree(tmp_path) == {"a.txt"}


def test_atomic_paths_write_all_or_none(tmp_path: Path) -> None:
    a, b = tmp_path / "out" / "a.parquet", tmp_path / "b.json"
    with pytest.raises(OSError), io.atomic_paths(a, b) as (ta, tb):
        pd.DataFrame({"x": [1]}).to_parquet(ta)
        tb.write_text("{}")
        raise OSError(28, "No space left on device")
    assert tree(tmp_path) == set()
    with io.atomic_paths(a, b) as (ta, tb):
        pd.DataFrame({"x": [1]}).to_parquet(ta)
        tb.write_text("{}")
    assert tree(tmp_path) == {"out", "out/a.parquet", "b.json"}
    assert pd.read_parquet(a)["x"].tolist() == [1]


def test_user_json_readers_name_the_bad_line_and_unwrap_data(tmp_path: Path) -> None:
    from asp.errors import UserError

    lines = tmp_path / "d.jsonl"
    lines.write_text('{"a": 1}\n\n[2]\n')
    assert io.read_user_jsonl(lines) == [(1, {"a": 1}), (3, [2])]  # blank lines skipped, values as they are
    lines.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(UserError, match=r"d\.jsonl: line 2 is not valid JSON"):
        io.read_user_jsonl(lines)
    whole = tmp_path / "d.json"
    whole.write_text('{"data": [{"a": 1}]}')
    assert io.read_user_json(whole) == [{"a": 1}]
    whole.write_text('{"data": 3}')
    assert io.read_user_json(whole) == {"data": 3}  # only a list under "data" is unwrapped
    whole.write_text('[{"a": 1},\n oops]')
    with pytest.raises(UserError, match=r"d\.json: not valid JSON \(line 2: "):
        io.read_user_json(whole)
