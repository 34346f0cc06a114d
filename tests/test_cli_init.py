"""`asp init` end to end on CPU: init -> `asp params check --preset` (explains the keys init set, refuses a misfit)
-> the run's request check (`asp repro` has no dry-run flag: `check_request` is what it runs before any stage) and
`asp plan memory`. Bad input: one message, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from asp.cli.init import DEMO_DATASET, layout

ROOT = Path(__file__).resolve().parents[1]
QWEN3_8B = {  # the published config.json's size fields: the memory check reads only these
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
}


class Stdin:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def asp(*args: str) -> int:
    from asp.cli import main

    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    raise AssertionError("asp.cli.main must end with SystemExit")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the project's params, presets and DAG, with a policy and a predictor checkpoint (config only)."""
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    for folder, config in (("policy", QWEN3_8B), ("predictor", {"model_type": "qwen2"})):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", Stdin(tty=False))
    return tmp_path


GPU = ["--model", "policy", "--predictor", "predictor", "--gpus-per-node", "8", "--nodes", "2"]


def test_demo_dataset_is_the_configs() -> None:
    from asp.config import DEMO_DATASET as CONFIG_DEMO

    assert DEMO_DATASET == CONFIG_DEMO


@pytest.mark.parametrize(
    ("gpus", "nodes", "expected"),
    [(8, 2, (4, 3, 4)), (2, 1, (1, 1, 1)), (8, 1, (2, 2, 3)), (4, 3, (3, 3, 3)), (3, 1, (1, 1, 2))],
)
def test_layout_uses_every_gpu_once(gpus: int, nodes: int, expected: tuple[int, int, int]) -> None:
    lay = layout(gpus, nodes)
    assert (lay["world_size"], lay["generation_units"], lay["actors_per_unit"]) == expected
    assert lay["world_size"] + lay["generation_units"] * lay["actors_per_unit"] == gpus * nodes
    assert lay["actors_per_unit"] <= gpus


def test_gpu_init_then_check_then_the_runs_plan(project: Path, capsys: pytest.CaptureFixture) -> None:
    from asp.orchestration.request import RunRequest, check_request

    assert asp("init", *GPU) == 0
    written = (project / "configs/my-cluster.yaml").read_text()
    assert written.count("\n") < 25 and "extends: gpu-cluster" in written
    assert sorted(p.name for p in (project / "configs").iterdir()) == [
        "demo-vllm.yaml",
        "drift-demo.yaml",
        "gpu-cluster.yaml",
        "my-cluster.yaml",
    ]  # no temporary file left
    capsys.readouterr()
    assert asp("params", "check", "--preset", "my-cluster") == 0
    out = capsys.readouterr().out
    assert "runtime.grpo.world_size: 4   # derived: a quarter of the 16 GPUs train" in out
    assert "layout: 16 of 16 GPUs" in out and "trainer rank 64.3 of 80.0 GiB" in out
    assert asp("plan", "memory", "-c", "my-cluster") == 0
    params = check_request(RunRequest(preset="my-cluster"))  # what `asp repro --preset my-cluster` checks first
    assert params.policy.path == str(project / "policy") and params.runtime.engine.kind == "vllm"
    assert (params.runtime.ray.generation_units, params.runtime.ray.actors_per_unit) == (3, 4)
    assert params.schedule.b == 32  # inherited from gpu-cluster


def test_cpu_init_then_check_then_the_runs_plan(project: Path, capsys: pytest.CaptureFixture) -> None:
    from asp.orchestration.request import RunRequest, check_request

    assert asp("init", "--name", "my-cpu", "--gpus-per-node", "0", "--data", DEMO_DATASET) == 0
    assert "extends" not in (project / "configs/my-cpu.yaml").read_text()
    assert asp("params", "check", "--preset", "my-cpu") == 0
    assert "prepare.dataset: builtin:demo-arith   # --data" in capsys.readouterr().out
    assert check_request(RunRequest(stages=("prepare",), preset="my-cpu")).profile.engine.kind == "hf"
    assert asp("preset", "apply", "my-cpu") == 0


def test_a_layout_that_does_not_fit_is_refused_by_params_check(project: Path, capsys: pytest.CaptureFixture) -> None:
    assert asp("init", "--name", "small", *GPU[:4], "--gpus-per-node", "2", "--gpu-gib", "24") == 0
    capsys.readouterr()
    assert asp("params", "check", "--preset", "small") == 2
    err = capsys.readouterr().err
    assert "does not fit in memory" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nowhere", *GPU[2:]], "--model nowhere: no such directory"),
        (["--model", "configs", *GPU[2:]], "no config.json"),
        (GPU[2:], "--model is required with GPUs"),
        ([*GPU[:4], "--gpus-per-node", "1"], "1 GPU is too few"),
        (["--gpus-per-node", "0", "--nodes", "2"], "--nodes needs --gpus-per-node"),
        (["--gpus-per-node", "-1"], "--gpus-per-node -1: must be 0 or more"),
        (["--data", "params.yaml", "--gpus-per-node", "0"], "--data params.yaml: not a"),
        (["--name", "../x", "--gpus-per-node", "0"], "--name '../x'"),
        ([*GPU, "--gpu-gib", "-3"], "--gpu-gib -3: a GPU's memory in GiB must be more than 0"),
        (["--gpus-per-node", "0", "--gpu-gib", "-5"], "--gpu-gib -5: a GPU's memory in GiB must be more than 0"),
    ],
)
def test_bad_input_is_one_message_exit_2_and_writes_nothing(
    project: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    before = sorted(p.name for p in (project / "configs").iterdir())
    assert asp("init", *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1 and "Traceback" not in err
    assert sorted(p.name for p in (project / "configs").iterdir()) == before


@pytest.mark.parametrize("args", [[], ["--gpus-per-node", "0"]])
def test_init_without_paths_writes_the_demo_as_it_is(
    project: Path, capsys: pytest.CaptureFixture, args: list[str]
) -> None:
    """No flag (not on a terminal: nothing is asked) or `--gpus-per-node 0` alone: an overlay of comments only,
    which `asp params check --preset` and `asp preset apply` take as the demo unchanged."""
    assert asp("init", *args) == 0
    assert "wrote configs/my-cluster.yaml (0 keys)" in capsys.readouterr().out
    assert asp("params", "check", "--preset", "my-cluster") == 0
    assert "Traceback" not in capsys.readouterr().err


def test_the_builtin_predictor_is_taken_as_params_yaml_names_it(project: Path) -> None:
    assert asp("init", "--gpus-per-node", "0", "--predictor", "builtin:minilm") == 0
    assert "backbone: builtin:minilm   # --predictor" in (project / "configs/my-cluster.yaml").read_text()
    assert asp("init", "--force", *GPU[:2], "--predictor", "builtin:minilm", *GPU[4:]) == 0


def test_an_existing_preset_is_kept_unless_forced(project: Path, capsys: pytest.CaptureFixture) -> None:
    gpu_cluster = (project / "configs/gpu-cluster.yaml").read_text()
    assert asp("init", "--name", "gpu-cluster", *GPU) == 2
    assert "Pass --force" in capsys.readouterr().err
    assert (project / "configs/gpu-cluster.yaml").read_text() == gpu_cluster
    assert asp("init", "--out", "elsewhere/mine.yaml", *GPU) == 0
    assert asp("init", "--out", "elsewhere/mine.yaml", *GPU, "--nodes", "1", "--force") == 0
    assert "devices: 8" in (project / "elsewhere/mine.yaml").read_text()


def test_missing_flags_are_asked_on_a_terminal(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([4, 1, "policy", "", "predictor"])  # GPUs per node, nodes, model, data (base's), predictor
    monkeypatch.setattr(sys, "stdin", Stdin(tty=True))
    monkeypatch.setattr("typer.prompt", lambda *a, **k: next(answers))
    assert asp("init") == 0
    assert "world_size: 1" in (project / "configs/my-cluster.yaml").read_text()


def test_an_extends_cycle_is_refused(project: Path, capsys: pytest.CaptureFixture) -> None:
    (project / "configs/a.yaml").write_text("extends: b\n")
    (project / "configs/b.yaml").write_text("extends: a\n")
    assert asp("params", "check", "--preset", "a") == 2
    assert "a -> b -> a" in capsys.readouterr().err
