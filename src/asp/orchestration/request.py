"""What a pipeline run was asked to do, checked before anything runs: stages, preset, param overrides.

Pure apart from reading `dvc.yaml`, `params.yaml` and the preset file. `check_request` validates the chosen
stages against `dvc.yaml` and the params with the preset and overrides applied against the params models, so
a typo fails in well under a second with the same message `asp params check` prints. `run_label` is the
name every door gives the run (MLflow parent run, Prefect flow run, DVC experiment).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asp.config import Params, deep_merge, read_yaml, validate_params
from asp.errors import UserError
from asp.stage import stage_names
from asp.tracking import flatten


@dataclass(frozen=True)
class RunRequest:
    """A pipeline run: `stages` in dvc.yaml order (empty: all), a preset in configs/ and dotted-key
    overrides (`{"schedule.k": 3}`), both applied on top of params.yaml. `force` reruns up-to-date stages."""

    stages: tuple[str, ...] = ()
    preset: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False

    @property
    def is_experiment(self) -> bool:
        """Whether params differ from params.yaml (a preset or overrides): such a run is a DVC experiment."""
        return bool(self.preset or self.overrides)


PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def preset_path(name: str, root: str | Path = ".") -> Path:
    """`configs/NAME.yaml` for a preset name, or `UserError` listing the presets. A preset is a name in configs/,
    never a path (`../params`, `/abs/x`, `configs/x.yaml`): a params file elsewhere is passed with `-p`."""
    configs = Path(root) / "configs"
    known = sorted(p.stem for p in configs.glob("*.yaml"))
    listed = f"Presets: {', '.join(known) or 'none'}"
    if not PRESET_NAME.fullmatch(name) or name.endswith((".yaml", ".yml")) or ".." in name:
        stem = Path(name).name.removesuffix(".yaml").removesuffix(".yml")
        hint = f" (did you mean '{stem}'?)" if stem in known else ""
        raise UserError(
            f"preset {name!r} is not a preset name{hint}: a preset is the name of a file in {configs}/ without "
            f".yaml. {listed}. To use another params file, pass it with -p/--params."
        )
    path = configs / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"no preset '{name}' ({path} not found). {listed}.")
    return path


def parse_set_args(items: Iterable[str]) -> dict[str, Any]:
    """`["schedule.k=3", "runtime.trainer=grpo"]` -> `{"schedule.k": 3, "runtime.trainer": "grpo"}` (values
    parsed as YAML scalars, as `dvc exp run -S` does)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", key.strip()):
            raise UserError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set schedule.k=3.")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def set_dotted(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with each dotted key set (a copy; missing levels are created, so validation names unknown keys)."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or "." not in key:
            raise UserError(f"override key {key!r}: expected SECTION.KEY, e.g. schedule.k.")
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override key {key!r} conflicts with another override of {part!r}.")
        node[leaf] = value
    return deep_merge(raw, nested)


def effective_overrides(request: RunRequest, root: str | Path = ".") -> dict[str, Any]:
    """Every param the run changes relative to params.yaml, as dotted keys: the preset's leaves, then the
    overrides (which win). Sorted, so the same request always gives the same `-S` list."""
    merged = flatten(read_yaml(preset_path(request.preset, root))) if request.preset else {}
    merged.update(request.overrides)
    return dict(sorted(merged.items()))


def check_request(request: RunRequest, params_path: str | Path = "params.yaml", root: str | Path = ".") -> Params:
    """Validate the request; returns the params the run will use.

    Raises:
        UserError: an unknown stage, a missing preset, or params (with the preset and overrides applied) that
            do not validate; the message is the one `asp params check` gives.
    """
    order = stage_names(Path(root) / "dvc.yaml")
    unknown = [s for s in request.stages if s not in order]
    if unknown:
        raise UserError(f"unknown stage(s) {unknown}; dvc.yaml defines {', '.join(order)}.")
    raw = read_yaml(Path(root) / params_path)
    source = str(params_path)
    if request.preset:
        raw = deep_merge(raw, read_yaml(preset_path(request.preset, root)))
        source += f" + configs/{request.preset}.yaml"
    if request.overrides:
        raw = set_dotted(raw, request.overrides)
        source += " + overrides " + ", ".join(f"{k}={v}" for k, v in request.overrides.items())
    return validate_params(raw, source, overrides=request.overrides)


def ordered_stages(request: RunRequest, root: str | Path = ".") -> list[str]:
    """The request's stages in dvc.yaml order (all of them when none was chosen)."""
    order = stage_names(Path(root) / "dvc.yaml")
    return [s for s in order if not request.stages or s in request.stages]


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True, width=10_000)
    text = text.strip().removesuffix("...").strip()
    return text if len(text) <= 24 else text[:21] + "..."


def run_label(request: RunRequest, commit: str, all_stages: Iterable[str]) -> str:
    """A name that tells runs apart: `<commit> <preset> <stages> <overrides>`, e.g.
    `111b05c demo schedule schedule.k=3` or `111b05c* gpu-cluster all` (`*`: uncommitted changes)."""
    stages = "all" if not request.stages or set(request.stages) >= set(all_stages) else "+".join(request.stages)
    parts = [commit or "nogit", request.preset or "demo", stages]
    parts += [f"{k}={_short(v)}" for k, v in request.overrides.items()]
    if request.force:
        parts.append("force")
    return " ".join(parts)


def experiment_name(label: str, suffix: str) -> str:
    """A DVC experiment name (a valid git ref component) made of the run label and a unique suffix."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label.replace("*", "-dirty")).strip("-.")
    slug = re.sub(r"\.{2,}", ".", slug)[:80].rstrip("-.")
    return f"{slug}-{suffix}".lower()
