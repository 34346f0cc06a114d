"""Bring your own lengths end to end: a user's prompts (data/my_prompts.jsonl) and a JSONL of (prompt, response
lengths) in rollouts/ train, evaluate, predict and schedule with plain `dvc repro`, no profiling pass, in a
real git + DVC copy of the project with tiny params. DVC stays truthful: the lengths file is the profile stage's
dependency (dvc.yaml's `${profile.lengths.path}`), so changing it makes `dvc status` name profile, and once
profile re-ran, the stages that read its outputs (train_predictor, evaluate, schedule). (That simulate skips
without a generated profile is tests/pipeline/test_profile_import.py's.) A bad record stops `asp stage profile`
with exit 2 and one message naming the file and line, leaving outputs/profile as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from asp.demo.task import generate_problems, intended_length

from .conftest import tiny_params

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS, N_PROFILE, N_HELDOUT, CAP = 96, 40, 30, 160
LENGTHS = "rollouts/lengths.jsonl"  # outside data/ (prepare's dependency): a change re-runs profile only

pytestmark = pytest.mark.slow


def _sh(cmd: list[str], repo: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ASP_PARENT_RUN_ID", "PREFECT_API_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    out = subprocess.run(cmd, cwd=repo, env=dict(env, DVC_NO_ANALYTICS="1"), capture_output=True, text=True)
    assert not ok or out.returncode == 0, (
        f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _sh([sys.executable, "-m", "dvc", *args], repo)


def _unique_problems(n: int, seed: int) -> list[dict]:
    """`n` demo problems with distinct texts: a lengths file matched by prompt text needs one prompt per text (a
    text of several prompts, profiled and held out, is refused: docs/lengths.md, Repeated prompt texts)."""
    seen: set[str] = set()
    out = [r for r in generate_problems(4 * n, seed=seed) if not (r["problem"] in seen or seen.add(r["problem"]))]
    assert len(out) >= n
    return out[:n]


def _write_lengths(repo: Path, records: list[dict], scale: float) -> dict[str, list[int]]:
    """Two response lengths per prompt: the demo's reference length x a seeded factor (learnable, not exact)."""
    rng = np.random.default_rng(int(scale * 10))
    lengths = {
        r["problem"]: [int(min(CAP, max(1, round(intended_length(r) * scale * f)))) for f in rng.uniform(0.8, 1.25, 2)]
        for r in records
    }
    rows = [{"prompt": p, "response_length": v} for p, v in lengths.items()]
    (repo / LENGTHS).parent.mkdir(exist_ok=True)
    (repo / LENGTHS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return lengths


def test_user_lengths_jsonl_through_dvc_repro(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for item in ("dvc.yaml", "stages", "src", "data", "configs", ".dvcignore"):
        src, ignore = ROOT / item, shutil.ignore_patterns("__pycache__", "*.egg-info", "*.jsonl", "*.parquet", "*.csv")
        (shutil.copytree(src, repo / item, ignore=ignore) if src.is_dir() else shutil.copy(src, repo / item))
    records = _unique_problems(N_PROMPTS, seed=11)
    (repo / "data/my_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lengths = _write_lengths(repo, records, 1.0)
    params = tiny_params(
        {
            "common": {"experiment": "byo-lengths"},
            "prepare": {
                "dataset": "data/my_prompts.jsonl",
                "profile_prompts": N_PROFILE,
                "heldout_prompts": N_HELDOUT,
            },
            "profile": {
                "source": "file",
                "max_new_tokens": CAP,
                "lengths": {"path": LENGTHS, "length_field": "response_length"},
            },
            "predictor": {"epochs": 1, "max_length": 32},
            "schedule": {"iterations": 2000, "ablation_seeds": 1},
        }
    )
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (repo / ".gitignore").write_text("/outputs/\n/plots/\n/mlartifacts/\n/mlflow.db\n__pycache__/\n")
    for cmd in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@example.com"],
        ["git", "config", "user.name", "t"],
    ):
        _sh(cmd, repo)
    _dvc(repo, "init", "-q")
    _sh(["git", "add", "-A"], repo)
    _sh(["git", "commit", "-qm", "project"], repo)

    first = _dvc(repo, "repro", "schedule")  # everything schedule needs runs
    stages = ("profile", "train_predictor", "evaluate", "predict", "schedule")
    assert all(f"Running stage '{s}'" in first.stdout for s in stages)
    samples = pd.read_parquet(repo / "outputs/profile/samples.parquet")
    prompts = pd.concat(pd.read_parquet(repo / f"outputs/prompts/{r}.parquet") for r in ("profile", "heldout"))
    text = dict(zip(prompts["prompt_id"], prompts["problem"], strict=True))
    assert len(samples) == 2 * (N_PROFILE + N_HELDOUT)
    assert all(g["length"].tolist() == lengths[text[pid]] for pid, g in samples.groupby("prompt_id"))
    metrics = json.loads((repo / "metrics/profile.json").read_text())
    assert metrics["profile/samples"] == len(samples) and "profile/tokens_per_s" not in metrics
    matched = metrics["profile/file_responses_matched"] + metrics["profile/file_responses_train_only"]
    assert matched == metrics["profile/file_responses"] == 2 * len(lengths)  # every prompt text prepare kept
    assert np.isfinite(json.loads((repo / "metrics/predictor.json").read_text())["predictor/kendall_tau"])
    assert (repo / "outputs/schedule/schedule.parquet").is_file() and (repo / "outputs/predictions.parquet").is_file()
    status = json.loads(_dvc(repo, "status", "--json").stdout)
    assert set(status) == {
        "trainer_alone",
        "simulate",
        "launch",
        "sim_check",
    }  # never run here; everything up to schedule is up to date

    _write_lengths(repo, records, 1.5)  # the user's file changes: profile and what follows are stale
    stale = json.loads(_dvc(repo, "status", "--json").stdout)
    assert set(stale) == {"profile", "trainer_alone", "simulate", "launch", "sim_check"}
    assert LENGTHS in json.dumps(stale["profile"])
    assert "Running stage 'profile'" in _dvc(repo, "repro", "profile").stdout
    assert pd.read_parquet(repo / "outputs/profile/samples.parquet")["length"].mean() > samples["length"].mean()
    after = json.loads(_dvc(repo, "status", "--json").stdout)  # the new lengths reach the predictor and evaluate
    assert {"train_predictor", "evaluate", "schedule"} <= set(after) and "profile" not in after

    before = (repo / "outputs/profile/samples.parquet").read_bytes()
    with (repo / LENGTHS).open("a") as f:
        f.write(json.dumps({"prompt": records[0]["problem"], "response_length": [12, -3]}) + "\n")
    bad = _sh([sys.executable, "-m", "asp", "stage", "profile"], repo, ok=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert f"{LENGTHS} line {len(lengths) + 1}: response length -3; response lengths must be positive" in bad.stderr
    assert (repo / "outputs/profile/samples.parquet").read_bytes() == before
