"""scripts/gpu_smoke_profile.py: --help imports cleanly, and the hf engine path runs end to end on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke_profile.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_smoke_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_runs_without_gpu_or_vllm():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    assert "--model" in out.stdout and "--engine {vllm,hf}" in out.stdout


def test_hf_engine_on_cpu_end_to_end(tiny_model, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\nw4\nw5 w6\n")
    summary_path = tmp_path / "summary.json"
    argv = ["--model", str(tiny_model), "--engine", "hf", "--device", "cpu", "--prompts", str(prompts)]
    argv += ["--threads", "1", "--batch-size", "2", "--n", "2", "--max-tokens", "5", "--json-out", str(summary_path)]
    assert _load_script().main(argv) == 0
    summary = json.loads(summary_path.read_text())
    # 3 prompts in minibatches of 2 -> 2 minibatches, 3 * 2 = 6 samples, each 1..5 tokens
    assert (summary["minibatches"], summary["prompts"], summary["samples"]) == (2, 3, 6)
    assert 6 <= summary["generated_tokens"] <= 30 and summary["tokens_per_s"] > 0
    assert 0.0 <= summary["truncation_rate"] <= 1.0 and summary["mean_token_logprob"] < 0
    assert "minibatch 1: 1 prompts x 2" in capsys.readouterr().out


def test_missing_model_is_a_clean_error(tmp_path, capsys):
    assert _load_script().main(["--model", str(tmp_path / "nope"), "--engine", "hf"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_too_long_request_is_a_clean_error(tiny_model, capsys):
    # the tiny model has 128 positions: a 200-token cap cannot fit
    argv = ["--model", str(tiny_model), "--engine", "hf", "--device", "cpu", "--max-tokens", "200", "--warmup", "0"]
    assert _load_script().main(argv) == 2
    assert "max_position_embeddings=128" in capsys.readouterr().err
