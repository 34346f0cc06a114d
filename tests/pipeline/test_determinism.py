"""Deterministic outputs: a stage run twice on the same inputs writes byte-identical files into the outputs later
stages depend on (no wall-clock values, no hash-ordered sets, no absolute paths of the run's directory).

train_predictor reruns in a fresh process with `PYTHONHASHSEED=0` (a set serialized in hash order differs between
processes; inside one it never would) and another output directory, against the session's run in this process.
profile runs twice in this process (tiny policy, 6 prompts, 8-token cap). Both keep their wall-clock values out of
those outputs: they go to the metrics files and the timings CSV, which nothing depends on.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from asp.pipeline import profile, train_predictor
from asp.steps.paths import rebase
from asp.tracking import NullTracker

from .conftest import TRAIN_THREADS, Built
from .test_profile import PARAMS as PROFILE_PARAMS
from .test_profile import _setup as setup_profile

# One train_predictor run on the given params and paths (JSON arguments), without tracking.
RUNNER = """
import json, sys
from pathlib import Path
from asp.config import validate_params
from asp.pipeline import train_predictor
from asp.tracking import NullTracker
raw, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
import torch
torch.set_num_threads(int(sys.argv[3]))
params = validate_params(raw, "test params")
train_predictor.run(params, train_predictor.Paths(**{k: Path(v) for k, v in paths.items()}), NullTracker())
"""


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file under `root`, by path relative to it."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def train_in_subprocess(params: dict[str, Any], paths: train_predictor.Paths, hash_seed: int) -> None:
    """Run the train_predictor stage in a fresh Python process with `PYTHONHASHSEED=hash_seed`."""
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed), ASP_PROGRESS="0")
    args = [json.dumps(params), json.dumps({k: str(v) for k, v in vars(paths).items()}), str(TRAIN_THREADS)]
    done = subprocess.run([sys.executable, "-c", RUNNER, *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"train_predictor failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_train_predictor_twice_gives_identical_bytes(tmp_path: Path, trained_predictor: Built) -> None:
    """The session's train_predictor run (this process) against a rerun in a fresh process, hash seed 0."""
    before = trained_predictor.paths
    params = trained_predictor.params.model_dump(mode="json")
    again = rebase(train_predictor.Paths(prompts=before.prompts, profile=before.profile), tmp_path)
    train_in_subprocess(params, again, hash_seed=0)
    first, second = digests(before.out_dir), digests(again.out_dir)
    full = params["predictor"]["lora"]["r"] == 0  # the whole backbone fine-tuned (the CPU default), else LoRA
    weights = "backbone.safetensors" if full else "adapter/adapter_config.json"
    assert {"predictor.json", weights, "head.safetensors"} <= first.keys()
    assert "adapter/README.md" not in first  # peft's model card names the backbone's install path
    assert first == second

    if not full:
        adapter = json.loads((again.out_dir / "adapter/adapter_config.json").read_text())
        assert adapter["target_modules"] == sorted(adapter["target_modules"])  # peft holds them as a set
        assert adapter["base_model_name_or_path"] == params["predictor"]["backbone"]  # "builtin:minilm", not a path
    info = json.loads((again.out_dir / "predictor.json").read_text())
    assert info["backbone_path"] == params["predictor"]["backbone"]
    assert "predictor/train_wall_s" not in info["meta"] and all("seconds" not in h for h in info["meta"]["history"])
    assert json.loads(again.metrics.read_text())["predictor/train_wall_s"] > 0  # timing kept in the metrics file


def test_profile_twice_gives_identical_bytes(tmp_path: Path, demo_policy: Built) -> None:
    runs = []
    for name in ("a", "b"):
        paths = setup_profile(tmp_path / name, demo_policy.paths.out_dir)
        profile.run(PROFILE_PARAMS, paths, NullTracker())
        runs.append(paths)
    first, second = (digests(p.out_dir) for p in runs)
    assert sorted(first) == ["prompts.parquet", "samples.parquet"] and first == second
    timings = [pd.read_csv(p.timings) for p in runs]  # wall times differ between runs; the work done does not
    assert (timings[0]["wall_s"] > 0).all()
    pd.testing.assert_frame_equal(timings[0].drop(columns="wall_s"), timings[1].drop(columns="wall_s"))
