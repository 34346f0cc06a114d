"""`asp plan layout` answers or refuses any size a user can type within seconds: device counts outside 2..4096 and
grids of more than --max-candidates layouts are refused (exit 2, naming the option and what narrows it) before a
model is fitted, so these run without any pipeline output; `count_candidates` agrees with the grid it counts and
stops counting past its limit (a million devices take microseconds).

    .venv/bin/python -m pytest tests/sim/test_plan_layout_cli.py -q
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asp.sim.planner import Cluster, Grid, GridTooLarge, count_candidates, grid_candidates, search_layout

ROOT = Path(__file__).resolve().parents[2]


def _layout(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`asp plan layout ARGS` in a directory with the repository's params.yaml and no pipeline outputs."""
    if not (tmp_path / "params.yaml").exists():
        shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    cmd = [sys.executable, "-m", "asp", "plan", "layout", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (["--devices", "1000000"], "error: --devices 1000000: asp plan layout plans clusters of up to 4096 devices"),
        (["--devices", "0"], "error: --devices 0: a cluster needs at least 2 devices"),
        (["--devices", "-3"], "error: --devices -3: a cluster needs at least 2 devices"),
        (["--curve", "4,8,1000000"], "error: --curve 4,8,1000000: device count 1000000: asp plan layout plans"),
        (["--devices", "64"], "error: cannot plan this cluster: the search grid has more than --max-candidates 2000"),
        (["--devices", "4096", "--max-candidates", "100000"], "error: cannot plan this cluster: the search grid has"),
        (["--curve", "8,4096"], "error: --curve 8,4096: at 4096 devices, cannot plan this cluster: the search grid"),
        (["--max-candidates", "0"], "Usage: asp plan layout"),
    ],
)
def test_absurd_sizes_are_refused_before_anything_is_fitted(tmp_path: Path, args: list[str], first: str) -> None:
    out = _layout(tmp_path, *args)  # no outputs/ here: a refusal that came later would name a missing file
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[0].startswith(first), out.stderr
    if "search grid" in first:
        assert "--tu-devices" in out.stderr and "--generation-units" in out.stderr


def test_devices_in_params_are_capped_too(tmp_path: Path) -> None:
    out = _layout(tmp_path, "--set", "simulate.plan.devices=1000000")
    assert out.returncode == 2
    assert "'simulate.plan.devices' = 1000000 (from --set): Input should be less than or equal to 4096" in out.stderr


def test_count_candidates_matches_the_grid_and_stops_at_its_limit() -> None:
    rng = random.Random(0)
    checked = 0
    while checked < 200:
        node = rng.randint(1, 9)
        actor = rng.randint(1, node)
        devices = rng.randint(2, 80)
        try:
            cluster = Cluster(devices, actor, rng.randint(1, max(1, devices - actor)), 0.1, node)
        except ValueError:
            continue
        grid = Grid(
            q_max=(16, 32)[: rng.randint(1, 2)],
            b=(8,),
            k=(2, 4, 6)[: rng.randint(1, 3)],
            generation_units=rng.choice([None, tuple(rng.sample(range(1, 12), 3))]),
            actors_per_unit=rng.choice([None, tuple(rng.sample(range(1, 10), 2))]),
            tu_devices=rng.choice([None, tuple(rng.sample(range(1, 40), 3))]),
        )
        n = len(grid_candidates(cluster, grid))
        limit = rng.randint(0, 60)
        assert count_candidates(cluster, grid) == n
        assert count_candidates(cluster, grid, limit=limit) == min(n, limit + 1)
        checked += 1


def test_a_huge_grid_is_refused_without_being_built() -> None:
    t0 = time.perf_counter()
    with pytest.raises(GridTooLarge, match="more than max_candidates = 400 "):
        search_layout(Cluster(1_000_000, 1, 1, 0.0, 8), lambda c: {}, Grid(q_max=(32,), b=(16,), k=(4,)))
    assert time.perf_counter() - t0 < 10  # the old code built ~10^12 candidates first (never finished)
