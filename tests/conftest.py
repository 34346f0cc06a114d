"""Shared test setup: offline env, quiet progress bars, MLflow in a temporary SQLite store."""

from __future__ import annotations

import os

import pytest

from asp.env import set_offline_defaults

set_offline_defaults()
os.environ.setdefault("ASP_PROGRESS", "0")


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test logs to a throwaway SQLite store, never the repo's mlflow.db."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri
