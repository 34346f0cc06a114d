"""Run requests are checked before anything runs: stage names from dvc.yaml, presets, overrides against the params
models (the message `asp params check` gives); labels and DVC experiment names tell runs apart."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asp.errors import UserError
from asp.orchestration.request import (
    RunRequest,
    check_request,
    describe_run,
    effective_overrides,
    experiment_name,
    ordered_stages,
    parse_set_args,
    run_label,
    set_dotted,
)
from asp.stage import stage_names
from asp.tracking import stamped

ROOT = Path(__file__).resolve().parents[2]


def test_stages_come_in_dvc_yaml_order() -> None:
    order = stage_names(ROOT / "dvc.yaml")
    assert ordered_stages(RunRequest(stages=("launch", "prepare")), ROOT) == ["prepare", "launch"]
    assert ordered_stages(RunRequest(), ROOT) == order


def test_overrides_are_validated_with_the_params_message() -> None:
    params = check_request(RunRequest(overrides={"schedule.k": 3, "runtime.trainer.kind": "simulated"}), root=ROOT)
    assert params.schedule.k == 3 and params.runtime.trainer.kind == "simulated"
    with pytest.raises(
        UserError, match=r"unknown key 'schedule\.kk' \(from --set\) \(allowed here: .*\bk\b.*--set value"
    ):
        check_request(RunRequest(overrides={"schedule.kk": 3}), root=ROOT)
    with pytest.raises(UserError, match=r"'schedule\.k' = 'three'"):
        check_request(RunRequest(overrides={"schedule.k": "three"}), root=ROOT)
    every_stage = ", ".join(stage_names(ROOT / "dvc.yaml"))  # the whole list, in dvc.yaml's order
    unknown = f"unknown stage(s) ['shedule']; dvc.yaml defines {every_stage}."
    with pytest.raises(UserError, match=f"^{re.escape(unknown)}$"):
        check_request(RunRequest(stages=("shedule",)), root=ROOT)
    with pytest.raises(UserError, match=r"no preset 'gpu'.*gpu-cluster"):
        check_request(RunRequest(preset="gpu"), root=ROOT)
    with pytest.raises(UserError, match=r"--set k is not a dotted SECTION\.KEY"):
        check_request(RunRequest(overrides={"k": 3}), root=ROOT)


# A refused request loads none of the heavy machinery: checked in a fresh interpreter, which modules the failing
# check_request call imported (none of DVC, MLflow, Prefect, Ray or torch: it fails before any of them starts).
REFUSED_LOADS = """
import sys
from asp.errors import UserError
from asp.orchestration.request import RunRequest, check_request
before = set(sys.modules)
try:
    check_request(RunRequest(overrides={"schedule.kk": 3}), root=sys.argv[1])
except UserError:
    pass
else:
    raise SystemExit("not refused")
print(sorted({m.split(".")[0] for m in set(sys.modules) - before}))
"""
HEAVY = {"dvc", "mlflow", "prefect", "ray", "torch", "transformers"}


def test_a_refused_request_fails_before_dvc_mlflow_or_prefect_load() -> None:
    out = subprocess.run(
        [sys.executable, "-c", REFUSED_LOADS, str(ROOT)], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
    assert loaded & HEAVY == set(), f"a refused request imported {sorted(loaded & HEAVY)}"


def test_a_preset_and_overrides_make_an_experiment_with_sorted_sets() -> None:
    assert not RunRequest(stages=("schedule",)).is_experiment
    request = RunRequest(preset="gpu-cluster", overrides={"schedule.k": 4})
    assert request.is_experiment
    check_request(RunRequest(("schedule",), request.preset, request.overrides), root=ROOT)  # not the placeholder path
    sets = effective_overrides(request, ROOT)
    assert sets["schedule.k"] == 4 and sets["profile.engine.kind"] == "vllm"  # the override wins over the preset
    assert list(sets) == sorted(sets)


def test_set_args_parse_yaml_scalars() -> None:
    assert parse_set_args(["schedule.k=3", "runtime.trainer.kind=grpo", "evaluate.min_tau=0.5", "a.b=[1, 2]"]) == {
        "schedule.k": 3,
        "runtime.trainer.kind": "grpo",
        "evaluate.min_tau": 0.5,
        "a.b": [1, 2],
    }
    for bad in ("schedule.k", "k=3", "=3"):
        with pytest.raises(UserError, match="SECTION.KEY=VALUE"):
            parse_set_args([bad])
    assert set_dotted({"a": {"b": 1, "c": 2}}, {"a.b": 5, "d.e": 1}) == {"a": {"b": 5, "c": 2}, "d": {"e": 1}}


def test_labels_and_experiment_names() -> None:
    stages = stage_names(ROOT / "dvc.yaml")
    assert run_label(RunRequest(), "abc1234", stages) == "abc1234 demo all"
    label = run_label(RunRequest(("schedule",), "gpu-cluster", {"schedule.k": 3}, True), "abc1234*", stages)
    assert label == "abc1234* gpu-cluster schedule schedule.k=3 force"
    name = experiment_name(label, "1a2b3c4d")
    assert name == "abc1234-dirty-gpu-cluster-schedule-schedule.k-3-force-1a2b3c4d"
    ok = subprocess.run(["git", "check-ref-format", f"refs/exps/{name}"], capture_output=True)
    assert ok.returncode == 0


INVALID = r"params\.yaml \+ {typed}: invalid params: "


@pytest.mark.parametrize(
    ("overrides", "message"),
    [  # (what the user typed, the message's start and end) as the Prefect UI's `overrides` and as `--set`
        ({"schedule.kk": 3}, INVALID + r"unknown key 'schedule\.kk' \(from {field}\)"),
        ({"schedule.k": "three"}, INVALID + r"'schedule\.k' = 'three' \(from {field}\)"),
        ({"k": 3}, r"{head}k\W* is not a dotted SECTION\.KEY"),
        ({"schedule.k": 3, "schedule.k.x": 1}, r"{head}schedule\.k\.x\W* sets a key inside .*schedule\.k\b"),
    ],
)
def test_a_bad_override_names_the_field_it_was_typed_in(overrides: dict, message: str) -> None:
    """`overrides` (the UI's field) or `--set` (the command line), never "the file": first words and last sentence."""
    for origin, field, head, typed, fix in (
        ("overrides", "overrides", "overrides: ", r"overrides \[schedule\.k\S+\]", "Fix the overrides and run again."),
        ("--set", "--set", "--set ", r"--set schedule\.k\w*=\S+", "Fix the --set value and run again."),
    ):
        with pytest.raises(UserError) as err:
            check_request(RunRequest(overrides=overrides, overrides_from=origin), root=ROOT)
        text = str(err.value)
        assert re.match(message.format(field=field, head=head, typed=typed), text), text
        assert "in the file" not in text and (text.endswith(fix) or text.endswith("Keep one of them and run again."))


def test_run_names_are_stamped_and_parent_runs_described() -> None:
    stages = stage_names(ROOT / "dvc.yaml")
    label = run_label(RunRequest(), "abc1234", stages)
    t = time.mktime((2026, 5, 14, 10, 32, 7, 0, 0, -1))
    assert stamped(label, t) == "abc1234 demo all @ 05-14 10:32:07"  # two up-to-date runs differ by their time
    request = RunRequest(("schedule",), None, {"schedule.k": 4}, overrides_from="overrides")
    text = describe_run(
        request, "abc1234 demo schedule schedule.k=4", "prefect", exp_name="e-1", outcomes=[("schedule", "ran", 3.2)]
    )
    assert text.startswith("Pipeline run `abc1234 demo schedule schedule.k=4`, started by a Prefect flow run")
    assert "params.yaml + overrides `[schedule.k=4]`" in text and "`dvc exp apply e-1`" in text
    assert text.endswith("- schedule: ran (3.2 s)")
