"""CI check: after the test suite, `dvc status` reports nothing but outputs a fresh clone has not built yet.

    python scripts/check_dvc_status.py      # exit 0: clean; exit 1: lists what changed

On a fresh clone the pipeline has not run, so outputs are missing ("deleted", "not in cache") and so are the
dependencies that are other stages' outputs. Anything else means dvc.lock does not match the code or params
(a code change committed without its lock), or a test wrote into a dependency (a cache file, a params file):
the next `make run` would rerun stages for nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

MISSING = {"deleted", "not in cache"}


def is_output(path: str, outputs: set[str]) -> bool:
    """Whether `path` is a stage output or lies inside one (outputs/prompts/train.parquet)."""
    return any(path == o or path.startswith(o.rstrip("/") + "/") for o in outputs)


def problems(status: dict[str, Any], outputs: set[str]) -> list[str]:
    """What in `dvc status --json` is not just a missing output (or a dependency that is a missing output)."""
    found = []
    for stage, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):  # "changed command", "always changed"
                found.append(f"{stage}: {change}")
                continue
            for kind, entries in change.items():
                for path, state in (entries or {}).items():
                    missing_out = kind == "changed outs" and state in MISSING
                    missing_dep = kind == "changed deps" and state in MISSING and is_output(path, outputs)
                    if not (missing_out or missing_dep):
                        found.append(f"{stage}: {kind}: {path}: {state}")
    return found


def stage_outputs() -> set[str]:
    from pathlib import Path

    import yaml

    stages = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    outs = set()
    for spec in stages.values():
        for key in ("outs", "metrics", "plots"):
            outs |= {next(iter(e)) if isinstance(e, dict) else e for e in spec.get(key) or []}
    return outs


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"dvc status failed:\n{out.stderr}", file=sys.stderr)
        return 1
    status = json.loads(out.stdout or "{}")
    found = problems(status, stage_outputs())
    if found:
        print("dvc status is not clean (beyond outputs not built yet):\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    print(f"dvc status: clean ({len(status)} stage(s) only lack outputs this clone has not built)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
