"""Offline-friendly defaults, set by the project's own entry points (never the user's shell).

DVC analytics off, Prefect analytics off, MLflow telemetry off, Hugging Face hub offline. Values the user
already set win (`os.environ.setdefault`).
"""

from __future__ import annotations

import os

OFFLINE_DEFAULTS = {
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def set_offline_defaults() -> None:
    """Apply `OFFLINE_DEFAULTS` without overriding anything already in the environment."""
    for key, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)
