"""Record in dvc.lock the current hashes of the stages' code dependencies and their params, outputs untouched.

    python scripts/refresh_dvc_lock.py            # rewrite dvc.lock's deps / params entries that changed
    python scripts/refresh_dvc_lock.py --check    # exit 1 listing them, write nothing

For a change that leaves every stage's outputs as they were (a refactor, a new param with its old behaviour as the
default, a fix on a path the demo does not take), so that `dvc status` on a fresh clone lists only outputs that clone
has not built (what CI checks: scripts/check_dvc_status.py). It is what `dvc commit` does for the dependencies, on
a clone without the outputs: a dependency that is a file or folder of the repository is hashed with DVC's own
hashing; a dependency that is another stage's output (absent in a fresh clone) keeps its recorded hash; every
param a stage declares is read from params.yaml. Whether the outputs would really be unchanged is the committer's
claim (say why in the commit); when in doubt, run `asp repro` instead, which reruns what changed.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("DVC_NO_ANALYTICS", "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list what would change, write nothing")
    args = parser.parse_args()
    from dvc.repo import Repo

    repo = Repo(".")
    outputs = {str(o) for stage in repo.index.stages for o in stage.outs}
    changed: list[str] = []
    with repo.lock:
        for stage in repo.index.stages:
            if not stage.cmd:
                continue
            before = {str(d): d.hash_info for d in stage.deps}
            stage_changed = []
            for dep in stage.deps:
                path = str(dep)
                is_output = any(path == o or path.startswith(o.rstrip("/") + "/") for o in outputs)
                if (is_output or not os.path.exists(dep.fs_path)) and not hasattr(dep, "params"):
                    continue  # another stage's output (absent here): its recorded hash stays
                dep.save()
                if dep.hash_info != before[path]:
                    stage_changed.append(path)
            if stage_changed:
                changed.append(f"{stage.addressing}: {', '.join(stage_changed)}")
                if not args.check:
                    stage.dump(update_pipeline=False)
    print("\n".join(changed) if changed else "dvc.lock: every code dependency and param is recorded as it is")
    return 1 if (changed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
