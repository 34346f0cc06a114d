"""The `asp` command: user and usage errors print one message and exit 2 without a traceback (checked in-process
through `asp.cli.main`, the console entry point, so the exit code is the one a shell sees); `asp repro` runs DVC
under one MLflow parent run and fails with the failed stage's code when DVC fails, `asp preset apply` writes a valid
overlay or nothing, and `asp serve` registers the Prefect deployment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _asp(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asp", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _main(*args: str) -> int:
    """Run `asp ARGS` in-process through the console entry point; returns the exit code it ends with."""
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schedule", "build", "missing.parquet"], "error: missing.parquet: file not found"),  # typer.Exit(2)
        (["schedule", "build", "x.parquet", "--b", "x"], "Error: Invalid value for '--b'"),
        (["--bogus"], "Error: No such option: --bogus"),
        (["stage"], "Error: Missing argument 'name'."),
        (["schedule", "frobnicate"], "Error: No such command 'frobnicate'."),
        (["stage", "nope"], "error: no stage 'nope': dvc.yaml defines policy, prepare"),  # UserError
    ],
)
def test_user_and_usage_errors_exit_2_with_one_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert _main(*args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert sum(line.lower().startswith("error") for line in err.splitlines()) == 1, err


def test_help_exits_0(capsys: pytest.CaptureFixture) -> None:
    assert _main("--help") == 0
    assert "repro" in capsys.readouterr().out


def test_bad_params_exit_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("schedule:\n  b: 0\n")
    out = _asp("params", "check", "--params", str(bad))
    assert out.returncode == 2
    assert "'schedule.b' = 0" in out.stderr and "Traceback" not in out.stderr


def test_unknown_stage_and_preset_exit_2() -> None:
    out = _asp("stage", "nope")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        "dvc.yaml defines policy, prepare, profile, train_predictor, evaluate, predict, schedule, trainer_alone, "
        "simulate, launch, sim_check" in out.stderr
    )
    out = _asp("stage", "../tests/conftest")  # only registered stages run, never an arbitrary .py file
    assert out.returncode == 2 and "no stage '../tests/conftest'" in out.stderr
    out = _asp("params", "check", "--preset", "nope")
    assert out.returncode == 2 and "gpu-cluster" in out.stderr


def test_shipped_params_check_ok() -> None:
    out = _asp("params", "check", "--preset", "gpu-cluster")
    assert out.returncode == 0 and "OK" in out.stdout


STAGE_SCRIPT = """
import json, os, pathlib, sys
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
pathlib.Path("out.txt").write_text(os.environ.get("ASP_PARENT_RUN_ID", "no parent run"))
pathlib.Path("metrics").mkdir(exist_ok=True)
pathlib.Path("metrics/hello.json").write_text(json.dumps({"hello/answer": 42, "hello/name": "x"}))
if code == 99:  # flaky: fails the first attempt only
    first = not pathlib.Path("attempted").exists()
    pathlib.Path("attempted").write_text("1")
    code = 3 if first else 0
if code == 98:  # hangs
    import time
    time.sleep(120)
sys.exit(code)
"""


def _tiny_dvc_project(root: Path, store: Path, exit_code: int = 0, orchestration: dict | None = None) -> dict:
    """A new git + DVC project with one stage (`hello`: writes out.txt and metrics/hello.json, exits with
    `exit_code`) and the repo's complete params.yaml, tracking to `store`. Returns the params written."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["common"].update(tracking_uri=f"sqlite:///{store}", experiment="cli-repro")
    params["orchestration"].update(orchestration or {})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "hello.py").write_text(STAGE_SCRIPT)
    stage = {
        "cmd": f"{sys.executable} hello.py {exit_code}",
        "deps": ["hello.py"],
        "params": ["common.seed"],
        "outs": ["out.txt"],
        "metrics": [{"metrics/hello.json": {"cache": False}}],
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"hello": stage}}, sort_keys=False))
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=root, env=_env_without_store(), check=True, capture_output=True, timeout=120)
    return params


def _env_without_store() -> dict[str, str]:
    """The environment of a user shell: no test-wide MLflow store or parent run, DVC analytics off."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "ASP_PARENT_RUN_ID")}
    return dict(env, DVC_NO_ANALYTICS="1")


def _repro(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "asp", "repro", *args],
        cwd=repo,
        env=_env_without_store(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _pipeline_runs(store: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    return client.search_runs([client.get_experiment_by_name("cli-repro").experiment_id])


@pytest.mark.slow
def test_repro_runs_dvc_under_one_parent_run(tmp_path: Path) -> None:
    import re

    import yaml
    from mlflow.artifacts import download_artifacts

    repo, store = tmp_path / "repo", tmp_path / "store.db"
    params = _tiny_dvc_project(repo, store)
    out = _repro(repo)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Running stage 'hello'" in out.stdout + out.stderr
    assert "hello" in yaml.safe_load((repo / "dvc.lock").read_text())["stages"]  # DVC ran it and locked it

    (run,) = _pipeline_runs(store)  # the stage ran no tracker of its own: only the parent
    assert re.fullmatch(r"nogit demo all @ \d\d-\d\d \d\d:\d\d:\d\d", run.info.run_name)  # no commit yet; its start
    assert run.data.tags["asp.kind"] == "pipeline" and run.data.tags["mlflow.source.name"] == "asp repro"
    assert run.info.status == "FINISHED"
    assert (repo / "out.txt").read_text() == run.info.run_id  # the stage process saw its parent run's id
    logged = download_artifacts(run_id=run.info.run_id, artifact_path="params.yaml", tracking_uri=f"sqlite:///{store}")
    assert yaml.safe_load(Path(logged).read_text()) == params
    assert run.data.metrics == {"hello/answer": 42.0}  # the stages' metrics files aggregated (numbers only)
    assert run.data.params["schedule.k"] == str(params["schedule"]["k"])  # the resolved params


@pytest.mark.slow
def test_repro_failure_fails_the_command_make_run_and_the_parent_run(tmp_path: Path) -> None:
    import re

    repo, store = tmp_path / "repo", tmp_path / "store.db"
    _tiny_dvc_project(repo, store, exit_code=3)  # the stage fails
    out = _repro(repo)
    dvc_code = int(re.search(r"dvc repro failed with exit code (\d+)", out.stderr).group(1))
    (run,) = _pipeline_runs(store)
    assert dvc_code == 255 and (out.returncode, run.info.status) == (3, "FAILED")  # the stage's code, not DVC's
    assert "stage 'hello' failed (the stage exited with 3, dvc with 255)" in out.stderr
    assert "Traceback" not in out.stderr

    # `make run` (asp repro after the install step, which -o skips here) fails too; make names the stage's code
    env = dict(_env_without_store(), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    made = subprocess.run(
        ["make", "-f", str(ROOT / "Makefile"), "-o", "install", "run"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 2 and "run] Error 3" in made.stderr, made.stderr[-3000:]
    assert [r.info.status for r in _pipeline_runs(store)] == ["FAILED", "FAILED"]


@pytest.mark.slow
@pytest.mark.extended  # the retry policy itself: tests/orchestration/test_retry.py; a timeout: test_cancel.py
def test_repro_retries_a_failed_stage_and_stops_one_past_its_timeout(tmp_path: Path) -> None:
    import time

    repo, store = tmp_path / "flaky", tmp_path / "store.db"
    _tiny_dvc_project(repo, store, exit_code=99, orchestration={"retries": {"hello": 1}})
    out = _repro(repo)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "stage 'hello' failed (the stage exited with 3, dvc with 255)" in out.stderr and "retrying (1/1)" in out.stderr
    )

    repo = tmp_path / "hangs"
    _tiny_dvc_project(repo, store, exit_code=98, orchestration={"timeout_s": {"hello": 3}, "retries": {"hello": 1}})
    t0 = time.monotonic()
    out = _repro(repo)
    assert out.returncode != 0 and "stage 'hello' timed out (orchestration.timeout_s)" in out.stderr
    assert "retrying" not in out.stderr and time.monotonic() - t0 < 90  # a timeout is not retried
    assert _pipeline_runs(store)[0].info.status == "KILLED"  # the newest parent run


def test_repro_of_an_unknown_stage_fails_before_anything_runs(tmp_path: Path) -> None:
    repo, store = tmp_path / "repo", tmp_path / "store.db"
    _tiny_dvc_project(repo, store)
    out = _repro(repo, "nope")
    assert out.returncode == 2 and "unknown stage(s) ['nope']; dvc.yaml defines hello" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not store.exists()  # no MLflow run, no DVC call


def _preset_dir(tmp_path: Path, **presets: dict) -> Path:
    """tmp_path with the repo's params.yaml and configs/gpu-cluster.yaml, plus `presets` as configs/NAME.yaml."""
    import shutil

    import yaml

    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copy(ROOT / "configs/gpu-cluster.yaml", tmp_path / "configs/gpu-cluster.yaml")
    for name, body in presets.items():
        (tmp_path / "configs" / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return tmp_path


def test_preset_apply_writes_a_valid_overlay(tmp_path: Path) -> None:
    import yaml

    from asp.config import load_params
    from asp.tracking import flatten

    work = _preset_dir(tmp_path)
    before = yaml.safe_load((work / "params.yaml").read_text())
    out = _asp("preset", "apply", "gpu-cluster", cwd=work)
    assert out.returncode == 0, out.stderr
    after = yaml.safe_load((work / "params.yaml").read_text())
    preset = flatten(yaml.safe_load((work / "configs/gpu-cluster.yaml").read_text()))
    flat_after, flat_before = flatten(after), flatten(before)
    assert {k: flat_after[k] for k in preset} == preset  # every preset value landed
    assert {k: v for k, v in flat_after.items() if k not in preset} == {
        k: v for k, v in flat_before.items() if k not in preset
    }  # and nothing else changed
    resolved = load_params(work / "params.yaml")  # the written file validates on its own
    assert resolved.profile.engine.kind == "vllm" and resolved.schedule.b == preset["schedule.b"]
    assert sorted(p.name for p in work.iterdir()) == ["configs", "params.yaml"]  # no temporary file left


def test_bad_preset_leaves_params_untouched(tmp_path: Path) -> None:
    work = _preset_dir(tmp_path, bad={"schedule": {"b": 0}}, typo={"schedule": {"bee": 16}})
    original = (work / "params.yaml").read_bytes()
    for name, named in (("bad", "'schedule.b' = 0"), ("typo", "schedule.bee"), ("missing", "gpu-cluster")):
        out = _asp("preset", "apply", name, cwd=work)
        assert out.returncode == 2 and named in out.stderr and "Traceback" not in out.stderr, (name, out.stderr)
        assert (work / "params.yaml").read_bytes() == original
    assert sorted(p.name for p in work.iterdir()) == ["configs", "params.yaml"]


@pytest.mark.slow
@pytest.mark.extended  # `asp serve` registers, prints the URL and stops on Ctrl-C: test_three_doors's `served` (CI)
def test_serve_registers_the_deployment(tmp_path: Path, prefect_server: dict, background) -> None:
    import json
    import shutil
    import signal

    for name in ("dvc.yaml", "params.yaml"):  # asp serve checks them before it registers
        shutil.copy(ROOT / name, tmp_path / name)
    serve = background.start(
        [sys.executable, "-m", "asp", "serve"], log=tmp_path / "serve.log", env=prefect_server, cwd=tmp_path
    )
    api = prefect_server["PREFECT_API_URL"]
    deployment = json.loads(background.wait_http(f"{api}/deployments/name/asp-pipeline/asp-pipeline", serve, 180))
    assert deployment["name"] == "asp-pipeline"
    flow = json.loads(background.wait_http(f"{api}/flows/{deployment['flow_id']}", serve, 30))
    assert flow["name"] == "asp-pipeline"
    assert serve.poll() is None  # still serving
    url = f"/deployments/deployment/{deployment['id']}"  # it prints the URL once the API has the deployment
    deadline = time.monotonic() + 60
    while url not in background.log(serve) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert url in background.log(serve)
    background.stop(serve, signal.SIGINT, timeout_s=120)


def test_serve_without_a_prefect_server_says_what_to_do(tmp_path: Path) -> None:
    import shutil

    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(_env_without_store(), PREFECT_API_URL=f"http://127.0.0.1:{port}/api")
    out = subprocess.run(
        [sys.executable, "-m", "asp", "serve"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and f"no Prefect server answers at http://127.0.0.1:{port}/api" in out.stderr
    assert "asp ui prefect" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("preset", ["../params", "/tmp/x", "configs/gpu-cluster", "gpu-cluster.yaml", "..", ".hidden"])
def test_preset_is_a_name_in_configs_never_a_path(
    preset: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """In-process (the entry point's own exit code 2 and message in a subprocess: tests above)."""
    monkeypatch.chdir(ROOT)
    for args in (["params", "check", "--preset", preset], ["preset", "apply", preset], ["repro", "--preset", preset]):
        code, err = _main(*args), capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, (args, err)
        first = err.splitlines()[0]
        assert first.startswith(f"error: preset {preset!r} is not a preset name"), first
        assert "Presets: demo-vllm, drift-demo, gpu-cluster" in first and "-p/--params" in first
    hint = "(did you mean 'gpu-cluster'?)"
    assert (hint in first) == (preset in ("configs/gpu-cluster", "gpu-cluster.yaml"))


@pytest.mark.parametrize("what", ["file", "folder"])
def test_preset_apply_on_a_params_file_it_cannot_replace_exits_2(tmp_path: Path, what: str) -> None:
    from tests.readonly import unprivileged

    work = _preset_dir(tmp_path)
    params = work / "params.yaml"
    original = params.read_bytes()
    target = params if what == "file" else work
    mode = target.stat().st_mode
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        cmd = unprivileged([sys.executable, "-m", "asp", "preset", "apply", "gpu-cluster"])
        out = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=120)
    finally:
        target.chmod(mode)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    first = out.stderr.splitlines()[0]
    if what == "file":
        assert (
            first
            == "error: params.yaml is read-only; nothing was changed. Make it writable (chmod u+w params.yaml) first."
        )
    else:
        assert first.startswith("error: params.yaml: cannot be replaced (Permission denied); nothing was changed.")
    assert params.read_bytes() == original and sorted(p.name for p in work.iterdir()) == ["configs", "params.yaml"]


def test_reprofile_without_a_checkpoint_fails_before_mlflow_opens_its_store(tmp_path: Path) -> None:
    import shutil

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    store = tmp_path / "new-store" / "mlflow.db"
    env = dict(_env_without_store(), MLFLOW_TRACKING_URI=f"sqlite:///{store}")
    cmd = [sys.executable, "-m", "asp", "reprofile"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "INFO" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[0].startswith("error: outputs/launch_state/C4: no runtime checkpoint")
    assert not store.parent.exists()  # MLflow never opened (or created) the store
