"""The simulator refuses to model a GPU run from CPU measurements (issue: the GPU preset inherited the CPU demo's
`simulate:` settings and printed meaningless numbers). `gpu_gaps` lists what is missing; the stage's model fit,
`asp simulate` and `asp params check` refuse with that list; `asp simulate fit-training` records where the times
were measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from asp.config import deep_merge, load_params, read_yaml, validate_params
from asp.errors import UserError
from asp.pipeline.simulate import Paths, fit_models, gpu_gaps
from tests.inprocess import run_asp

ROOT = Path(__file__).resolve().parents[2]


def _gpu(**overrides: dict) -> object:
    """params.yaml + configs/gpu-cluster.yaml + overrides (section -> dict, deep-merged)."""
    raw = deep_merge(read_yaml(ROOT / "params.yaml"), read_yaml(ROOT / "configs/gpu-cluster.yaml"))
    for section, values in overrides.items():
        raw = deep_merge(raw, {section: values})
    return validate_params(raw, "gpu test params")


def _asp(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`asp ARGS` in this process (`tests.inprocess.run_asp`; the script's own exit 2: tests/test_cli.py)."""
    return run_asp(list(args), cwd)


def test_the_cpu_demo_has_no_gaps() -> None:
    assert gpu_gaps(load_params(ROOT / "params.yaml")) == []


def test_the_gpu_preset_lacks_only_gpu_training_times() -> None:
    params = _gpu()
    assert not params.simulate.enabled and params.simulate.cores is None
    (gap,) = gpu_gaps(params)
    assert "simulate.training" in gap and "asp simulate fit-training" in gap
    fitted = _gpu(simulate={"training": {"measured_on": "cuda"}})
    assert gpu_gaps(fitted) == []


def test_each_gap_is_named() -> None:
    gaps = gpu_gaps(_gpu(simulate={"cores": 2.0, "generation_form": "static"}, profile={"engine": {"kind": "hf"}}))
    assert len(gaps) == 4
    joined = " ".join(gaps)
    for key in ("profile.engine", "simulate.generation_form", "simulate.cores", "simulate.training"):
        assert key in joined
    # the simulated trainer's times are params, not measurements: nothing to fit on GPUs
    # (one rank: the params refuse the simulated trainer with grpo.world_size > 1)
    assert gpu_gaps(_gpu(runtime={"trainer": {"kind": "simulated"}, "grpo": {"world_size": 1}})) == []


def test_the_fit_refuses_before_reading_anything(tmp_path: Path) -> None:
    missing = Paths(timings=tmp_path / "none.csv", predictions=tmp_path / "none.parquet")
    with pytest.raises(UserError, match=r"cannot model this GPU run yet.*\(1\) simulate.training"):
        fit_models(_gpu(simulate={"enabled": True}), missing)
    with pytest.raises(UserError, match="none.csv: missing"):  # without gaps it goes on to read its inputs
        fit_models(_gpu(simulate={"enabled": True, "training": {"measured_on": "cuda"}}), missing)


def test_params_check_notes_or_refuses() -> None:
    out = _asp("params", "check", "--preset", "gpu-cluster")
    assert out.returncode == 0, out.stderr
    assert "note: simulate is off; before turning it on" in out.stdout and "fit-training" in out.stdout
    out = _asp("params", "check", "--preset", "gpu-cluster", "--set", "simulate.enabled=true")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot model this GPU run yet" in out.stderr and "simulate.training" in out.stderr
    out = _asp("simulate", "--set", "runtime.engine.kind=vllm")  # the CPU demo with vLLM actors: profiled with hf
    assert out.returncode == 2 and "profile.engine.kind is 'hf' but runtime.engine.kind is 'vllm'" in out.stderr


def test_fit_training_records_where_it_was_measured(tmp_path: Path) -> None:
    from tests.sim.test_timemodel import synthetic_iterations

    synthetic_iterations().to_parquet(tmp_path / "iterations.parquet")
    gpu = deep_merge(read_yaml(ROOT / "params.yaml"), read_yaml(ROOT / "configs/gpu-cluster.yaml"))
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(gpu))
    out = _asp("simulate", "fit-training", str(tmp_path / "iterations.parquet"), "-p", str(tmp_path / "gpu.yaml"))
    assert out.returncode == 0, out.stderr
    training = yaml.safe_load(out.stdout)["simulate"]["training"]
    assert training["measured_on"] == "cuda" and training["step_base_s"] == pytest.approx(0.8, abs=0.05)
    fitted = _gpu(simulate={"training": training, "enabled": True})  # pasted back, the preset is complete
    assert gpu_gaps(fitted) == []
    out = _asp("simulate", "fit-training", str(tmp_path / "iterations.parquet"))  # the CPU demo's params
    assert yaml.safe_load(out.stdout)["simulate"]["training"]["measured_on"] == "cpu"


def test_simulate_set_errors_point_at_the_override() -> None:
    out = _asp("simulate", "--set", "schedule.b=0")
    assert out.returncode == 2 and "(from --set)" in out.stderr and "Fix the --set value" in out.stderr
