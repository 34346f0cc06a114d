"""What a pipeline run was asked to do, checked before anything runs: stages, preset, param overrides.

Pure apart from reading `dvc.yaml`, `params.yaml`, the preset file and (``profile.source: file``) whether git holds
the lengths file. `check_request` validates the chosen stages against `dvc.yaml` and the params with the preset and
overrides applied against the params models, so a typo fails in well under a second with the same message `asp
params check` prints; a bad override's message names where it was typed (`--set` on the command line, `overrides`
in the Prefect UI). `run_label` says what a run runs (commit, preset, stages, overrides); stamped with its start
time (`asp.tracking.stamped`) it is the name of the MLflow parent run and the Prefect flow run, and it makes the
DVC experiment's name. `describe_run` is the parent run's description (MLflow's `mlflow.note.content`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from asp.config import Params, check_stage_keys, deep_merge, read_yaml, validate_params
from asp.errors import UserError
from asp.stage import stage_names
from asp.steps.lengths_file import check_lengths_file
from asp.steps.policy_path import check_policy_path
from asp.tracking import flatten


@dataclass(frozen=True)
class RunRequest:
    """A pipeline run: `stages` in dvc.yaml order (empty: all), a preset in configs/ and dotted-key
    overrides (`{"schedule.k": 3}`, parsed from `--set` or the Prefect run form), both applied on top of
    params.yaml. `force` reruns up-to-date stages. `overrides_from` is where the user typed the overrides, named
    by every message about them: `--set` (the command line) or `overrides` (the Prefect run's parameter, in the UI's
    form)."""

    stages: tuple[str, ...] = ()
    preset: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False
    overrides_from: Literal["--set", "overrides"] = "--set"

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


EXTENDS = "extends"


def read_preset(name: str, root: str | Path = ".", _chain: tuple[str, ...] = ()) -> dict[str, Any]:
    """A preset's mapping with its `extends: BASE` resolved: the base preset (which may extend another) merged
    under the preset's own keys, the `extends` key dropped. `asp init` writes presets that extend gpu-cluster, so
    they hold only what differs. `UserError` for a base that is not a preset name or a cycle."""
    path = preset_path(name, root)
    raw = read_yaml(path)
    base = raw.pop(EXTENDS, None)
    if base is None:
        return raw
    if not isinstance(base, str) or base in (*_chain, name):
        chain = " -> ".join((*_chain, name, str(base)))
        raise UserError(
            f"{path}: '{EXTENDS}: {base}' must name another preset in configs/ and must not lead back ({chain}). "
            "Fix the extends line and run again."
        )
    return deep_merge(read_preset(base, root, (*_chain, name)), raw)


def parse_set_args(items: Iterable[str], origin: str = "--set") -> dict[str, Any]:
    """`["schedule.k=3", "runtime.trainer.kind=grpo"]` -> `{"schedule.k": 3, "runtime.trainer.kind": "grpo"}` (values
    parsed as YAML scalars, as `dvc exp run -S` does). `origin` names where they were typed in a bad item's message:
    `--set` (the command line) or `overrides` (the Prefect run form's text box)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", key.strip()):
            if origin == "--set":
                raise UserError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set schedule.k=3.")
            raise UserError(
                f"{origin}: {item!r} is not SECTION.KEY=VALUE (e.g. schedule.k=3 runtime.trainer.kind=grpo). "
                f"Fix the {origin} and run again."
            )
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def _typed(origin: str, key: Any, value: Any = ...) -> str:
    """An override as the user typed it: `--set schedule.k=3` on the command line, `schedule.k=3` in the
    Prefect UI's `overrides`."""
    text = f"{key}" + ("" if value is ... else f"={_short(value)}")
    return f"--set {text}" if origin == "--set" else text


def typed_overrides(overrides: Mapping[str, Any]) -> str:
    """The overrides as typed in the Prefect UI's text box, bracketed: `[schedule.k=3 runtime.trainer.kind=grpo]`."""
    return "[" + " ".join(_typed("overrides", k, v) for k, v in overrides.items()) + "]"


def _head(origin: str) -> str:
    """A message's first words naming the field: `--set ...` names itself; the UI's keys get `overrides: `."""
    return "" if origin == "--set" else f"{origin}: "


def _noun(origin: str) -> str:
    """What to fix, in a message's last sentence: the `--set` value (command line) or the `overrides` (UI)."""
    return "--set value" if origin == "--set" else "overrides"


def _example(origin: str) -> str:
    return "--set schedule.k=3" if origin == "--set" else "schedule.k=3"


def set_dotted(raw: dict[str, Any], overrides: Mapping[str, Any], origin: str = "--set") -> dict[str, Any]:
    """`raw` with each dotted key set (a copy; missing levels are created, so validation names unknown keys).
    `origin` (`--set` or `overrides`) is where the user typed them; a bad key's message names it."""
    nested: dict[str, Any] = {}
    owner: dict[tuple[str, ...], str] = {}  # which override set each value, for a conflict's message
    for key, value in overrides.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", key):
            raise UserError(
                f"{_head(origin)}{_typed(origin, key)} is not a dotted SECTION.KEY (e.g. {_example(origin)}). "
                f"Fix the {_noun(origin)} and run again."
            )
        node = nested
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                other = owner[tuple(parents[: i + 1])]
                raise UserError(
                    f"{_head(origin)}{_typed(origin, key)} sets a key inside {_typed(origin, other)}, which is a "
                    "value, not a section. Keep one of them and run again."
                )
        if isinstance(node.get(leaf), dict):
            raise UserError(
                f"{_head(origin)}{_typed(origin, key)} replaces a section that another override sets a key in. "
                "Keep one of them and run again."
            )
        node[leaf] = value
        owner[tuple(key.split("."))] = key
    return deep_merge(raw, nested)


def effective_overrides(request: RunRequest, root: str | Path = ".") -> dict[str, Any]:
    """Every param the run changes relative to params.yaml, as dotted keys: the preset's leaves, then the
    overrides (which win). Sorted, so the same request always gives the same `-S` list."""
    merged = flatten(read_preset(request.preset, root)) if request.preset else {}
    merged.update(request.overrides)
    return dict(sorted(merged.items()))


def check_request(request: RunRequest, params_path: str | Path = "params.yaml", root: str | Path = ".") -> Params:
    """Validate the request; returns the params the run will use.

    Raises:
        UserError: an unknown stage, a missing preset, or params (with the preset and overrides applied) that
            do not validate; the message is the one `asp params check` gives. Also a missing lengths file of
            ``profile.source: file``, or one a DVC experiment would not have (`asp.steps.lengths_file`), and a
            ``policy.path`` that is no checkpoint here when the policy stage runs (`asp.steps.policy_path`).
    """
    order = stage_names(Path(root) / "dvc.yaml")
    unknown = [s for s in request.stages if s not in order]
    if unknown:
        raise UserError(f"unknown stage(s) {unknown}; dvc.yaml defines {', '.join(order)}.")
    raw = read_yaml(Path(root) / params_path)
    source = str(params_path)
    if request.preset:
        raw = deep_merge(raw, read_preset(request.preset, root))
        source += f" + configs/{request.preset}.yaml"
    if request.overrides:
        origin = request.overrides_from
        raw = set_dotted(raw, request.overrides, origin)
        if origin == "--set":
            source += " + " + " ".join(_typed(origin, k, v) for k, v in request.overrides.items())
        else:
            source += " + overrides " + typed_overrides(request.overrides)
    params = validate_params(raw, source, overrides=request.overrides, origin=request.overrides_from)
    check_stage_keys(params, order, source)  # orchestration.retries / timeout_s name dvc.yaml's stages
    check_lengths_file(params, root, experiment=request.is_experiment)  # missing, or not in the experiment's copy
    check_policy_path(params, root, runs_policy="policy" in ordered_stages(request, root))
    return params


def ordered_stages(request: RunRequest, root: str | Path = ".") -> list[str]:
    """The request's stages in dvc.yaml order (all of them when none was chosen)."""
    order = stage_names(Path(root) / "dvc.yaml")
    return [s for s in order if not request.stages or s in request.stages]


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True, width=10_000)
    text = text.strip().removesuffix("...").strip()
    return text if len(text) <= 24 else text[:21] + "..."


def run_label(request: RunRequest, commit: str, all_stages: Iterable[str]) -> str:
    """What a run runs: `<commit> <preset> <stages> <overrides>`, e.g. `111b05c demo schedule schedule.k=3` or
    `111b05c* gpu-cluster all` (`*`: uncommitted changes). Runs are named `stamped(label)` (`... @ 05-14 10:32:07`:
    when it started), so two runs of the same thing are told apart too."""
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


DOORS = {"cli": "`asp repro`", "prefect": "a Prefect flow run", "dvc": "plain `dvc repro`"}


def describe_run(
    request: RunRequest,
    label: str,
    runner: str,
    *,
    exp_name: str | None = None,
    prefect_url: str | None = None,
    outcomes: Iterable[tuple[str, str, float]] = (),
) -> str:
    """The description (Markdown) of a pipeline parent run: which door started it, what it runs with which params,
    where its DVC experiment and Prefect flow run are, and, once it ended, what each stage did (`outcomes`:
    (stage, ran / skipped / restored / failed / timeout, seconds))."""
    stages = ", ".join(f"`{s}`" for s in request.stages) or "every stage"
    params = "params.yaml" + (f" + preset `{request.preset}`" if request.preset else "")
    if request.overrides:
        if request.overrides_from == "--set":
            params += " + --set `" + json.dumps(dict(request.overrides), default=str) + "`"
        else:
            params += f" + overrides `{typed_overrides(request.overrides)}`"
    lines = [f"Pipeline run `{label}`, started by {DOORS.get(runner, runner)}: {stages} with {params}."]
    if request.force:
        lines.append("Forced: stages that DVC finds up to date run again.")
    if exp_name:
        lines.append(
            f"A DVC experiment, `{exp_name}`: params.yaml and the workspace stay as they are; "
            f"`dvc exp apply {exp_name}` brings its params and outputs into the workspace."
        )
    if prefect_url:
        lines.append(f"Prefect flow run: {prefect_url}")
    done = [f"- {stage}: {status} ({seconds:.1f} s)" for stage, status, seconds in outcomes]
    if done:
        legend = "Stages (ran: DVC ran it; skipped: up to date; restored: from DVC's run cache):"
        lines.append("\n".join([legend, *done]))
    return "\n\n".join(lines)
