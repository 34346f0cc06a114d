"""Length predictors in the MLflow Model Registry: the evaluate stage's is version 1 of `drift.registry_model`, every
accepted re-profile (`asp.pipeline.reprofile`) adds one. Registry bookkeeping never fails the caller.

    version = register_predictor(tracker, "asp-length-predictor", "outputs/predictor", {"tau": 0.61})
    predictor_versions("asp-length-predictor")     # [{"version": 1, "run_id": ..., "source": ..., "tags": {...}}]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp.tracking.protocol import Tracker
from asp.tracking.runs import MlflowTracker
from asp.tracking.store import mlflow_client, resolve_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("asp.tracking")


def register_predictor(
    tracker: Tracker,
    name: str,
    directory: str | Path,
    tags: Mapping[str, Any],
    *,
    artifact_path: str = "predictor",
) -> int | None:
    """Log a saved length predictor (`directory`: adapter, head, tokenizer, predictor.json) as artifacts of
    `tracker`'s run under `artifact_path` and register them as a new version of the registered model `name`
    (created when absent), with `tags` (values as text) and the run id as tag ``run_id``.

    Returns:
        The new registry version number; None with the no-op tracker, or when the store refused (a warning says
        why: registry bookkeeping never fails the caller).
    """
    if not isinstance(tracker, MlflowTracker):
        return None
    client = tracker.client
    try:
        tracker.log_artifact(directory, artifact_path)
        source = f"{client.get_run(tracker.run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
        _ensure_registered_model(client, name)
        all_tags = {**{k: str(v) for k, v in tags.items()}, "run_id": tracker.run_id}
        version = client.create_model_version(name, source, run_id=tracker.run_id, tags=all_tags)
    except Exception as exc:  # a store without a registry, a refused name, ...
        log.warning("could not register %s in the MLflow Model Registry as %r: %s", directory, name, exc)
        return None
    return int(version.version)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    """Create the registered model `name` unless it exists (another process may create it meanwhile)."""
    try:
        client.get_registered_model(name)
        return
    except Exception:  # RESOURCE_DOES_NOT_EXIST
        pass
    try:
        client.create_registered_model(name, description="asp length predictor (LoRA adapter + head + tokenizer)")
    except Exception:
        client.get_registered_model(name)  # created by someone else meanwhile; raises if it really failed


def predictor_versions(name: str, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """The registered versions of `name`, oldest first: ``version``, ``run_id``, ``source`` and ``tags``; [] when
    there are none or tracking is off."""
    if os.environ.get("ASP_TRACKING", "1") == "0":
        return []
    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    found = client.search_model_versions(f"name = '{name}'")
    rows = [{"version": int(v.version), "run_id": v.run_id, "source": v.source, "tags": dict(v.tags)} for v in found]
    return sorted(rows, key=lambda r: r["version"])
