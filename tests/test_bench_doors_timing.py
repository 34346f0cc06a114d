"""benchmarks/doors_timing.py without running it: its arguments and the table it prints (the benchmark itself
takes minutes and starts servers; run it by hand, see its docstring)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("doors_timing", ROOT / "benchmarks" / "doors_timing.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["doors_timing"] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("doors_timing", None)


def test_defaults_measure_this_repository_once_without_load(bench: ModuleType, tmp_path: Path) -> None:
    for name in ("dvc.yaml", "dvc.lock", "params.yaml"):
        (tmp_path / name).write_text("")
    (tmp_path / "outputs").mkdir()
    args = bench.parse_args(["--project", str(tmp_path)])
    assert (args.load, args.repeats, args.poll_s, args.keep) == (0, 1, 2.0, False)
    if (ROOT / "outputs").is_dir():  # a checkout `make run` has built; a fresh clone has no outputs yet
        assert bench.parse_args([]).project == ROOT
    else:
        with pytest.raises(SystemExit):
            bench.parse_args([])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--load", "-1"], "--load -1"),
        (["--repeats", "0"], "--repeats 0"),
        (["--poll-s", "0"], "--poll-s"),
        (["--load", "two"], "invalid int value"),
    ],
)
def test_bad_arguments_exit_2_naming_them(
    bench: ModuleType, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_a_project_that_was_not_built_is_refused(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dvc.yaml").write_text("")
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--project", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "no dvc.lock, params.yaml, outputs there; run `make run`" in err


def test_the_table_shows_medians_with_their_range(bench: ModuleType) -> None:
    door = bench.DOORS[0]
    results = [
        bench.Result(w, f, "9 × Skipped", "up to date", 1.0) for w, f in ((30.0, 20.0), (10.0, 8.0), (20.0, 9.0))
    ]
    text = bench.table([(door, results), (bench.DOORS[1], results[:1])])
    lines = text.splitlines()
    assert lines[2] == f"| {door.label} | 20.0 (10.0-30.0) | 9.0 (8.0-20.0) | 9 × Skipped | up to date |"
    assert lines[3].split(" | ")[1:3] == ["30.0", "20.0"]  # one round: just the value
    assert bench.summarize([None]) == "–" and bench.task_summary([]) == "–"
    assert bench.task_summary(["Skipped", "Completed", "Skipped"]) == "Completed, 2 × Skipped"
