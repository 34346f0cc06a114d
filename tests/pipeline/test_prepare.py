"""prepare: each input format, bad rows (error names the row / drop counts), seeded disjoint splits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.config import PrepareParams
from asp.errors import UserError
from asp.pipeline import prepare
from asp.tracking import NullTracker

from .conftest import make_params

ROOT = Path(__file__).resolve().parents[2]
RECORDS = [
    {"problem": "What is 1+1?", "answer": "2", "difficulty": 1.0},
    {"problem": "What is 2+3?", "answer": "5"},
    {"problem": "Solve x+1=3.", "answer": "2", "extra": [1, 2]},
]


def _write(tmp_path: Path, fmt: str, records: list[dict]) -> Path:
    path = tmp_path / f"prompts.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(records))
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    else:
        pd.DataFrame.from_records([{k: r.get(k) for k in ("problem", "answer")} for r in records]).to_parquet(path)
    return path


@pytest.mark.parametrize("fmt", ["json", "jsonl", "parquet"])
def test_each_format_reads_the_same_rows(tmp_path: Path, fmt: str) -> None:
    df = prepare.read_records(_write(tmp_path, fmt, RECORDS))
    clean, counts = prepare.clean_rows(df, PrepareParams(), "f")
    assert clean["problem"].tolist() == [r["problem"] for r in RECORDS]
    assert clean["answer"].tolist() == ["2", "5", "2"]
    assert clean["prompt_id"].tolist() == ["p0000000", "p0000001", "p0000002"]
    assert counts == {"dropped": 0}


def test_real_deepscaler_files_load() -> None:
    for name, n in [("deepscaler_aime_train.json", 975), ("deepscaler_math_train.json", 7474)]:
        raw = prepare.read_records(ROOT / "data" / name)
        clean, counts = prepare.clean_rows(raw, PrepareParams(bad_rows="drop"), name)
        assert len(clean) + counts["dropped"] == n and len(clean) > 0.99 * n


BAD = [
    {"problem": "ok", "answer": "1", "id": "a"},
    {"problem": "   ", "answer": "1", "id": "b"},  # row 1: empty prompt
    {"answer": "1", "id": "c"},  # row 2: missing problem
    {"problem": "ok2", "id": "d"},  # row 3: missing answer
    {"problem": "ok3", "answer": "1", "id": "a"},  # row 4: duplicate id
    {"problem": "ok4", "answer": "7", "id": "e"},
]


def test_bad_rows_error_names_first_bad_row(tmp_path: Path) -> None:
    path = _write(tmp_path, "jsonl", BAD)
    with pytest.raises(UserError, match=r"row 1 \(id 'b'\) is invalid: empty or missing 'problem'.*bad_rows: drop"):
        prepare.clean_rows(prepare.read_records(path), PrepareParams(id_field="id"), str(path))


def test_bad_rows_drop_counts_each_reason(tmp_path: Path) -> None:
    path = _write(tmp_path, "json", BAD)
    clean, counts = prepare.clean_rows(prepare.read_records(path), PrepareParams(id_field="id", bad_rows="drop"), "f")
    assert clean["prompt_id"].tolist() == ["a", "e"]
    assert counts == {"dropped": 4, "dropped_empty_or_missing": 2, "dropped_missing": 1, "dropped_duplicate_id": 1}


def test_missing_field_and_bad_files(tmp_path: Path) -> None:
    path = _write(tmp_path, "json", RECORDS)
    with pytest.raises(UserError, match="no 'question' field.*problem_field"):
        prepare.clean_rows(prepare.read_records(path), PrepareParams(problem_field="question"), str(path))
    with pytest.raises(UserError, match="dataset file not found"):
        prepare.read_records(tmp_path / "nope.json")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="unsupported file type '.csv'"):
        prepare.read_records(tmp_path / "x.csv")
    (tmp_path / "broken.jsonl").write_text('{"problem": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(UserError, match="line 2 is not valid JSON"):
        prepare.read_records(tmp_path / "broken.jsonl")
    (tmp_path / "obj.json").write_text('{"problem": "a"}')
    with pytest.raises(UserError, match="expected a list of JSON objects"):
        prepare.read_records(tmp_path / "obj.json")


def test_split_is_seeded_disjoint_and_sized() -> None:
    roles = prepare.split_roles(100, 20, 10, seed=3)
    assert (roles == "profile").sum() == 20 and (roles == "heldout").sum() == 10
    assert np.array_equal(roles, prepare.split_roles(100, 20, 10, seed=3))
    assert not np.array_equal(roles, prepare.split_roles(100, 20, 10, seed=4))
    with pytest.raises(UserError, match="exceeds the 25 valid prompts"):
        prepare.split_roles(25, 20, 10, seed=0)


def test_format_prompts_without_template_keeps_text() -> None:
    assert prepare.format_prompts(["a", "b"], None, True, None) == ["a", "b"]
    assert prepare.format_prompts(["a"], None, False, "sys") == ["sys\n\na"]


def test_run_writes_three_parquets_without_partial_files(tmp_path: Path) -> None:
    data = _write(tmp_path, "jsonl", [{"problem": f"q{i}", "answer": str(i)} for i in range(40)])
    params = make_params(
        {"prepare": {"dataset": str(data), "profile_prompts": 10, "heldout_prompts": 5, "chat_template": False}}
    )
    paths = prepare.Paths(policy=tmp_path / "nopolicy", out_dir=tmp_path / "out", metrics=tmp_path / "m.json")
    metrics = prepare.run(params, paths, NullTracker())
    train = pd.read_parquet(paths.out_dir / "train.parquet")
    prof = pd.read_parquet(paths.out_dir / "profile.parquet")
    held = pd.read_parquet(paths.out_dir / "heldout.parquet")
    assert len(train) == 40 and len(prof) == 10 and len(held) == 5
    assert set(prof.prompt_id).isdisjoint(held.prompt_id) and set(prof.prompt_id) <= set(train.prompt_id)
    assert metrics["prepare/prompts"] == 40
    assert sorted(p.name for p in paths.out_dir.iterdir()) == ["heldout.parquet", "profile.parquet", "train.parquet"]
