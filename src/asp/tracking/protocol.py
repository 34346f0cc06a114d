"""The `Tracker` protocol every stage and the runtime log through, its no-op implementation, and the names of the
environment variables that tie a stage's run to its pipeline (no mlflow here: `asp.tracking.runs` has the adapter).

    tracker: Tracker = NullTracker()      # records nothing, same signatures: code never branches on tracking
    tracker.log_metrics({"prepare/prompts": 2000})
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PARENT_ENV = "ASP_PARENT_RUN_ID"
PREFECT_RUN_ENV, PREFECT_URL_ENV = "ASP_PREFECT_FLOW_RUN_ID", "ASP_PREFECT_FLOW_RUN_URL"


@runtime_checkable
class Tracker(Protocol):
    """What stages and the runtime may log. Implementations never raise on a closed store."""

    @property
    def run_id(self) -> str | None:
        """The run's id; None when nothing is recorded."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def log_figure(self, figure: Figure, name: str) -> None: ...

    def log_dict(self, data: Mapping[str, Any], name: str) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class NullTracker:
    """A tracker that records nothing, with the same signatures (code never branches on tracking)."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        return None

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        return None

    def log_figure(self, figure: Figure, name: str) -> None:
        return None

    def log_dict(self, data: Mapping[str, Any], name: str) -> None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to dotted keys: {'a': {'b': 1}} -> {'a.b': 1}."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def log_text(tracker: Tracker, text: str, name: str) -> None:
    """Log a small text file as an artifact (via a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_text(text)
        parent = str(Path(name).parent)
        tracker.log_artifact(path, None if parent == "." else parent)
