"""The pipeline's stages, one module each: `run(params, paths, tracker)` = load -> compute -> save -> log.

Each stage module has a frozen `Paths` dataclass whose defaults are the repository-relative paths that
`dvc.yaml` lists; `rebase(paths, root)` moves every one of them under another root (tests, scratch runs).
Stage modules never import each other; what several of them read lives in `asp.pipeline.loaders`. The list
and order of stages is `dvc.yaml` (see `asp.stage.stage_names`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TypeVar

P = TypeVar("P")


def rebase(paths: P, root: str | Path) -> P:
    """A copy of the stage's `Paths` with every relative path placed under `root` (absolute ones kept)."""
    root = Path(root)
    moved = {
        f.name: root / value
        for f in dataclasses.fields(paths)  # type: ignore[arg-type]
        if isinstance(value := getattr(paths, f.name), Path) and not value.is_absolute()
    }
    return dataclasses.replace(paths, **moved)  # type: ignore[type-var]
