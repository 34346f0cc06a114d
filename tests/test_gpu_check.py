"""scripts/gpu_check.py: the CPU dry run (tiny shapes of the same architectures, through the same GRPO trainer step,
predictor training step and hf engine as on a GPU) measures every part and writes its table; the estimate column is
`asp plan memory`'s number for the preset's settings; GPU mode without CUDA exits 2.

The dry run runs once per module in a subprocess (it sets torch to one thread): 20-40 s on a loaded 2-core machine,
most of it importing torch, transformers and peft."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from asp.sim.memory import BUILTIN, Architecture, TrainerSettings, trainer_memory
from asp.steps.memory_check import trainer_settings

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@functools.cache
def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """(completed process, the JSON record, the Markdown table) of one ``--dry-run``."""
    out = tmp_path_factory.mktemp("gpu_check") / "table"
    argv = [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)  # a hang guard; it takes 20-40 s
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["table.json", "table.md"]  # no temporary files left
    return proc, json.loads(out.with_name("table.json").read_text()), out.with_name("table.md").read_text()


def _table_line(md: str, part: str) -> list[str]:
    lines = [line for line in md.splitlines() if line.startswith(f"| {part} |")]
    assert len(lines) == 1, md
    return [cell.strip() for cell in lines[0].strip("|").split("|")]


@pytest.mark.slow  # the dry run: a subprocess, 20-40 s
def test_dry_run_measures_every_part_and_writes_the_table(dry_run):
    proc, record, md = dry_run
    gc = _load_script()
    assert record["mode"].startswith("CPU dry run") and record["device"] == "cpu"
    parts = {p["part"]: p for p in record["parts"]}
    assert list(parts) == list(gc.PARTS)
    for name, p in parts.items():
        assert p["status"] == "ok", (name, p["status"])
        assert p["seconds"] > 0 and p["throughput"] and p["settings"]
        assert p["peak_allocated"] is None  # no CUDA: not measured, and the table says so
        cells = _table_line(md, name)
        assert cells[2] == cells[3] == "n/a (CPU run)" and cells[-1] == "ok"
    # the same table on stdout and in the .md file; the JSON carries it too
    assert md.strip() == record["table"].strip() and record["table"].strip() in proc.stdout
    # GRPO: the planned micro-batches ran as real updates of the tiny policy (two per step, finite loss)
    for name in ("grpo-1.5b", "grpo-8b"):
        m = parts[name]["details"]["last_metrics"]
        assert m["train/micro_batches"] == 2 and m["train/response_tokens"] > 0 and m["train/prompts"] == 2
        assert parts[name]["details"]["padded_tokens_per_step"] == 2 * 128  # 2 micro-batches of 128 padded tokens
    assert parts["predictor"]["details"]["train_prompts"] == 32 and parts["predictor"]["details"]["trainable_params"]
    assert parts["generate"]["details"]["sequences"] == 8 and parts["generate"]["details"]["generated_tokens"] > 0


@pytest.mark.slow  # the dry run: a subprocess, 20-40 s
def test_estimate_column_is_asp_plan_memorys_estimate_for_the_preset(dry_run):
    _, record, md = dry_run
    gc = _load_script()
    # `asp plan memory -c gpu-cluster`'s settings function on the same overrides (one rank, the dry run's tokens)
    expected_settings = trainer_settings(gc.preset_params(gc.run_overrides(gc.DRY, 80.0)))
    assert expected_settings.world_size == 1 and expected_settings.mixed_precision
    assert expected_settings.activation_checkpointing and expected_settings.autocast
    for part, family in gc.POLICY_SHAPES.items():
        p = next(p for p in record["parts"] if p["part"] == part)
        arch = Architecture(**p["details"]["architecture"])
        settings = TrainerSettings(**p["details"]["trainer_settings"])
        assert settings == expected_settings
        # a tiny model of the built-in family: same bias / qk-norm / tying as the real one
        full = BUILTIN[family]
        assert (arch.attention_bias, arch.qk_norm, arch.tie_word_embeddings) == (
            full.attention_bias,
            full.qk_norm,
            full.tie_word_embeddings,
        )
        est = trainer_memory(arch, settings)
        assert p["estimate"] == est.device_total and p["estimate_reserve"] == est.device["reserve"]
        assert p["details"]["estimate_components"] == est.device
        cells = _table_line(md, part)
        assert cells[4] == gc.fmt_bytes(est.device_total, False)
        assert cells[5] == gc.fmt_bytes(est.device_total - est.device["reserve"], False)
    for part in ("predictor", "generate"):  # no trainer estimate for these
        assert _table_line(md, part)[4] == "-"


def test_gpu_mode_without_cuda_exits_2(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _load_script().main(["--out", str(tmp_path / "table")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--dry-run" in err
    assert not list(tmp_path.iterdir())  # nothing written
