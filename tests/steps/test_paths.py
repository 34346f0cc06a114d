"""dvc.yaml and the stage-paths table (`asp.steps.paths`) say the same thing, and dvc.yaml's code deps name the shared
steps each stage runs.

* data: every input the table gives a stage lies in one of its dvc.yaml deps, every data dep of dvc.yaml holds an
  input of the table, and the table's outputs are exactly the stage's outs, metrics and plots;
* code: every stage depends on its entry script and stage module, every listed path exists, and every module of
  `asp.steps` / `asp.adaptation` the stage module imports (directly or through other such modules, imports inside
  functions included) is listed, except `NOT_CODE_DEPS`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from asp.steps.paths import STAGE_PATHS, declared, dep_files

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
CODE = ("src/", "stages/")
SHARED = ("asp.steps", "asp.adaptation")
NOT_CODE_DEPS = {
    "asp.steps.paths": "the table itself: dvc.yaml lists the same paths, and this test keeps the two equal",
    "asp.steps.memory_check": "refuses a run that cannot fit its devices before it starts; changes no output",
}
EXTRA_DATA_DEPS = {  # inputs a param names, not a path field
    "prepare": {"data"},  # the dataset file prepare.dataset names
    "profile": {"${profile.lengths.path}"},  # profile.source: file reads it (dvc.yaml templating from params.yaml)
}


def _entries(stage: dict, key: str) -> set[str]:
    """A dvc.yaml list (deps, outs, metrics, plots) as paths: entries are strings or one-key mappings."""
    return {e if isinstance(e, str) else next(iter(e)) for e in stage.get(key, [])}


def _within(path: Path, root: str) -> bool:
    return path == Path(root) or Path(root) in path.parents


def test_every_dvc_stage_has_a_paths_class_and_back() -> None:
    assert list(STAGE_PATHS) == list(DVC)


@pytest.mark.parametrize("name", list(STAGE_PATHS))
def test_inputs_and_outputs_agree_with_dvc_yaml(name: str) -> None:
    stage, table = DVC[name], STAGE_PATHS[name]
    data_deps = {d for d in _entries(stage, "deps") if not d.startswith(CODE)}
    inputs = dep_files(table)
    undeclared = [str(p) for p in inputs if not any(_within(p, d) for d in data_deps)]
    assert not undeclared, f"{name}: reads {undeclared}, not in dvc.yaml deps"
    unread = {d for d in data_deps if not any(_within(p, d) for p in inputs)} - EXTRA_DATA_DEPS.get(name, set())
    assert not unread, f"{name}: dvc.yaml deps {sorted(unread)} are no input of the table"
    outs = _entries(stage, "outs") | _entries(stage, "metrics") | _entries(stage, "plots")
    assert {str(p) for p in declared(table, "out").values()} == outs
    assert not {str(p) for p in declared(table, "untracked").values()} & outs


def _module_file(module: str) -> Path:
    base = SRC / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _imports(module: str) -> set[str]:
    """The `asp.steps` / `asp.adaptation` modules `module` imports anywhere in its file (packages and submodules)."""
    found = set()
    for node in ast.walk(ast.parse(_module_file(module).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith(SHARED) and _module_file(n).is_file()}
    return found


def shared_modules(stage: str) -> set[str]:
    """Every `asp.steps` / `asp.adaptation` module the stage module reaches through such modules."""
    seen: set[str] = set()
    todo = _imports(f"asp.pipeline.{stage}")
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo |= _imports(module)
    return seen


@pytest.mark.parametrize("name", list(STAGE_PATHS))
def test_code_deps_name_the_stage_and_the_shared_steps_it_runs(name: str) -> None:
    code_deps = {d for d in _entries(DVC[name], "deps") if d.startswith(CODE)}
    assert {f"stages/{name}.py", f"src/asp/pipeline/{name}.py"} <= code_deps
    assert not [d for d in code_deps if not (ROOT / d).exists()], "dvc.yaml names a path that does not exist"
    used = {_module_file(m).relative_to(ROOT) for m in shared_modules(name) if m not in NOT_CODE_DEPS}
    missing = sorted(str(f) for f in used if not any(_within(f, d) for d in code_deps))
    assert not missing, f"{name}: dvc.yaml deps lack {missing}"


def test_the_shared_steps_closure_is_what_launch_runs() -> None:
    """The import walk sees imports inside functions and through `asp.adaptation` (a check of the check)."""
    used = shared_modules("launch")
    assert {"asp.steps.memory_check", "asp.adaptation.reprofile", "asp.steps.fit", "asp.steps.engine"} <= used
    assert "asp.steps.layout_check" not in used
