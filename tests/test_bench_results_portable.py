"""Committed benchmark results name no machine's folders (a temporary output path, a virtual environment's python):
they are read on other machines and in other clones. `benchmarks/partial_rollouts.py` records its --json by name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"""["'\s](/tmp|/work|/root|/home|/Users|/private|/var/folders)/""")


def test_committed_results_hold_no_machine_paths() -> None:
    found = {
        str(path.relative_to(ROOT)): match.group(0).strip("\"' ")
        for path in sorted((ROOT / "benchmarks/results").iterdir())
        if path.is_file()
        for match in [MACHINE_PATH.search(path.read_text(errors="replace"))]
        if match
    }
    assert found == {}


def test_partial_rollouts_records_a_path_argument_by_its_name() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("partial_rollouts", ROOT / "benchmarks/partial_rollouts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._portable(Path("/tmp/b37/sim_lag2.json")) == "sim_lag2.json" and module._portable(3) == "3"
