"""Length drift during the launch run: the pure parts (the launch stage wires them in, asp.adaptation.watch).

* ``monitor``  - ``MinibatchObservation``, ``window_stats``, ``length_trend``, ``DriftMonitor`` (metric dicts
  ``drift/...`` every ``window`` ingested minibatches)
* ``detector`` - ``DriftDetector`` (tau drop, calibration bias, length trend; patience, cooldown) -> ``DriftEvent``
* ``rebalance`` - ``rebalance`` (re-group undispatched minibatches on new loads: the ``recalibrate`` action)

numpy/scipy only (import-linter's pure-core contract). docs/drift.md describes the rules and measured rates.
Run the tests: ``.venv/bin/python -m pytest tests/drift -q``.
"""

from asp.drift.detector import SETTINGS, DriftDetector, DriftEvent
from asp.drift.monitor import DriftMonitor, MinibatchObservation, length_trend, window_stats

__all__ = [
    "DriftDetector",
    "DriftEvent",
    "DriftMonitor",
    "MinibatchObservation",
    "SETTINGS",
    "length_trend",
    "window_stats",
]
