"""prepare: each input format, bad rows (error names the row / drop counts), seeded disjoint splits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp.config import PrepareParams
from asp.errors import UserError
from asp.pipeline import prepare
from asp.tracking import NullTracker

from .conftest import Built, make_params

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
    with pytest.raises(UserError, match=r"row 1 \(id 'b'\) is invalid: empty 'problem' \(only whitespace\).*bad_rows"):
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
    (tmp_path / "bare.jsonl").write_text('{"problem": "a", "answer": "1"}\n"just a string"\n')
    with pytest.raises(UserError, match=r"bare.jsonl: line 2 is a JSON string, not an object"):  # the line, named
        prepare.read_records(tmp_path / "bare.jsonl")
    (tmp_path / "mixed.json").write_text('[{"problem": "a", "answer": "1"}, 7]')
    with pytest.raises(UserError, match=r"record 1 \(0-based\) of the list is a JSON number"):
        prepare.read_records(tmp_path / "mixed.json")


def _stage_prepare(tmp_path: Path, dataset: str) -> subprocess.CompletedProcess:
    """`asp stage prepare` in a directory laid out like the repository, on `dataset` (rows are checked before the
    policy is needed, so no policy is built)."""
    import yaml

    project = tmp_path / "project"
    shutil.copytree(ROOT / "stages", project / "stages")
    shutil.copy(ROOT / "dvc.yaml", project / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["dataset"] = dataset
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ, ASP_TRACKING="0")
    cmd = [sys.executable, "-m", "asp", "stage", "prepare"]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=120)


ROW_HINT = ". Fix the row, or set prepare.bad_rows: drop to drop such rows and count them."


@pytest.mark.parametrize(
    ("name", "text", "first"),
    [
        (
            "int.jsonl",
            '{"problem": "1+1?", "answer": "2"}\n{"problem": 42, "answer": "3"}\n',
            "row 1 (id 'p0000001') is invalid: 'problem' is int 42, not text (quote it in the file)" + ROW_HINT,
        ),
        (
            "null.json",
            '[{"problem": null, "answer": "3"}]',
            "row 0 (id 'p0000000') is invalid: missing 'problem'" + ROW_HINT,
        ),
        ("empty.json", "[]", "the dataset holds no records. Point prepare.dataset at a file with prompts."),
        ("empty.jsonl", "\n\n", "the dataset holds no records. Point prepare.dataset at a file with prompts."),
        ("objects.json", "[{}, {}]", "all 2 records are empty objects; each needs a problem and an answer."),
    ],
)
def test_bad_datasets_are_named_for_what_they_are(tmp_path: Path, name: str, text: str, first: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    out = _stage_prepare(tmp_path, str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[0] == f"error: {path}: {first}", out.stderr
    assert not (tmp_path / "project" / "outputs").exists()


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


def test_run_writes_three_parquets_without_partial_files(tmp_path: Path, demo_policy: Built) -> None:
    data = _write(tmp_path, "jsonl", [{"problem": f"q{i}", "answer": str(i)} for i in range(40)])
    params = make_params(
        {"prepare": {"dataset": str(data), "profile_prompts": 10, "heldout_prompts": 5, "chat_template": False}}
    )
    paths = _paths(tmp_path, demo_policy)
    metrics = prepare.run(params, paths, NullTracker())
    train = pd.read_parquet(paths.out_dir / "train.parquet")
    prof = pd.read_parquet(paths.out_dir / "profile.parquet")
    held = pd.read_parquet(paths.out_dir / "heldout.parquet")
    assert len(train) == 40 and len(prof) == 10 and len(held) == 5
    assert set(prof.prompt_id).isdisjoint(held.prompt_id) and set(prof.prompt_id) <= set(train.prompt_id)
    assert metrics["prepare/prompts"] == 40
    assert sorted(p.name for p in paths.out_dir.iterdir()) == ["heldout.parquet", "profile.parquet", "train.parquet"]
    assert metrics["prepare/dropped_too_long"] == 0 and metrics["prepare/prompt_token_limit"] == 512 - 160
    assert metrics["prepare/prompt_tokens_max"] == 3  # "q39": one token per character, no template


def _paths(tmp_path: Path, demo_policy: Built) -> prepare.Paths:
    return prepare.Paths(policy=demo_policy.paths.out_dir, out_dir=tmp_path / "out", metrics=tmp_path / "m.json")


def _assert_nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.json").exists()


# Each bad file: (file name, bytes, what the message must name). 0xe9 is a Latin-1 "é".
BAD_FILES = [
    ("latin1.jsonl", b'{"problem": "a", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n', "line 2, byte 17"),
    (
        "latin1.json",
        b'[\n {"problem": "a", "answer": "1"},\n {"problem": "\xff", "answer": "2"}\n]',
        "line 3, byte 15",
    ),
    ("empty.parquet", b"", "Parquet file size is 0 bytes"),
    ("garbage.parquet", b"PAR1 this is not a parquet file", "not a readable Parquet file"),
]


@pytest.mark.parametrize(("name", "data", "where"), BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_unreadable_files_are_one_user_error(tmp_path: Path, name: str, data: bytes, where: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(UserError) as err:
        prepare.read_records(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and where in message
    assert ("iconv" in message) if name.endswith("json") or name.endswith("jsonl") else ("export it again" in message)


def test_truncated_parquet_is_a_user_error(tmp_path: Path) -> None:
    whole = tmp_path / "whole.parquet"
    pd.DataFrame({"problem": [f"q{i}" for i in range(200)], "answer": ["1"] * 200}).to_parquet(whole)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[:-40])  # an interrupted copy
    with pytest.raises(UserError, match=rf"^{cut}: not a readable Parquet file .*truncated or corrupt"):
        prepare.read_records(cut)


def test_utf8_with_bom_and_crlf_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"problem": "caf\xc3\xa9", "answer": "1"}\r\n{"problem": "b", "answer": "2"}\r\n')
    assert prepare.read_records(path)["problem"].tolist() == ["café", "b"]


def _deepscaler_subset(tmp_path: Path, n: int = 12) -> Path:
    """The first n DeepScaleR problems; with the demo policy (512 positions, 160 response tokens) rows 1 and 8 are
    too long: 496 and 680 tokens (one token per byte, plus the template's 3 markers)."""
    records = json.loads((ROOT / "data" / "deepscaler_math_train.json").read_text())[:n]
    return _write(tmp_path, "jsonl", [{"problem": r["problem"], "answer": r["answer"]} for r in records])


def test_prompt_longer_than_policy_context_is_rejected_by_id(tmp_path: Path, demo_policy: Built) -> None:
    data = _deepscaler_subset(tmp_path)
    params = make_params({"prepare": {"dataset": str(data), "profile_prompts": 2, "heldout_prompts": 2}})
    with pytest.raises(UserError) as err:
        prepare.run(params, _paths(tmp_path, demo_policy), NullTracker())
    message = str(err.value)
    assert message.startswith(f"{data}: 2 prompts are too long for the policy's context: ")
    assert "'p0000001' (496 tokens), 'p0000008' (680 tokens)" in message
    assert "at most 352 tokens" in message and "max_position_embeddings 512" in message
    assert "prepare.bad_rows: drop" in message
    _assert_nothing_written(tmp_path)


def test_response_budget_is_the_larger_max_new_tokens(tmp_path: Path, demo_policy: Built) -> None:
    """runtime.sampling.max_new_tokens 300 > profile's 160: 512 - 300 = 212 tokens left, so row 0 (286 tokens) fails
    too."""
    data = _deepscaler_subset(tmp_path, n=3)
    params = make_params(
        {
            "prepare": {"dataset": str(data), "profile_prompts": 2, "heldout_prompts": 2},
            "runtime": {"sampling": {"max_new_tokens": 300}},
        }
    )
    with pytest.raises(UserError, match=r"'p0000000' \(286 tokens\).*at most 212 tokens.*minus 300 response"):
        prepare.run(params, _paths(tmp_path, demo_policy), NullTracker())
    params = make_params({"prepare": {"dataset": str(data)}, "profile": {"max_new_tokens": 512}})
    with pytest.raises(UserError, match="leaves no room for a prompt next to responses of up to 512 tokens"):
        prepare.run(params, _paths(tmp_path, demo_policy), NullTracker())
    _assert_nothing_written(tmp_path)


def test_too_long_prompts_dropped_and_counted(tmp_path: Path, demo_policy: Built) -> None:
    data = _deepscaler_subset(tmp_path)
    params = make_params(
        {"prepare": {"dataset": str(data), "profile_prompts": 2, "heldout_prompts": 2, "bad_rows": "drop"}}
    )
    paths = _paths(tmp_path, demo_policy)
    metrics = prepare.run(params, paths, NullTracker())
    train = pd.read_parquet(paths.out_dir / "train.parquet")
    assert "p0000001" not in set(train.prompt_id) and "p0000008" not in set(train.prompt_id) and len(train) == 10
    assert metrics["prepare/dropped_too_long"] == 2 and metrics["prepare/dropped"] == 2
    assert metrics["prepare/prompt_tokens_max"] <= metrics["prepare/prompt_token_limit"] == 352
    assert json.loads(paths.metrics.read_text())["prepare/dropped_too_long"] == 2


def test_huge_prompt_is_rejected_in_seconds(tmp_path: Path, demo_policy: Built) -> None:
    """A 5 MB prompt is rejected from its character count (tokenizing it would take ~40 s), with a lower bound."""
    records = [{"problem": f"q{i}", "answer": "1"} for i in range(6)] + [{"problem": "7 " * 2_500_000, "answer": "1"}]
    data = _write(tmp_path, "jsonl", records)
    params = make_params({"prepare": {"dataset": str(data), "profile_prompts": 2, "heldout_prompts": 2}})
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"1 prompt is too long.*'p0000006' \(at least \d{6} tokens\)"):
        prepare.run(params, _paths(tmp_path, demo_policy), NullTracker())
    assert time.perf_counter() - start < 5
    _assert_nothing_written(tmp_path)


def test_token_counts_bound_is_safe() -> None:
    """Prompts just over the character bound get a lower bound above the limit; the rest are counted exactly."""
    from asp.demo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    per_token = 2 * prepare.max_token_chars(tok)  # 2 * len("<|assistant|>")
    assert per_token == 26
    limit = 10
    prompts = ["x" * (11 * per_token), "x" * (11 * per_token + 1), "héllo"]
    counts, bound = prepare.token_counts(prompts, tok, limit)
    assert counts.tolist() == [11 * per_token, 11, 6] and bound.tolist() == [False, True, False]
