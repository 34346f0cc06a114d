"""The layering the design promises, enforced: import-linter's contracts (pyproject.toml) hold, the mlflow
contract names every top-level module except `asp.tracking`, and `asp --help` loads no heavy library."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import asp

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "pandas", "numba", "mlflow", "prefect", "ray", "dvc", "transformers", "matplotlib")


def test_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is not installed (make install)"
    out = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_mlflow_contract_covers_every_module_but_tracking() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c.get("forbidden_modules") == ["mlflow"]]
    modules = {f"asp.{m.name}" for m in pkgutil.iter_modules(asp.__path__) if m.name != "__main__"}
    assert set(contract["source_modules"]) == modules - {"asp.tracking"}


def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys\nsys.argv = ['asp', '--help']\nfrom asp.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
