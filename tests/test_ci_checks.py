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
