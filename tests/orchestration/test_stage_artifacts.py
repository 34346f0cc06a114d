"""What a run tells its user (issue 26 §4), checked without a server: the key metrics table per stage (against
dvc.yaml and the committed metrics files), a stage's note (a DVC experiment's stage links its own MLflow run's
plots, not the workspace's files), the DVC command printed as it runs (`--force` included), the flow's parameter
types (what Prefect derives from the signature for the Parameters tab and the Custom-run form), and the drift
loop saying that drift is off and how to turn it on. The same through the Prefect API and a real run:
tests/e2e/test_three_doors.py (`test_*typed*`, `test_*own_mlflow_run*`).

    .venv/bin/python -m pytest tests/orchestration/test_stage_artifacts.py -q      (a few seconds)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from asp.errors import UserError
from asp.orchestration.dvc import dvc_exp_cmd, dvc_repro_cmd
from asp.orchestration.key_metrics import FALLBACK, KEY_METRICS, key_metrics
from asp.orchestration.pipeline import StageReport, numeric_leaves, shown_cmd, stage_files
from asp.stage import stage_names

ROOT = Path(__file__).resolve().parents[2]


def _committed_metrics(stage: str) -> dict[str, float]:
    files, _ = stage_files(stage, ROOT / "dvc.yaml")
    out: dict[str, float] = {}
    for rel in files:
        if rel.endswith(".json"):
            out.update(numeric_leaves(json.loads((ROOT / rel).read_text())))
    return out


def test_every_stage_has_key_metrics_and_each_is_in_its_metrics_file() -> None:
    assert list(KEY_METRICS) == stage_names(ROOT / "dvc.yaml")  # a new stage gets its row here
    for stage, names in KEY_METRICS.items():
        metrics = _committed_metrics(stage)
        missing = [n for n in names if n not in metrics]
        assert not missing, f"{stage}: {missing} not in its metrics file (renamed?)"
        assert len(names) == len(set(names)) and len(names) <= 15


def test_the_schedule_table_shows_what_a_change_of_k_moves() -> None:
    """The old table kept the first 25 metrics by name: 20 ablation numbers, and none of the schedule built."""
    metrics = _committed_metrics("schedule")
    shown = [name for name, _ in key_metrics("schedule", metrics)]
    assert shown[:4] == ["schedule/prompts", "schedule/minibatches", "schedule/groups", "schedule/predicted_CV"]
    assert {"schedule/predicted_spread", "schedule/ablation/C4/CV"} <= set(shown)
    assert not {"schedule/ablation/C1/D", "schedule/ablation/C2/spread", "schedule/ablation/prompts"} & set(shown)
    assert key_metrics("schedule", {"schedule/groups": 3.0, "other": 1.0}) == [("schedule/groups", 3.0)]
    custom = {f"m{i:02d}": float(i) for i in range(30)}  # a stage the table does not know: first ones by name
    assert key_metrics("my_stage", custom) == [(f"m{i:02d}", float(i)) for i in range(FALLBACK)]


def test_the_printed_command_is_the_one_that_runs() -> None:
    assert shown_cmd(dvc_repro_cmd("schedule", force=True)) == "dvc repro --single-item --force schedule"
    assert shown_cmd(dvc_repro_cmd("schedule")) == "dvc repro --single-item schedule"
    cmd = dvc_exp_cmd("e-1", ["schedule"], {"schedule.k": 4, "a.b": "x y"}, force=True)
    assert shown_cmd(cmd) == "dvc exp run --temp -n e-1 -S schedule.k=4 -S 'a.b=x y' --force --single-item schedule"
    assert cmd[:3] == [sys.executable, "-m", "dvc"]


def _report(experiment: str | None, status: str = "restored") -> StageReport:
    return StageReport(
        "schedule",
        status,  # type: ignore[arg-type]
        2.5,
        {"schedule/predicted_CV": 0.02},
        ["plots/schedule_loads.png", "plots/schedule_ablation.csv"],
        mlflow_run_id="r1",
        mlflow_url="http://127.0.0.1:5000/#/experiments/3/runs/r1?workflowType=machine_learning",
        artifacts=["plots/schedule_loads.png", "tables/schedule_ablation.csv"],
        experiment=experiment,
    )


def test_an_experiments_note_links_its_own_runs_plots_not_the_workspaces() -> None:
    from asp.orchestration.flow import artifact_url, metrics_rows, stage_markdown

    url = _report(None).mlflow_url or ""
    assert artifact_url(url, "plots/schedule_loads.png") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/r1/artifacts/plots/schedule_loads.png?workflowType=machine_learning"
    )
    note = stage_markdown(_report("abc-schedule-k-4-1234"))
    assert "in the DVC experiment `abc-schedule-k-4-1234`" in note and "the run that made these outputs" in note
    assert f"[plots/schedule_loads.png]({artifact_url(url, 'plots/schedule_loads.png')})" in note
    assert "are not this run's" in note and "dvc exp apply abc-schedule-k-4-1234" in note
    assert "In the workspace" not in note
    workspace = stage_markdown(_report(None, "ran"))
    assert "made by this run" in workspace and "In the workspace: `plots/schedule_loads.png`" in workspace
    assert metrics_rows(_report(None)) == [{"metric": "schedule/predicted_CV", "value": 0.02}]


def test_the_parameters_are_typed_for_the_ui() -> None:
    """Prefect builds the deployment's parameter schema from the flow's signature (pydantic; `Literal` gives an
    enum, docstring Args the descriptions); the Parameters tab shows each property's `type`, which an optional
    (`X | None`, an `anyOf`) lacks."""
    from prefect.utilities.callables import parameter_schema

    from asp.orchestration.flow import NO_PRESET, _request, asp_pipeline

    # the Flow object, as RunnerDeployment does: its annotations are evaluated in flow.py's globals, and one that
    # cannot be (a name imported only for type checkers) leaves every parameter untyped
    props = parameter_schema(asp_pipeline).model_dump_for_openapi()["properties"]
    presets = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert props["preset"]["type"] == "string" and props["preset"]["enum"] == [NO_PRESET, *presets]
    assert props["preset"]["default"] == NO_PRESET and "configs/" in props["preset"]["description"]
    # a text box in the new UI's form, not an object only its JSON mode can fill (nor a list: the new UI sends a
    # list's typed items as null)
    assert props["overrides"]["type"] == "string" and props["overrides"]["default"] == ""
    assert "schedule.k=3 runtime.trainer.kind=grpo" in props["overrides"]["description"]
    assert props["stages"]["items"]["enum"] == stage_names(ROOT / "dvc.yaml")
    assert {p["type"] for p in props.values()} == {"array", "string", "boolean"}  # stages: an array
    assert _request([], NO_PRESET, "", False).preset is None and _request([], "gpu-cluster", "", False).preset


def test_overrides_are_typed_as_set_takes_them() -> None:
    from asp.orchestration.flow import parse_overrides

    typed = parse_overrides(" schedule.k=4 runtime.trainer.kind=grpo,evaluate.min_tau=0.5\n a.b=[1, 2]; c.d = x y ")
    assert typed == {
        "schedule.k": 4,
        "runtime.trainer.kind": "grpo",
        "evaluate.min_tau": 0.5,
        "a.b": [1, 2],
        "c.d": "x y",
    }
    assert parse_overrides("") == parse_overrides(None) == parse_overrides("  ") == {}
    with pytest.raises(UserError, match=r"^overrides: 'schedule.k 4' is not SECTION.KEY=VALUE .*Fix the overrides"):
        parse_overrides("schedule.k 4")


def _loop_project(root: Path, drift: dict[str, object]) -> Path:
    root.mkdir()
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["drift"].update(drift)
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


def test_the_drift_loop_says_drift_is_off_and_how_to_turn_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asp.orchestration.drift_loop import drift_loop, loop_description

    monkeypatch.setenv("ASP_TRACKING", "0")
    root = _loop_project(tmp_path / "off", {"enabled": False})
    lines: list[str] = []
    calls: list[tuple[bool, bool]] = []

    def launch(run: object, handoff: bool, resume: bool) -> str:
        calls.append((handoff, resume))
        return "skipped"

    result = drift_loop(root / "params.yaml", root=root, launch=launch, on_line=lines.append)
    assert calls == [(True, False)] and result.reprofiles == []
    text = "\n".join(lines)
    assert "drift is off (drift.enabled: false)" in text and "one launch" in text
    assert "drift.enabled: true" in text and "asp preset apply drift-demo" in text
    assert "re-profile(s)" not in text  # not "at most 2 re-profile(s)" for a loop that cannot re-profile
    description = loop_description(root / "params.yaml")
    assert "drift is off" in description and "asp preset apply drift-demo" in description
    on = _loop_project(tmp_path / "on", {"enabled": True, "action": "reprofile", "max_actions": 3})
    assert "on, at most 3 re-profile(s)" in loop_description(on / "params.yaml")
    warn = _loop_project(tmp_path / "warn", {"enabled": True, "action": "warn"})
    assert "drift.action is warn, not reprofile" in loop_description(warn / "params.yaml")


@pytest.mark.slow  # two DVC commands in a toy project: 2.2 s idle, 7.9 s at load 8 (2 cores)
def test_a_forced_stage_logs_the_command_that_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`PipelineRun.run_stage` (what `asp repro` and the Prefect stage task call; the task's log is its `on_line`)
    prints `dvc repro --single-item --force NAME` when forced, the command it then runs: DVC reruns the stage."""
    import subprocess

    from asp.orchestration.pipeline import PipelineRun
    from asp.orchestration.request import RunRequest

    monkeypatch.setenv("ASP_TRACKING", "0")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    (tmp_path / "make.py").write_text("import pathlib\npathlib.Path('out.txt').write_text('x')\n")
    stage = {"cmd": f"{sys.executable} make.py", "deps": ["make.py"], "outs": ["out.txt"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"hello": stage}}))
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q", "--no-scm"], cwd=tmp_path, check=True)
    lines: list[str] = []
    with PipelineRun(RunRequest(("hello",), force=True), root=tmp_path, on_line=lines.append) as run:
        report = run.run_stage("hello")
    assert lines[0] == "[asp] stage hello: dvc repro --single-item --force hello", lines
    assert "Running stage 'hello'" in "\n".join(lines) and report.status == "ran"
    assert (tmp_path / "out.txt").read_text() == "x" and (tmp_path / "dvc.lock").is_file()


def test_the_run_that_made_the_outputs_is_found_by_its_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When DVC skips or restores a stage, its note links the newest finished run of it made with this run's params
    (not simply the newest run: a k=3 run after the k=4 one must not be linked for a k=4 experiment)."""
    import uuid

    from asp.tracking import find_run_made_with, open_tracker, run_artifacts

    monkeypatch.delenv("ASP_PARENT_RUN_ID", raising=False)
    experiment = f"made-with-{uuid.uuid4().hex[:8]}"
    plot = tmp_path / "schedule_loads.png"
    plot.write_bytes(b"not really a png")
    ids = {}
    for name, k, tags in (("k4", 4, {}), ("k4-exp", 4, {"asp.dvc_exp": "e-1"}), ("k3", 3, {})):
        with open_tracker("schedule", experiment=experiment, tags={"asp.stage": "schedule", **tags}) as tracker:
            tracker.log_params({"schedule": {"k": k, "b": 4}, "common.seed": 0})
            if name == "k4":
                tracker.log_artifact(plot, "plots")
        ids[name] = tracker.run_id

    def made_by(params: dict[str, object], workspace_only: bool = False) -> str | None:
        found = find_run_made_with(experiment, "schedule", params, workspace_only=workspace_only)
        return found["run_id"] if found else None

    now = {"schedule": {"k": 4, "b": 4}, "common": {"seed": 0}, "prepare": {"demo_prompts": 400}}
    assert made_by(now) == ids["k4-exp"] and made_by(now, workspace_only=True) == ids["k4"]
    assert made_by({"schedule.k": 3}) == ids["k3"] and made_by({"schedule": {"k": 5}}) is None
    assert run_artifacts(ids["k4"]) == ["plots/schedule_loads.png"] and run_artifacts(ids["k3"]) == []


def test_the_run_summary_links_mlflow_from_the_start_and_each_stage_at_the_end() -> None:
    from asp.orchestration.flow import run_summary

    parent = "http://127.0.0.1:5000/#/experiments/3/runs/p1"
    start = run_summary("abc1234 demo schedule", parent, [], None)  # published when the run starts
    assert start == f"### abc1234 demo schedule\n\n[MLflow parent run]({parent})"
    end = run_summary("abc1234 demo schedule", parent, [_report("exp-1")], "exp-1")
    assert f"| schedule | restored | 2.5 | [MLflow run]({_report(None).mlflow_url}) |" in end
    assert "`dvc exp apply exp-1`" in end
    assert run_summary("x", None, [], None) == "### x\n\nMLflow tracking is off"
