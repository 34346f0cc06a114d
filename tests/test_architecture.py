"""The layering the design promises, enforced: import-linter's contracts (pyproject.toml) hold, the mlflow
contract names every top-level module except `asp.tracking`, no module of `asp` is part of an import cycle (type-only
imports included), every package's `__init__` follows the one convention, and `asp --help` loads no heavy library."""

from __future__ import annotations

import ast
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

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


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module in `graph` (Tarjan, iterative): each is a set of
    modules that import each other, directly or through the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_import_cycles_are_found() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d", "a.e"):
        graph.add_module(module)
    for importer, imported in (("a.b", "a.c"), ("a.c", "a.d"), ("a.d", "a.b"), ("a.d", "a.e"), ("a", "a.b")):
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [["a.b", "a.c", "a.d"]]
    graph.remove_import(importer="a.d", imported="a.b")
    assert import_cycles(graph) == []


def test_no_import_cycle_in_asp() -> None:
    """No import forms a cycle: those made at run time (module level or inside functions) and those under
    `if TYPE_CHECKING:` too (a type-only cycle is still two modules that each need the other to be read)."""
    graph = grimp.build_graph("asp", exclude_type_checking_imports=False)
    assert import_cycles(graph) == []


# The package convention (README, "Layout"): a package's __init__.py is a docstring saying what the package is and how
# to use it, then nothing, or re-exports of its public names listed in __all__ (eager imports, or a PEP 562
# __getattr__/__dir__ that loads them lazily). Functions and classes live in the package's modules.
LAZY_LOADERS = {"__getattr__", "__dir__"}
INIT_WITH_CODE: set[str] = set()  # packages allowed code in __init__ (none now; an entry must still be needed)


def init_problems(init: Path) -> list[str]:
    """What in the package `__init__` at `init` breaks the convention."""
    tree = ast.parse(init.read_text())
    problems = [] if ast.get_docstring(tree) else ["no docstring"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name not in LAZY_LOADERS:
            problems.append(f"defines {node.name} (line {node.lineno})")
    return problems


def test_package_inits_follow_the_convention() -> None:
    inits = sorted((ROOT / "src" / "asp").rglob("__init__.py"))
    found = {".".join(init.parent.relative_to(ROOT / "src").parts): init_problems(init) for init in inits}
    assert {name: problems for name, problems in found.items() if problems and name not in INIT_WITH_CODE} == {}
    assert [name for name in INIT_WITH_CODE if not found[name]] == []  # an exception that no longer is: drop it


def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys\nsys.argv = ['asp', '--help']\nfrom asp.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_params_load_without_the_scheduler_scipy_or_pandas() -> None:
    """`asp.config` (every `asp` command that reads params, its refusals included) stays light: the scheduler, scipy
    and pandas load where they run (a bad preset's refusal took 2.2 s when they loaded with the params, 0.9 s now);
    numpy it may import."""
    heavy = (*(m for m in HEAVY if m != "numpy"), "scipy", "asp.schedule", "asp.control.history")
    code = f"import sys\nimport asp.config\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def core_writes(source: str) -> list[str]:
    """Assignments in `source` to an attribute of something named ``core`` (``core.x = ...``, ``self.core.x += ...``,
    ``core.by_gu[k] = ...``): a write to the control core's state from outside it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AugAssign | ast.AnnAssign)
            else []
        )
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute):
                owner = target.value
                name = (
                    owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
                )
                if name == "core":
                    found.append(f"line {node.lineno}: {ast.unparse(target)}")
    return found


def test_core_writes_are_found() -> None:
    assert core_writes("core.session = 1\nself.core.by_gu[0] += 2\ncore.tq.put(x)\nx = core.step\n") == [
        "line 1: core.session",
        "line 2: self.core.by_gu",
    ]


def test_nothing_outside_the_control_core_writes_its_state() -> None:
    """The Ray driver and the simulator call the core's methods (`restore_position`, `resume`, `take_segment`, ...);
    none assigns to its attributes."""
    control = ROOT / "src" / "asp" / "control"
    found = {
        str(path.relative_to(ROOT)): writes
        for path in sorted((ROOT / "src" / "asp").rglob("*.py"))
        if control not in path.parents and (writes := core_writes(path.read_text()))
    }
    assert found == {}
