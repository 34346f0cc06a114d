"""Params -> memory estimate (architecture from a built-in name, a config.json, or the demo policy) and the two
commands that use it: `asp plan memory` prints the table and exits 2 with what to change on a misfit; `asp params
check` passes the shipped GPU preset and refuses Qwen3-8B on one fp32 GPU. In-process through `asp.cli.main`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asp.cli.plan import load_params_with
from asp.errors import UserError
from asp.sim.memory import BUILTIN
from asp.steps.memory_check import enforce, memory_report, resolve_architecture

ROOT = Path(__file__).resolve().parents[2]
ONE_GPU_8B = [
    "--set", "runtime.grpo.world_size=1",
    "--set", "runtime.grpo.mixed_precision=none",
    "--set", "runtime.grpo.activation_checkpointing=false",
]  # fmt: skip


def _main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_demo_params_fit_and_cpu_is_not_enforced(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _main(capsys, "plan", "memory")
    assert code == 0 and "demo policy" in out and "memory: fits" in out
    assert "| trainer component | device GiB | host GiB |" in out and "not enforced" in out


def test_8b_on_one_cuda_rank_is_refused_with_numbers_and_fixes(capsys: pytest.CaptureFixture) -> None:
    args = ["--set", "runtime.memory.architecture=qwen3-8b", "--set", "runtime.grpo.device=cuda"]
    code, out, err = _main(capsys, "plan", "memory", *args)
    assert code == 2 and "does NOT fit" in out and "Traceback" not in err
    assert "trainer device: needs" in err and "of 80.0 GiB per rank" in err
    assert "runtime.grpo.world_size" in err or "no single change fits" in err


def test_gpu_preset_fits_and_prints_both_devices(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _main(capsys, "plan", "memory", "-c", "gpu-cluster")
    assert code == 0 and "built-in qwen3-8b" in out and "10240-token sequences that fit" in out
    code, out, _ = _main(capsys, "plan", "memory", "-c", "gpu-cluster", "--json")
    data = json.loads(out)
    assert code == 0 and data["fits"] and data["generation"]["sequences"] >= 1
    assert data["trainer"]["device_total"] <= data["trainer"]["capacity"]


def test_params_check_passes_the_preset_and_refuses_one_fp32_gpu(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _main(capsys, "params", "check", "--preset", "gpu-cluster")
    assert code == 0 and "OK" in out and "memory (built-in qwen3-8b): trainer rank" in out
    code, out, err = _main(capsys, "params", "check", "--preset", "gpu-cluster", *ONE_GPU_8B)
    assert code == 2 and "OK" not in out and "Traceback" not in err
    assert "the layout does not fit in memory" in err and "parameters 30.5, gradients 30.5, optimizer 61.0" in err
    assert sum(line.startswith("error") for line in err.splitlines()) == 1


def test_bad_architecture_name_exits_2_naming_it_and_the_choices(capsys: pytest.CaptureFixture) -> None:
    code, _, err = _main(capsys, "plan", "memory", "--set", "runtime.memory.architecture=qwen9-1t")
    assert code == 2 and "runtime.memory.architecture = 'qwen9-1t'" in err and "qwen3-8b" in err
    code, out, _ = _main(capsys, "plan", "memory", "--list")
    assert code == 0 and all(name in out for name in BUILTIN)


def test_missing_checkpoint_skips_the_check_with_a_note(capsys: pytest.CaptureFixture) -> None:
    args = ["--preset", "gpu-cluster", "--set", "runtime.memory.architecture=null"]
    code, out, _ = _main(capsys, "params", "check", *args)
    assert code == 0 and "memory check skipped" in out and "set runtime.memory.architecture" in out


def test_demo_vocabulary_is_the_demo_tokenizers() -> None:
    from asp.demo.tokenizer import VOCAB_SIZE
    from asp.steps.memory_check import DEMO_VOCAB_SIZE

    assert DEMO_VOCAB_SIZE == VOCAB_SIZE


def test_architecture_from_the_policy_config_json(tmp_path: Path) -> None:
    config = {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    sets = [f"policy.path={tmp_path}", "runtime.memory.architecture=null"]
    params = load_params_with(Path("params.yaml"), "gpu-cluster", sets)
    arch, source = resolve_architecture(params)
    assert arch == BUILTIN["qwen2.5-1.5b"] and source.endswith("config.json")
    report = memory_report(params)
    assert report is not None and report.fits
    (tmp_path / "config.json").write_text("{}")  # not a decoder config: the check is skipped, saying why
    arch, why = resolve_architecture(params)
    assert arch is None and why == (
        f"{tmp_path / 'config.json'}: config.json has no 'num_attention_heads'; "
        "it is not a Llama/Qwen-style decoder config"
    )
    assert memory_report(params) is None


def test_enforce_respects_the_check_flag() -> None:
    sets = ["runtime.grpo.world_size=1", "runtime.grpo.mixed_precision=none"]
    params = load_params_with(Path("params.yaml"), "gpu-cluster", sets)
    with pytest.raises(UserError, match="does not fit"):
        enforce(params)
    off = load_params_with(Path("params.yaml"), "gpu-cluster", [*sets, "runtime.memory.check=false"])
    assert enforce(off) is None


def test_launch_refuses_a_misfit_before_reading_its_inputs(tmp_path: Path) -> None:
    from asp.pipeline import launch
    from asp.tracking import NullTracker

    params = load_params_with(Path("params.yaml"), "gpu-cluster", ["runtime.grpo.world_size=1"])
    missing = launch.Paths(prompts=tmp_path / "none.parquet", out_dir=tmp_path / "out", state_dir=tmp_path / "s")
    with pytest.raises(UserError, match="trainer device: needs"):
        launch.run(params, missing, NullTracker())


def test_planner_takes_the_training_units_minimum_size_from_the_memory_estimate() -> None:
    from dataclasses import replace

    from asp.sim.memory import trainer_memory
    from asp.steps.memory_check import min_trainer_devices, trainer_settings

    gpu = load_params_with(ROOT / "params.yaml", "gpu-cluster", [])
    n, why = min_trainer_devices(gpu)
    arch = BUILTIN["qwen3-8b"]
    base = trainer_settings(gpu)
    assert trainer_memory(arch, replace(base, world_size=n)).fits
    assert not trainer_memory(arch, replace(base, world_size=n - 1)).fits  # the smallest, not just one that fits
    assert f"world_size {n}" in why
    assert min_trainer_devices(load_params_with(ROOT / "params.yaml", None, [])) is None  # CPU demo: no bound
