"""`asp schedule build|ablation|sweep` through typer's CliRunner, on real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from asp.cli.schedule import app
from asp.schedule import BUILD_METHODS, PAPER_SPEC, PAPER_TAUS, synthetic_lengths

runner = CliRunner()


def predictions(n: int = 700) -> pd.DataFrame:
    true = synthetic_lengths(n, 0)
    pred = np.round(true * np.exp(0.3 * np.random.default_rng(0).standard_normal(n)))
    return pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "predicted_length": pred, "true_length": true})


def write(df: pd.DataFrame, path) -> None:
    suffix = path.suffix
    if suffix == ".parquet":
        df.to_parquet(path, index=False)
    elif suffix == ".csv":
        df.to_csv(path, index=False)
    elif suffix == ".jsonl":
        df.to_json(path, orient="records", lines=True)
    else:
        path.write_text(json.dumps(df.to_dict(orient="records")))


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json", ".jsonl"])
def test_build_writes_schedule_and_summary(tmp_path, suffix: str) -> None:
    src = tmp_path / f"preds{suffix}"
    write(predictions(), src)
    out = tmp_path / "out" / "schedule.parquet"
    res = runner.invoke(app, ["build", str(src), "--out", str(out), "--iterations", "20000", "--k", "4"])
    assert res.exit_code == 0, res.output
    frame = pd.read_parquet(out)
    assert len(frame) == 700 and frame["prompt_id"].nunique() == 700
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["k"] == 4 and "realized" in summary and summary["n_prompts"] == 700
    assert "realized on true lengths" in res.output
    assert {p.name for p in out.parent.iterdir()} == {"schedule.json", "schedule.parquet"}  # no temp leftovers


def test_build_with_calibration_and_plot(tmp_path) -> None:
    src, cal, png = tmp_path / "p.parquet", tmp_path / "cal.json", tmp_path / "fig.png"
    write(predictions(), src)
    cal.write_text(json.dumps({"x": [1, 5000, 20000], "y": [3000, 5000, 7000]}))
    res = runner.invoke(
        app,
        [
            "build",
            str(src),
            "--out",
            str(tmp_path / "s.parquet"),
            "--calibration",
            str(cal),
            "--iterations",
            "5000",
            "--plot",
            str(png),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "s.json").read_text())["loads"] == "calibrated"
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("frame", "args", "message"),
    [
        (pd.DataFrame({"prompt_id": [1, 2], "predicted_length": [10.0, -1.0]}), [], "row 1 (0-based) has value -1.0"),
        (pd.DataFrame({"prompt_id": [1, 2], "predicted_length": [10.0, None]}), [], "'predicted_length' row 1"),
        (pd.DataFrame({"prompt_id": [1, 1], "predicted_length": [1.0, 2.0]}), [], "appears more than once"),
        (pd.DataFrame({"length": [1.0, 2.0]}), [], "needs a 'predicted_length' column"),
        (pd.DataFrame({"predicted_length": [1.0, 2.0]}), ["--k", "0"], "k must be >= 1, got 0"),
        (pd.DataFrame({"predicted_length": [1.0, 2.0]}), ["--kappa", "-1"], "kappa must be >= 0"),
        (pd.DataFrame({"predicted_length": [1.0, 2.0]}), ["--method", "x"], "method must be one of"),
        (pd.DataFrame({"predicted_length": [1.0, 2.0]}), ["--loads", "calibrated", "--b", "2"], "needs a calibration"),
    ],
)
def test_build_bad_input_exits_2_without_traceback(tmp_path, frame: pd.DataFrame, args: list, message: str) -> None:
    src = tmp_path / "bad.csv"
    write(frame, src)
    res = runner.invoke(app, ["build", str(src), "--out", str(tmp_path / "s.parquet"), *args])
    assert res.exit_code == 2
    assert message in res.stderr and "Traceback" not in res.output
    assert not (tmp_path / "s.parquet").exists()


def test_missing_and_empty_files(tmp_path) -> None:
    res = runner.invoke(app, ["build", str(tmp_path / "nope.parquet")])
    assert res.exit_code == 2 and "file not found" in res.stderr
    (tmp_path / "empty.csv").write_text("prompt_id,predicted_length\n")
    res = runner.invoke(app, ["build", str(tmp_path / "empty.csv")])
    assert res.exit_code == 2 and "no rows" in res.stderr
    (tmp_path / "x.txt").write_text("1\n")
    res = runner.invoke(app, ["build", str(tmp_path / "x.txt")])
    assert res.exit_code == 2 and "unknown extension" in res.stderr


def test_ablation_on_lengths_only_file_and_on_predictions(tmp_path) -> None:
    lengths = tmp_path / "lengths.csv"
    pd.DataFrame({"length": synthetic_lengths(2000, 1)}).to_csv(lengths, index=False)
    out = tmp_path / "abl.csv"
    res = runner.invoke(
        app, ["ablation", str(lengths), "--tau", "0.64", "--seeds", "2", "--iterations", "10000", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert all(c in res.output for c in ("C0", "C4", "spread", "CV_sd"))
    assert "2 seeds; they vary the prompts' order (C0's minibatches), the predictions, C3's" in res.output
    table = pd.read_csv(out, index_col=0)
    assert list(table.index) == ["C0", "C1", "C2", "C3", "C4"] and "P_sd" in table.columns
    res = runner.invoke(app, ["ablation", str(lengths)])
    assert res.exit_code == 2 and "pass --tau" in res.stderr
    preds = tmp_path / "p.parquet"
    write(predictions(), preds)
    res = runner.invoke(app, ["ablation", str(preds), "--seeds", "1", "--iterations", "1000"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["ablation", str(preds), "--seeds", "2", "--iterations", "1000", "--cross-fit", "5"])
    assert res.exit_code == 0 and "the cross-fitting folds" in res.output, res.output
    res = runner.invoke(app, ["ablation", str(preds), "--order", "sorted"])
    assert res.exit_code == 2 and "order must be one of" in res.stderr


def test_sweep_synthetic_writes_both_tables(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    res = runner.invoke(
        app,
        [
            "sweep",
            "--synthetic",
            "3000",
            "--taus",
            "1,0.5",
            "--seeds",
            "1",
            "--iterations",
            "5000",
            "--calibration-size",
            "500",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "Table 9" in res.output and "Table 10" in res.output and "C4_cal" in res.output
    assert "C4_cal (balanced on calibrated loads) vs C0: lower group-load CV at every tau " in res.output
    tables = json.loads(out.read_text())
    assert [row["tau"] for row in tables["cv"]] == [1.0, 0.5]
    res = runner.invoke(app, ["sweep", "--taus", "1,x", "--synthetic", "100"])
    assert res.exit_code == 2 and "--taus" in res.stderr
    res = runner.invoke(app, ["sweep"])
    assert res.exit_code == 2 and "exactly one of" in res.stderr


def test_cli_module_imports_no_heavy_library() -> None:
    """`asp --help` must stay fast: the schedule CLI imports numpy, pandas and numba only inside its commands."""
    code = "import sys, asp.cli.schedule; print(sorted({'numpy', 'pandas', 'numba', 'scipy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_help_states_the_spec_defaults() -> None:
    """Flags left out take the paper's settings (PAPER_SPEC); the help must say what those are (and list the
    methods)."""
    res = runner.invoke(app, ["sweep", "--help"], env={"COLUMNS": "200"})
    spec = PAPER_SPEC
    text = " ".join(res.output.split())  # click wraps help lines
    for value in (spec.b, spec.kappa, spec.k, spec.iterations, spec.method, ",".join(map(str, PAPER_TAUS))):
        assert f"[default: ({value})]" in text  # typer shows a show_default text in parentheses
    assert all(method in text for method in BUILD_METHODS)


def strict_json(path) -> dict:
    """Parse as strict JSON: NaN / Infinity are not JSON."""

    def reject(token: str) -> None:
        raise AssertionError(f"{path} holds {token}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=reject)


def tree(root) -> set[str]:
    """Every file and directory under root (hidden ones too), relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def lengths_file(tmp_path, n: int, huge_row: int | None = None):
    pred = np.arange(1, n + 1) * 10.0
    if huge_row is not None:
        pred[huge_row] = 1e300
    src = tmp_path / "preds.csv"
    write(pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "predicted_length": pred}), src)
    return src


@pytest.mark.parametrize(
    ("n", "args", "message"),
    [
        (10, ["--b", "16"], "10 prompts cannot form minibatches of 16-18 prompts (b = 16, kappa = 2): use b <= 10"),
        (37, ["--b", "16"], "37 prompts cannot form minibatches of 16-18 prompts (b = 16, kappa = 2): use b = 12 or "),
        (
            5,
            ["--b", "4", "--kappa", "0"],
            "5 prompts cannot form minibatches of 4 prompts (b = 4, kappa = 0): use b = 1",
        ),
    ],
)
def test_build_infeasible_sizes_exit_2_naming_what_works(tmp_path, n: int, args: list, message: str) -> None:
    src = lengths_file(tmp_path, n)
    res = runner.invoke(app, ["build", str(src), "--out", str(tmp_path / "out" / "s.parquet"), *args])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.startswith(f"error: {src}: {message}") and "--allow-partial" in res.stderr
    assert tree(tmp_path) == {"preds.csv"}


def test_build_allow_partial_writes_strict_json(tmp_path) -> None:
    """10 prompts, b = 16: one short minibatch, no complete group (mean group load undefined: null, not NaN)."""
    src, out = lengths_file(tmp_path, 10), tmp_path / "s.parquet"
    res = runner.invoke(app, ["build", str(src), "--out", str(out), "--b", "16", "--allow-partial"])
    assert res.exit_code == 0, res.output
    summary = strict_json(out.with_suffix(".json"))
    assert summary["feasible"] is False and summary["minibatch_size"] == {"min": 10, "max": 10, "mean": 10.0}
    assert summary["predicted"]["mean_group_load"] is None and summary["predicted"]["n_groups"] == 0
    assert len(pd.read_parquet(out)) == 10


def test_build_huge_lengths_exit_2_instead_of_infinity_in_json(tmp_path) -> None:
    src = lengths_file(tmp_path, 10, huge_row=9)
    res = runner.invoke(app, ["build", str(src), "--out", str(tmp_path / "s.parquet"), "--b", "2", "--kappa", "0"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{src}: column 'predicted_length' row 9 (0-based) has value 1e+300" in res.stderr
    assert "<= 1e15 tokens" in res.stderr
    assert tree(tmp_path) == {"preds.csv"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plot", "{tmp}/fig.xyz"], "--plot {tmp}/fig.xyz: unknown image format 'xyz'; use one of"),
        (["--out", "{tmp}/s.csv"], "--out {tmp}/s.csv: the schedule is written as Parquet"),
        (["--summary", "{tmp}/s.txt"], "--summary {tmp}/s.txt: the summary is written as JSON"),
        (["--out", "{tmp}/preds.csv/s.parquet"], "cannot be created because {tmp}/preds.csv is a file"),
        (["--out", "{tmp}/dir.parquet"], "{tmp}/dir.parquet: is a directory"),
        (["--plot", "{tmp}/dir.parquet/../x.json"], "unknown image format 'json'"),
    ],
)
def test_build_checks_outputs_before_reading_or_computing(tmp_path, args: list, message: str) -> None:
    """The input does not even exist: output paths and formats are checked first, and nothing is written."""
    (tmp_path / "preds.csv").write_text("not read\n")
    (tmp_path / "dir.parquet").mkdir()
    args = [a.format(tmp=tmp_path) for a in args]
    res = runner.invoke(app, ["build", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "s.parquet"), *args])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert message.format(tmp=tmp_path) in res.stderr
    assert tree(tmp_path) == {"preds.csv", "dir.parquet"}


def test_build_write_failure_leaves_nothing(tmp_path, monkeypatch) -> None:
    """A failing last output (the plot: disk full) leaves no schedule, summary, temporary file or new directory."""
    from matplotlib.figure import Figure

    def full_disk(*args, **kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    src = lengths_file(tmp_path, 40)
    out = tmp_path / "new" / "deeper" / "s.parquet"
    res = runner.invoke(app, ["build", str(src), "--out", str(out), "--b", "4", "--plot", str(tmp_path / "fig.png")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{tmp_path / 'fig.png'}: cannot be written (No space left on device); nothing was written" in res.stderr
    assert tree(tmp_path) == {"preds.csv"}


def test_table_out_format_checked_before_computing(tmp_path) -> None:
    for cmd in (["ablation", "--tau", "0.5"], ["sweep", "--taus", "1"]):
        res = runner.invoke(app, [*cmd, "--synthetic", "100", "--out", str(tmp_path / "t.txt")])
        assert res.exit_code == 2 and "use a .json or .csv output path" in res.stderr
    assert tree(tmp_path) == set()


def test_real_asp_exits_2_on_infeasible_schedule(tmp_path) -> None:
    """The installed `asp` entry point (not just the typer app) exits 2 with the one-line message."""
    src = lengths_file(tmp_path, 10)
    asp = Path(sys.executable).with_name("asp")
    cmd = [str(asp), "schedule", "build", str(src), "--b", "16", "--out", str(tmp_path / "s.parquet")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {src}: 10 prompts cannot form") and "Traceback" not in proc.stderr
    assert tree(tmp_path) == {"preds.csv"}


@pytest.mark.parametrize("command", ["ablation", "sweep"])
@pytest.mark.parametrize("option", ["--seeds", "--synthetic"])
def test_zero_seeds_or_prompts_are_usage_errors(command: str, option: str) -> None:
    args = {"--seeds": ["--synthetic", "100", "--seeds", "0"], "--synthetic": ["--synthetic", "0"]}[option]
    res = runner.invoke(app, [command, *args, "--tau", "0.5"] if command == "ablation" else [command, *args])
    assert res.exit_code == 2 and "need at least one array" not in res.output and res.exception is not None
    assert f"Invalid value for '{option}': Input should be greater than or equal to 1" in res.stderr


@pytest.mark.parametrize("command", ["ablation", "sweep"])
def test_ablation_and_sweep_refuse_what_build_refuses(tmp_path, command: str) -> None:
    """The same feasibility rule for all three commands: 10 prompts with b = 32 exit 2 with build's message."""
    extra = ["--tau", "0.5"] if command == "ablation" else ["--taus", "1", "--seeds", "1"]
    res = runner.invoke(app, [command, "--synthetic", "10", "--b", "32", *extra])
    assert res.exit_code == 2 and "Traceback" not in res.output
    message = "10 prompts cannot form minibatches of 32-34 prompts (b = 32, kappa = 2): use b <= 10 (fewer prompts"
    assert res.stderr.startswith(f"error: --synthetic 10: {message}") and "--allow-partial" in res.stderr
    src = lengths_file(tmp_path, 37)
    pd.read_csv(src).rename(columns={"predicted_length": "length"}).to_csv(src, index=False)
    res = runner.invoke(app, [command, str(src), "--b", "16", *extra])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {src}: 37 prompts cannot form minibatches of 16-18")
    res = runner.invoke(
        app, [command, "--synthetic", "10", "--b", "32", "--allow-partial", *extra, "--iterations", "100"]
    )
    assert res.exit_code == 0, res.output  # accepted when asked for, as build does
