"""benchmarks/history_real.py on one chain at the demo layout for two passes (phi-2-sft -> phi-2-dpo, the real
predictor's out-of-fold predictions): pass 1 has no history (every load is the prediction: C4 with history is C4 on
predictor loads), and at pass 2, with 90 % of the prompts seen, the loads rank the new policy's lengths better than
the predictor alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_two_passes_at_the_demo_layout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delitem(sys.modules, "history_real", raising=False)
    import history_real as bench

    out = tmp_path / "rows.json"
    bench.main(["--chains", "phi", "--layouts", "demo", "--passes", "2", "--anneal", "2000", "--json", str(out)])
    first, second = json.loads(out.read_text())["rows"]
    assert first["known"] == 0.0 and first["tau blend"] == first["tau pred"]
    assert first["iter C4 hist"] == first["iter C4 pred"]  # the same loads, the same schedule
    assert second["known"] == pytest.approx(1 - 80 / 805, abs=1e-9)  # the in-flight window: 16 + 1 x (2 + 2) x 16
    assert second["tau blend"] > second["tau pred"] + 0.08
    assert "| phi | demo | 2 |" in capsys.readouterr().out
