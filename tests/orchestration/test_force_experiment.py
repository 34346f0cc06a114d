"""`asp repro STAGE -f --set ...` forces the named stage only, as `asp repro STAGE -f` does: DVC's `--force` in an
experiment forced every upstream stage too (a forced launch re-ran policy, prepare, profile, ...). The command line
(unit) and a tiny two-stage DVC project (slow: `make` must not run again when `use` is forced in an experiment; a
stage that refuses a value in an experiment makes `asp repro` exit with the stage's code, DVC's error line once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asp.orchestration.dvc import dvc_exp_cmd
from tests.orchestration.tiny import commit_all, repro, two_stage_project


def test_a_forced_experiment_forces_the_named_stages_only() -> None:
    cmd = dvc_exp_cmd("e-1", ["launch"], {"runtime.iterations": 30}, force=True)
    assert cmd[-3:] == ["--force", "--single-item", "launch"]
    assert "--single-item" not in dvc_exp_cmd("e-1", ["launch"], {"runtime.iterations": 30})


@pytest.mark.slow
def test_force_with_set_reruns_only_the_named_stage(tmp_path: Path) -> None:
    repo = two_stage_project(tmp_path / "repo", tmp_path / "store.db", commit=True)
    assert repro(repo).returncode == 0
    commit_all(repo)  # an experiment starts from the commit (its outputs from DVC's cache)
    out = repro(repo, "use", "-f", "--set", "common.seed=7")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "Running stage 'use'" in text and "Running stage 'make'" not in text, text[-3000:]
    out = repro(repo, "use", "--set", "common.seed=13")  # the stage refuses it: exit 1 (sys.exit with a message)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "stage 'use' failed (the stage exited with 1, dvc with 255)" in text, text[-3000:]
    assert text.count("ERROR: failed to reproduce 'use'") == 1, text[-3000:]  # DVC printed it twice
