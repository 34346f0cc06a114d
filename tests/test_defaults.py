"""Every default once: no default in `src/asp` competes with the one `asp.config` declares for the same setting.

`asp.config` is the one place a parameter's default lives. The pure core either has no default for a value the
config owns (callers pass the params' value) or the config takes its default from a named core constant; a core
default that shares a config field's name but holds another value means a reader cannot tell which one a run uses.

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
  same kind (bool, number, string, list, dict). It is flagged when there is at least one such field and the
  default equals none of them. So `patience=3` in `asp/predictor/` is compared with `predictor.patience` (1),
  not with `drift.patience` (3), and `temperature=1.0` of the balancer in `asp/schedule/` with nothing (the
  schedule section has no temperature).
* **Allowed.** `ALLOWED` lists the few names that collide with a field of the home but mean something else,
  each with the reason. `KNOWN` lists the same setting with another default that is left as it is, with the
  reason; a test keeps that list from growing.

`test_scan_catches_a_planted_difference` shows the rule on small snippets, both ways.
Run: ``.venv/bin/python -m pytest tests/test_defaults.py -q``.
"""

from __future__ import annotations

import ast
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

# (path, function or class, name) -> why the name collides with a config field of the home but is another setting
ALLOWED: dict[tuple[str, str, str], str] = {
    ("asp/demo/task.py", "simulated_profile", "samples"): "responses per prompt of a synthetic profile (the "
    "profile stage's n_samples, 8), not policy.eval.samples (the policy stage's evaluation)",
    ("asp/orchestration/drift_loop.py", "ReprofileOutcome", "min_tau"): "an outcome record: the gate a re-profiling "
    "applied (NaN when none ran), not the evaluate stage's setting",
    ("asp/orchestration/drift_loop.py", "ReprofileOutcome", "prompts"): "an outcome record: prompts a "
    "re-profiling used (0 when none ran), not policy.eval.prompts",
    ("asp/cli/heldout.py", "heldout_reward", "samples"): "responses per held-out problem of `asp heldout` (the "
    "launch's held-out reward), not policy.eval.samples (the policy stage's evaluation)",
}

# (path, function or class, name) -> why this default of the same setting stays (the list may only shrink)
KNOWN: dict[tuple[str, str, str], str] = {
    ("asp/rollout/hf.py", "__init__", "dtype"): "the engine library's default, 'auto' (the checkpoint's own dtype, "
    "right for a library user on any device); profile.engine.dtype / runtime.engine.dtype default to the CPU demo's "
    "float32 and the pipeline always passes them (asp.steps.engine). Removing it touches ~22 engine call sites.",
    ("asp/rollout/vllm.py", "VLLMOptions", "dtype"): "as HFEngine's: vLLM's own 'auto'; the params' float32 is the "
    "CPU demo's hf engine value (the GPU preset sets the vLLM dtype).",
}
KNOWN_SIZE = 2

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
    """Defaults in `source` (the module at `path`, relative to src/) that differ from the config's (the rule above)."""
    tree = ast.parse(source)
    constants = module_constants(tree, imported)
    home = home_of(path)
    found = []
    for where, name, node, line in defaults_in(tree):
        if (path, where, name) in ALLOWED or (path, where, name) in KNOWN:
            continue
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
        if theirs and not any(_same(value, default) for _, default in theirs):
            found.append(Finding(path, line, where, name, value, theirs))
    return found


def _modules() -> dict[str, str]:
    return {
        str(p.relative_to(SRC)): p.read_text()
        for p in sorted((SRC / "asp").rglob("*.py"))
        if str(p.relative_to(SRC)) not in NOT_SCANNED
    }


def test_no_core_default_differs_from_the_config() -> None:
    modules = _modules()
    imported = {
        path.removesuffix(".py").removesuffix("/__init__").replace("/", "."): module_constants(ast.parse(text))
        for path, text in modules.items()
    }
    found = [f for path, text in modules.items() for f in scan(text, path, imported)]
    assert not found, "defaults that differ from asp.config's (one literal per value):\n" + "\n".join(map(str, found))


def test_every_home_and_allowed_entry_names_something_real() -> None:
    """A section in HOMES that does not exist, or an ALLOWED entry whose default is gone, is a stale rule."""
    sections = {key.rsplit(".", i)[0] for key in FIELDS for i in range(1, key.count(".") + 1)}
    assert {s for home in HOMES.values() for s in home} <= sections
    modules = _modules()
    assert len(KNOWN) <= KNOWN_SIZE, "KNOWN may only shrink: resolve a new difference instead of listing it"
    for path, where, name in (*ALLOWED, *KNOWN):
        assert path in modules, path
        seen = [(w, n) for w, n, _, _ in defaults_in(ast.parse(modules[path]))]
        assert (where, name) in seen, f"ALLOWED entry {(path, where, name)} names no default any more"


@pytest.mark.parametrize(
    ("path", "source", "flagged"),
    [
        # a core function keeping its own value for a config-owned setting: caught
        ("asp/schedule/x.py", "def build(ids, *, b=32, kappa=2): ...", ["b = 32"]),
        # a dataclass field, and a pydantic Field
        ("asp/sim/planner.py", "@dataclass\nclass C:\n    tu_serial_fraction: float = 0.0\n", ["tu_serial_fraction"]),
        ("asp/predictor/x.py", "class M(BaseModel):\n    epochs: int = Field(8, ge=1)\n", ["epochs = 8"]),
        # through a module constant, an imported constant, int(DICT[...]), and a DEFAULTS dict
        ("asp/predictor/x.py", "EPOCHS = 8\ndef train(*, epochs=EPOCHS): ...", ["epochs = 8"]),
        ("asp/rollout/x.py", "from asp.sim.memory import G\ndef f(gpu_memory_utilization=G): ...", ["= 0.9"]),
        ("asp/drift/x.py", "D = {'patience': 5}\ndef f(patience=int(D['patience'])): ...", ["patience = 5"]),
        ("asp/drift/detector.py", "DEFAULTS = {'tau_drop': 0.2, 'cooldown': 10}\n", ["tau_drop = 0.2"]),
        # compared with the home's field only: predictor.patience is 1 (drift.patience 3 is another setting)
        ("asp/predictor/x.py", "def train(*, patience=3): ...", ["patience = 3"]),
        # not flagged: the config's value; None; a name the home does not own; another kind; no default at all
        ("asp/schedule/x.py", "def build(*, b=16, kappa=2, k=4, iterations=200_000): ...", []),
        ("asp/schedule/x.py", "def build(*, b=None, k=None): ...", []),
        ("asp/schedule/x.py", "def balance(*, temperature=2.0, patience=9): ...", []),
        ("asp/orchestration/x.py", "def wait(timeout_s=2.0): ...", []),
        ("asp/schedule/x.py", "def build(*, b, kappa, k, iterations): ...", []),
        # an allowed collision (another setting with the same name)
        ("asp/demo/task.py", "def simulated_profile(n, seed=0, samples=8): ...", []),
    ],
)
def test_scan_catches_a_planted_difference(path: str, source: str, flagged: list[str]) -> None:
    found = [str(f) for f in scan(source, path, imported={"asp.sim.memory": {"G": 0.9}})]
    assert len(found) == len(flagged), found
    for text, expected in zip(found, flagged, strict=True):
        assert expected in text and path in text, text
