"""Every default once: no default in `src/asp` repeats or competes with the one `asp.config` declares.

`asp.config` is the one place a parameter's default lives. The pure core either has no default for a value the
config owns (callers pass the params' value) or shares one named constant with the config (the config takes its
default from the core's constant, e.g. ``asp.sim.memory.DEVICE_GIB``, or a module above the core uses the
config's own, e.g. ``asp.config.MAX_NEW_TOKENS``). A second literal of the same setting, equal or not, means a
reader cannot tell which one a run uses, and the two drift apart on the next change.

The scan (`scan`) and its matching rule:

* **What is a default.** (a) a function or method parameter's default, positional or keyword-only; (b) a
  class-body field with a value, ``name: T = value`` (dataclass, pydantic and NamedTuple fields; the value of
  ``field(default=...)`` / ``Field(...)`` is taken); (c) an entry ``"name": value`` of a module-level dict literal
  whose variable name ends in ``DEFAULTS``. `asp/config.py` itself and `asp/runtime/config.py` (a subclass of the
  runtime params) are not scanned.
* **Which values count.** Literals after resolving module constants: a bare literal, a module-level name bound to
  one (also ``from asp.x import NAME`` from another scanned module), ``DICT["key"]`` of such a dict, and
  ``int(...)`` / ``float(...)`` / ``str(...)`` around one. ``None`` does not count (it means "not given: the
  caller's or a derived value"), nor does anything not resolvable to a literal.
* **Which config fields a default is compared with.** Each module serves some `params.yaml` sections, its home
  (`HOMES`, by path prefix, longest first; `common` is everyone's). A default is compared with the config
  fields of the same name in its home sections (a section includes its subsections) whose default is of the
  same kind (bool, number, string, list, dict). So `patience=3` in `asp/predictor/` is compared with
  `predictor.patience`, not with `drift.patience`, and `temperature=1.0` of the balancer in `asp/schedule/` with
  nothing (the schedule section has no temperature).
* **When it is flagged.** Whenever there is at least one such field, whether the value equals the field's or
  not, unless the default is written as the very constant the field's default is written as in `asp.config`
  (`CONSTANTS`: the name's origin, following ``from ... import`` re-exports, e.g. a default written
  ``MICRO_BATCH_TOKENS`` imported from ``asp.sim.memory`` when the config's field is ``Field(MICRO_BATCH_TOKENS)``
  from the same module). There are no exceptions: a name that collides with a field of the home but means
  something else is renamed to say what it means.

`test_scan_catches_a_planted_copy` shows the rule on small snippets, both ways.
Run: ``.venv/bin/python -m pytest tests/test_defaults.py -q``.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from asp.config import Params

SRC = Path(__file__).resolve().parents[1] / "src"
NOT_SCANNED = ("asp/config.py", "asp/runtime/config.py")

# path prefix (relative to src/) -> the params sections its module serves; `common` is added to every home.
# Packages not listed (cli, pipeline, steps, adaptation, orchestration, ...) serve every section.
EVERY_SECTION = tuple(Params.model_fields)
SIDE = ()  # side packages: no stage settings of their own
HOMES: dict[str, tuple[str, ...]] = {
    "asp/schedule/": ("schedule",),
    "asp/drift/": ("drift", "schedule"),  # rebalance re-runs the schedule's balancing
    "asp/predictor/": ("predictor", "predict"),
    "asp/demo/": ("policy", "prepare"),
    "asp/rl/": ("runtime.grpo",),
    "asp/trainers/": ("runtime",),
    "asp/runtime/": ("runtime",),
    "asp/control/": ("runtime",),
    "asp/rollout/": ("profile", "runtime.engine", "runtime.sampling"),
    "asp/sim/": ("simulate", "runtime", "schedule"),
    "asp/sim/planner.py": ("simulate.plan", "runtime", "schedule"),
    "asp/sim/memory.py": ("runtime.grpo", "runtime.memory", "runtime.engine.vllm", "profile.engine.vllm"),
    "asp/tracking": SIDE,
    "asp/io/": SIDE,
    "asp/plots/": SIDE,
    "asp/progress.py": SIDE,
    "asp/env.py": SIDE,
    "asp/vcs.py": SIDE,
    "asp/errors.py": SIDE,
    "asp/stage.py": SIDE,
}

UNRESOLVED = object()


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    where: str  # function or class name, or the DEFAULTS dict's name
    name: str
    value: Any
    fields: tuple[tuple[str, Any], ...]  # the home's same-named config fields and their defaults

    def __str__(self) -> str:
        theirs = ", ".join(f"{key} = {value!r}" for key, value in self.fields)
        return f"{self.path}:{self.line} {self.where}: {self.name} = {self.value!r}, but the config says {theirs}"


def config_fields(model: type[BaseModel] = Params, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, default) of every leaf field of the params tree."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from config_fields(ann, f"{prefix}{name}.")
        elif not field.is_required():
            yield f"{prefix}{name}", field.get_default(call_default_factory=True)


FIELDS = dict(config_fields())
CONFIG_MODULES = tuple(path.removesuffix(".py").replace("/", ".") for path in NOT_SCANNED)


def module_name(path: str) -> str:
    """`asp/x/y.py` (relative to src/) -> `asp.x.y`; a package's `__init__.py` is the package."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@functools.cache
def _module_tree(module: str) -> ast.Module | None:
    base = SRC / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return ast.parse(candidate.read_text())
    return None


def bindings(tree: ast.Module, module: str) -> dict[str, str]:
    """Module-level name -> the dotted name it is bound to as written: `module.NAME` for the module's own
    assignments, `m.X` for ``from m import X [as NAME]`` (relative imports resolved), `m` for ``import m as NAME``."""
    out: dict[str, str] = {}
    package = module if _is_package(module) else module.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(name, ast.Name):
                        out[name.id] = f"{module}.{name.id}"
    return out


def _is_package(module: str) -> bool:
    return (SRC / module.replace(".", "/") / "__init__.py").is_file()


def origin(dotted: str | None) -> str | None:
    """Where `dotted` (`module.NAME`) is defined, following ``from ... import`` re-exports between asp's modules."""
    for _ in range(10):
        if dotted is None or "." not in dotted:
            return dotted
        module, name = dotted.rsplit(".", 1)
        tree = _module_tree(module)
        bound = bindings(tree, module).get(name) if tree is not None else None
        if bound is None or bound == dotted:
            return dotted
        dotted = bound
    return dotted


def written(node: ast.expr, names: dict[str, str]) -> str | None:
    """The origin of the constant a default is written as (a name or `module.NAME`), or None for anything else."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("field", "Field"):
        inner = next((kw.value for kw in node.keywords if kw.arg == "default"), node.args[0] if node.args else None)
        return None if inner is None else written(inner, names)
    if isinstance(node, ast.Name):
        return origin(names.get(node.id))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
        return origin(f"{names[node.value.id]}.{node.attr}")
    return None


def config_constants(model: type[BaseModel] = Params, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, origin of the named constant its default is written as in the config) of every leaf field whose
    default is a named constant rather than a literal."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from config_constants(ann, f"{prefix}{name}.")
            continue
        for owner in model.__mro__:
            tree = _module_tree(owner.__module__)
            cls = (
                next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner.__name__), None)
                if tree is not None
                else None
            )
            stmt = next(
                (
                    s
                    for s in (cls.body if cls else [])
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == name
                ),
                None,
            )
            if stmt is not None:
                if stmt.value is not None and tree is not None:
                    constant = written(stmt.value, bindings(tree, owner.__module__))
                    if constant is not None:
                        yield f"{prefix}{name}", constant
                break


CONSTANTS = dict(config_constants())


def home_of(path: str) -> tuple[str, ...]:
    """The params sections the module at `path` (relative to src/) serves, plus common."""
    for prefix in sorted(HOMES, key=len, reverse=True):
        if path.startswith(prefix):
            return (*HOMES[prefix], "common")
    return EVERY_SECTION


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    for kind, types in (("str", str), ("list", list | tuple), ("dict", dict)):
        if isinstance(value, types):
            return kind
    return None


def _same(a: Any, b: Any) -> bool:
    if _kind(a) == "number" and _kind(b) == "number":
        return a == b or (math.isnan(a) and math.isnan(b))
    if _kind(a) == "list" and _kind(b) == "list":
        return list(a) == list(b)
    return a == b


def module_constants(tree: ast.Module, imported: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Module-level names bound to literals (and names imported from other scanned modules' constants)."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and imported and node.module in imported:
            for alias in node.names:
                if alias.name in imported[node.module]:
                    out[alias.asname or alias.name] = imported[node.module][alias.name]
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if value is None:
            continue
        resolved = resolve(value, out)
        for target in targets:
            if isinstance(target, ast.Name) and resolved is not UNRESOLVED:
                out[target.id] = resolved
    return out


def resolve(node: ast.expr, constants: dict[str, Any]) -> Any:
    """The literal value of `node`, or UNRESOLVED."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name):
        return constants.get(node.id, UNRESOLVED)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        table, key = constants.get(node.value.id), resolve(node.slice, constants)
        return table.get(key, UNRESOLVED) if isinstance(table, dict) and key is not UNRESOLVED else UNRESOLVED
    if isinstance(node, ast.Call):
        func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if func in ("int", "float", "str") and len(node.args) == 1 and not node.keywords:
            inner = resolve(node.args[0], constants)
            try:
                return UNRESOLVED if inner is UNRESOLVED else {"int": int, "float": float, "str": str}[func](inner)
            except (TypeError, ValueError):
                return UNRESOLVED
        if func in ("field", "Field"):
            for kw in node.keywords:
                if kw.arg == "default":
                    return resolve(kw.value, constants)
            return resolve(node.args[0], constants) if node.args else UNRESOLVED
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = resolve(node.operand, constants)
        return -inner if _kind(inner) == "number" else UNRESOLVED
    return UNRESOLVED


def defaults_in(tree: ast.Module) -> Iterator[tuple[str, str, ast.expr, int]]:
    """(where, name, default expression, line) of every default the rule covers."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True):
                yield node.name, arg.arg, default, default.lineno
            for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if default is not None:
                    yield node.name, arg.arg, default, default.lineno
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    yield node.name, stmt.target.id, stmt.value, stmt.lineno
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else getattr(node, "target", None)
        )
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id.endswith("DEFAULTS") and isinstance(value, ast.Dict):
            for key, item in zip(value.keys, value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield target.id, key.value, item, item.lineno


def scan(source: str, path: str, imported: dict[str, dict[str, Any]] | None = None) -> list[Finding]:
    """Defaults in `source` (the module at `path`, relative to src/) that repeat a config field's (the rule above)."""
    tree = ast.parse(source)
    constants = module_constants(tree, imported)
    names = bindings(tree, module_name(path))
    home = home_of(path)
    found = []
    for where, name, node, line in defaults_in(tree):
        value = resolve(node, constants)
        if value is UNRESOLVED or value is None:
            continue
        theirs = tuple(
            (key, default)
            for key, default in FIELDS.items()
            if key.rsplit(".", 1)[-1] == name
            and any(key.startswith(f"{section}.") for section in home)
            and _kind(default) == _kind(value)
        )
        if theirs and written(node, names) not in {CONSTANTS.get(key) for key, _ in theirs} - {None}:
            found.append(Finding(path, line, where, name, value, theirs))
    return found


def _modules() -> dict[str, str]:
    return {
        str(p.relative_to(SRC)): p.read_text()
        for p in sorted((SRC / "asp").rglob("*.py"))
        if str(p.relative_to(SRC)) not in NOT_SCANNED
    }


def test_no_default_repeats_the_config() -> None:
    modules = _modules()
    imported = {module_name(path): module_constants(ast.parse(text)) for path, text in modules.items()}
    for path in NOT_SCANNED:  # the config's own constants resolve too (asp.config.MAX_NEW_TOKENS)
        imported[module_name(path)] = module_constants(ast.parse((SRC / path).read_text()))
    found = [f for path, text in modules.items() for f in scan(text, path, imported)]
    assert not found, (
        "defaults of a setting asp.config declares (drop the default and pass the params' value, or write the "
        "config's named constant):\n" + "\n".join(map(str, found))
    )


def test_every_home_names_a_section_and_the_config_constants_resolve() -> None:
    """A section in HOMES that does not exist is a stale rule; a config constant must name a real binding."""
    sections = {key.rsplit(".", i)[0] for key in FIELDS for i in range(1, key.count(".") + 1)}
    assert {s for home in HOMES.values() for s in home} <= sections
    # the shared constants the config's defaults are written as (asp.sim.memory's, the config's own)
    assert CONSTANTS["runtime.memory.device_gib"] == "asp.sim.memory.DEVICE_GIB"
    assert CONSTANTS["runtime.sampling.max_new_tokens"] == "asp.config.MAX_NEW_TOKENS"
    for key, constant in CONSTANTS.items():
        module, name = constant.rsplit(".", 1)
        tree = _module_tree(module)
        assert tree is not None and bindings(tree, module).get(name) == constant, (key, constant)


@pytest.mark.parametrize(
    ("path", "source", "flagged"),
    [
        # a core function keeping its own value for a config-owned setting: caught
        ("asp/schedule/x.py", "def build(ids, *, b=32): ...", ["b = 32"]),
        # an equal literal copy of the config's default: caught as well (schedule.b is 16)
        ("asp/schedule/x.py", "def build(ids, *, b=16, kappa=2): ...", ["b = 16", "kappa = 2"]),
        # a dataclass field, and a pydantic Field
        ("asp/sim/planner.py", "@dataclass\nclass C:\n    tu_serial_fraction: float = 0.0\n", ["tu_serial_fraction"]),
        ("asp/predictor/x.py", "class M(BaseModel):\n    epochs: int = Field(8, ge=1)\n", ["epochs = 8"]),
        # through a module constant, an imported constant, int(DICT[...]), and a DEFAULTS dict
        ("asp/predictor/x.py", "EPOCHS = 8\ndef train(*, epochs=EPOCHS): ...", ["epochs = 8"]),
        ("asp/rollout/x.py", "from asp.sim.memory import G\ndef f(gpu_memory_utilization=G): ...", ["= 0.9"]),
        ("asp/drift/x.py", "D = {'patience': 5}\ndef f(patience=int(D['patience'])): ...", ["patience = 5"]),
        ("asp/drift/detector.py", "DEFAULTS = {'tau_drop': 0.2, 'cooldown': 10}\n", ["tau_drop = 0.2", "cooldown"]),
        # compared with the home's field only: predictor.patience, not drift.patience
        ("asp/predictor/x.py", "def train(*, patience=3): ...", ["patience = 3"]),
        # an equal copy under a constant of its own (same value, but not the constant the config uses): caught
        ("asp/sim/x.py", "DEVICE_GIB = 80.0\n@dataclass\nclass S:\n    device_gib: float = DEVICE_GIB\n", ["= 80.0"]),
        # not flagged: the very constant the config's field is written as, imported, re-exported or as an attribute
        (
            "asp/sim/x.py",
            "from asp.sim.memory import DEVICE_GIB\n@dataclass\nclass S:\n    device_gib: float = DEVICE_GIB\n",
            [],
        ),
        ("asp/sim/memory.py", "DEVICE_GIB = 80.0\n@dataclass\nclass S:\n    device_gib: float = DEVICE_GIB\n", []),
        ("asp/steps/x.py", "from asp import config\ndef f(*, max_new_tokens=config.MAX_NEW_TOKENS): ...", []),
        ("asp/steps/x.py", "from asp.config import MAX_NEW_TOKENS as M\ndef f(*, max_new_tokens=M): ...", []),
        # not flagged: None; a name the home does not own; another kind; no default at all
        ("asp/schedule/x.py", "def build(*, b=None, k=None): ...", []),
        ("asp/schedule/x.py", "def balance(*, temperature=2.0, patience=9): ...", []),
        ("asp/orchestration/x.py", "def wait(timeout_s=2.0): ...", []),
        ("asp/schedule/x.py", "def build(*, b, kappa, k, iterations): ...", []),
        # a name of the home's section meaning something else is renamed, not excused
        ("asp/demo/task.py", "def simulated_profile(n, seed=0, samples=8): ...", ["seed = 0", "samples = 8"]),
        ("asp/demo/task.py", "def simulated_profile(n, seed, responses_per_prompt=8): ...", []),
    ],
)
def test_scan_catches_a_planted_copy(path: str, source: str, flagged: list[str]) -> None:
    found = [str(f) for f in scan(source, path, imported={"asp.sim.memory": {"G": 0.9, "DEVICE_GIB": 80.0}})]
    assert len(found) == len(flagged), found
    for text, expected in zip(found, flagged, strict=True):
        assert expected in text and path in text, text
