"""Save a figure: PNG next to the DVC outputs (so nobody needs `dvc plots show`'s online scripts), written
atomically, logged under plots/ in the stage's MLflow run, then closed. Selects matplotlib's Agg backend (no
display needed) before pyplot is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from asp.io import atomic_path  # noqa: E402
from asp.tracking import Tracker  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def save_figure(fig: Figure, path: str | Path, tracker: Tracker | None = None, dpi: int = 110) -> Path:
    """Write `fig` to `path` (PNG, atomically), log it under plots/ in the tracker, close it."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    if tracker is not None:
        tracker.log_artifact(path, "plots")
    plt.close(fig)
    return path
