"""The CI's `dvc status` check tells outputs a fresh clone has not built from real changes."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
check = runpy.run_path(str(ROOT / "scripts/check_dvc_status.py"))


def test_missing_outputs_pass_and_changed_code_or_params_fail() -> None:
    outputs = {"outputs/policy", "outputs/prompts", "metrics/prepare.json"}
    fresh = {
        "prepare": [
            {"changed deps": {"outputs/policy": "deleted", "outputs/prompts/x.parquet": "deleted"}},
            {"changed outs": {"outputs/prompts": "not in cache", "metrics/prepare.json": "deleted"}},
        ]
    }
    assert check["problems"](fresh, outputs) == []
    stale = {
        "prepare": [
            {"changed deps": {"src/asp/pipeline/prepare.py": "modified", "data": "deleted"}},
            {"changed params": {"params.yaml": {"prepare.b": "modified"}}},
            "changed command",
        ]
    }
    assert check["problems"](stale, outputs) == [
        "prepare: changed deps: src/asp/pipeline/prepare.py: modified",
        "prepare: changed deps: data: deleted",
        "prepare: changed params: params.yaml: {'prepare.b': 'modified'}",
        "prepare: changed command",
    ]


def test_refresh_dvc_lock_records_code_deps_and_params_without_outputs(tmp_path: Path) -> None:
    """scripts/refresh_dvc_lock.py on a clone without the outputs: a changed code dependency and a changed param are
    recorded (dvc status then names only the missing output), the output's recorded hash stays; --check only lists."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
        assert not ok or done.returncode == 0, done.stdout + done.stderr
        return done

    dvc = (sys.executable, "-m", "dvc")
    script = str(ROOT / "scripts/refresh_dvc_lock.py")
    run("git", "init", "-q")
    run(*dvc, "init", "-q")
    (tmp_path / "code.py").write_text("print('v1')\n")
    (tmp_path / "params.yaml").write_text("p: 1\n")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: python code.py > out.txt\n"
        "    deps: [code.py]\n    params: [p]\n    outs: [out.txt]\n"
    )
    run(*dvc, "repro", "-q")
    lock = lambda: yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"]["make"]  # noqa: E731
    outs = lock()["outs"]
    (tmp_path / "out.txt").unlink()  # as in a fresh clone
    run(*dvc, "gc", "-w", "-f", "-q")
    (tmp_path / "code.py").write_text("print('v1')  # a comment: outputs unchanged\n")
    (tmp_path / "params.yaml").write_text("p: 2\n")

    check = run(sys.executable, script, "--check", ok=False)
    assert check.returncode == 1 and "make: code.py, params.yaml" in check.stdout
    run(sys.executable, script)
    assert lock()["outs"] == outs and lock()["params"]["params.yaml"] == {"p": 2}
    status = json.loads(run(*dvc, "status", "--json").stdout)
    assert status == {"make": [{"changed outs": {"out.txt": "deleted"}}]}
    assert run(sys.executable, script, "--check").returncode == 0
