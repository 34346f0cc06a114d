"""`asp params check` refuses a layout the declared cluster cannot hold (Training Unit ranks and generation actors vs
simulate.plan.devices / runtime.ray.num_gpus / a node / vLLM's tensor parallelism) and an MoE policy whose experts do
not fit (Qwen3-30B-A3B read as 30.5B parameters, not 3.3B); launch refuses the same MoE misfit before reading its
inputs. In-process through `asp.cli.main` (exit codes and messages as the shell sees them), one subprocess for the
issue's own command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asp.cli.plan import load_params_with
from asp.errors import UserError
from asp.steps.layout_check import gpu_demand, layout_problems

ROOT = Path(__file__).resolve().parents[2]
MOE = ["--set", "runtime.memory.architecture=qwen3-30b-a3b"]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_issue_example_100000_ranks_on_a_declared_8_gpu_cluster_exits_2() -> None:
    # the command line of the issue, in a fresh process: before, it printed OK and "the memory plan fits"
    sets = ["runtime.grpo.world_size=100000", "runtime.ray.trainer_num_gpus=1", "runtime.grpo.device=cuda"]
    cmd = [sys.executable, "-m", "asp", "params", "check", *(a for s in sets for a in ("--set", s))]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 2 and "OK" not in res.stdout and "Traceback" not in res.stderr, res.stderr
    assert "the layout needs 100000 GPUs" in res.stderr
    assert "runtime.grpo.world_size 100000 x runtime.ray.trainer_num_gpus 1" in res.stderr
    assert "but the cluster has 8 (simulate.plan.devices)" in res.stderr
    assert "a rank fits in memory from world_size 1" in res.stderr and "set simulate.plan.devices" in res.stderr


def test_preset_fits_its_16_gpus_and_one_more_actor_does_not(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _main(capsys, "params", "check", "--preset", "gpu-cluster")
    assert code == 0 and "layout: 16 of 16 GPUs (simulate.plan.devices): Training Unit 4, generation 12" in out
    code, out, err = _main(
        capsys, "params", "check", "--preset", "gpu-cluster", "--set", "runtime.ray.actors_per_unit=5"
    )
    assert code == 2 and "OK" not in out and "the layout needs 19 GPUs" in err
    assert "generation 15 (runtime.ray.generation_units 3 x actors_per_unit 5 x actor_num_gpus 1)" in err
    assert sum(line.startswith("error") for line in err.splitlines()) == 1


def test_local_ray_gpus_node_size_and_tensor_parallel(capsys: pytest.CaptureFixture) -> None:
    gpu = load_params_with(ROOT / "params.yaml", "gpu-cluster", [])
    assert layout_problems(gpu) == [] and gpu_demand(gpu).total == 16
    local = load_params_with(
        ROOT / "params.yaml", "gpu-cluster", ["runtime.ray.address=null", "runtime.ray.num_gpus=8"]
    )
    (problem,) = layout_problems(local)
    assert "the local Ray cluster gets 8 (runtime.ray.num_gpus" in problem
    joined = load_params_with(ROOT / "params.yaml", "gpu-cluster", ["runtime.ray.num_gpus=8"])  # ray.address: auto
    assert layout_problems(joined) == []  # ray.num_gpus only sizes a local cluster
    wide = load_params_with(
        ROOT / "params.yaml", "gpu-cluster", ["runtime.ray.trainer_num_gpus=9", "simulate.plan.devices=64"]
    )
    (problem,) = layout_problems(wide)
    assert "runtime.ray.trainer_num_gpus = 9, but a node has 8 GPUs (simulate.plan.devices_per_node)" in problem
    tp = ["--set", "runtime.engine.vllm.tensor_parallel_size=2"]
    code, _, err = _main(capsys, "params", "check", "--preset", "gpu-cluster", *tp)
    assert code == 2 and "set runtime.ray.actor_num_gpus to 2" in err
    half = load_params_with(
        ROOT / "params.yaml", "drift-demo", ["runtime.ray.actor_num_gpus=0.5", "runtime.ray.actors_per_unit=4"]
    )
    assert layout_problems(half) == [] and gpu_demand(half).total == 2  # fractional GPUs add up as Ray counts them


def test_cpu_demo_asks_no_gpus_and_passes(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _main(capsys, "params", "check", "--set", "runtime.grpo.world_size=64")
    assert code == 0 and "layout:" not in out  # CPU ranks: Ray's CPUs bound them, checked by launch
    demo = load_params_with(ROOT / "params.yaml", None, [])
    assert gpu_demand(demo).total == 0 and layout_problems(demo) == []


def test_moe_preset_that_cannot_fit_is_refused_by_params_check_and_plan_memory(capsys: pytest.CaptureFixture) -> None:
    code, out, err = _main(capsys, "plan", "memory", "-c", "gpu-cluster", *MOE)
    assert code == 2 and "30.53B parameters (3.35B active per token: 8 of 128 experts of 768" in out
    assert "| optimizer | 56.9 | - |" in out  # 8 B x 30.5B / 4 ranks: every expert's AdamW moments
    assert "raise runtime.grpo.world_size to 10" in err
    one = ["--set", "runtime.grpo.world_size=1"]
    code, out, err = _main(capsys, "params", "check", "--preset", "gpu-cluster", *MOE, *one)
    assert code == 2 and "OK" not in out and "Traceback" not in err
    assert "the layout does not fit in memory" in err and "parameters 113.7, gradients 113.7, optimizer 227.5" in err
    assert sum(line.startswith("error") for line in err.splitlines()) == 1
    # the memory fix (10 ranks) needs 22 GPUs with the preset's 12 actors: the layout check says so next
    code, _, err = _main(
        capsys, "params", "check", "--preset", "gpu-cluster", *MOE, "--set", "runtime.grpo.world_size=10"
    )
    assert code == 2 and "the layout needs 22 GPUs" in err
    fits = [
        "--set",
        "runtime.grpo.world_size=10",
        "--set",
        "runtime.ray.generation_units=1",
        "--set",
        "runtime.ray.actors_per_unit=6",
    ]
    code, out, _ = _main(capsys, "params", "check", "--preset", "gpu-cluster", *MOE, *fits)
    assert code == 0 and "layout: 16 of 16 GPUs" in out and "memory (built-in qwen3-30b-a3b): trainer rank" in out


def test_launch_refuses_the_moe_misfit_before_reading_its_inputs(tmp_path: Path) -> None:
    from asp.pipeline import launch
    from asp.tracking import NullTracker

    sets = ["runtime.memory.architecture=qwen3-30b-a3b", "runtime.grpo.world_size=1"]
    params = load_params_with(ROOT / "params.yaml", "gpu-cluster", sets)
    missing = launch.Paths(prompts=tmp_path / "none.parquet", out_dir=tmp_path / "out", state_dir=tmp_path / "s")
    with pytest.raises(UserError, match=r"trainer device: needs 4\d\d\.\d GiB of 80\.0 GiB"):
        launch.run(params, missing, NullTracker())
