"""`asp init`: write a short params overlay (a preset in configs/) for your model, data and GPUs.

    asp init --model /models/Qwen3-8B --predictor /models/Qwen2.5-1.5B --gpus-per-node 8 --nodes 2
    asp params check --preset my-cluster      # explains the keys init set, refuses a layout or memory misfit

With GPUs the preset extends configs/gpu-cluster.yaml (vLLM, FSDP2, the paper's scheduler sizes) and sets only
the paths and the layout derived from the GPU count: a quarter of the GPUs (at least one) train as FSDP2 ranks,
the rest run one vLLM actor each, grouped in Generation Units of up to 4 actors on a node. Without GPUs it
overlays the CPU demo (params.yaml) with your paths. Each key carries a comment saying where it came from, which
`asp params check --preset NAME` prints. Missing flags are asked for only on a terminal; bad input is one message,
exit 2, and nothing is written (the file is written under a temporary name, then renamed).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from asp.errors import UserError

GPU_BASE = "gpu-cluster"
DEMO_DATASET = "builtin:demo-arith"  # asp.config.DEMO_DATASET (not imported: `asp --help` stays fast)
BUILTIN_PREDICTOR = "builtin:minilm"  # asp.steps.loaders.BUILTIN_MINILM: params.yaml's predictor.backbone
DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
MAX_ACTORS_PER_UNIT = 4  # the GPU preset's Generation Unit size


def init(
    name: Annotated[str, typer.Option(help="preset name: writes configs/NAME.yaml")] = "my-cluster",
    out: Annotated[Path | None, typer.Option(help="write here instead of configs/NAME.yaml")] = None,
    model: Annotated[str | None, typer.Option(help="policy: a local Hugging Face checkpoint directory")] = None,
    data: Annotated[
        str | None, typer.Option(help=f"prompts: a JSON / JSONL / Parquet file, or {DEMO_DATASET}")
    ] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node; 0: the CPU demo")] = None,
    nodes: Annotated[int | None, typer.Option(help="nodes of the Ray cluster (with GPUs)")] = None,
    predictor: Annotated[
        str | None, typer.Option(help=f"predictor backbone: a local model directory, or {BUILTIN_PREDICTOR}")
    ] = None,
    gpu_gib: Annotated[float | None, typer.Option(help="memory of one GPU in GiB (default: the base's, 80)")] = None,
    snapshot_dir: Annotated[
        str | None, typer.Option(help="weight snapshots: a path every node sees (default: the base's)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing file")] = False,
) -> None:
    """Write a params overlay for your model, data and cluster; check it with `asp params check --preset NAME`."""
    ask = sys.stdin.isatty()
    if gpu_gib is not None and not gpu_gib > 0:  # also NaN
        raise UserError(f"--gpu-gib {gpu_gib:g}: a GPU's memory in GiB must be more than 0; nothing was written.")
    gpus = _number(gpus_per_node, "--gpus-per-node", "GPUs per node (0: CPU demo)", 0, ask, minimum=0)
    count = _number(nodes, "--nodes", "nodes", 1, ask and gpus > 0, minimum=1)
    if gpus == 0 and count > 1:
        raise UserError("--nodes needs --gpus-per-node of 1 or more: without GPUs asp runs the demo on one machine.")
    if gpus * count == 1:
        raise UserError(
            "1 GPU is too few: the Training Unit and the vLLM actors each need their own GPU (at least 2 in all). "
            "Use --gpus-per-node 0 for the CPU demo, or give more GPUs."
        )
    need = gpus > 0  # the GPU preset's model paths are placeholders: yours are required
    model = _text(model, "--model", "policy checkpoint directory", None if need else "", ask)
    data = _text(data, "--data", f"prompts file or {DEMO_DATASET}", "", ask)
    predictor = _text(predictor, "--predictor", "predictor backbone directory", None if need else "", ask)
    target = out if out is not None else Path("configs") / f"{_preset_name(name)}.yaml"
    if target.exists() and not force:
        raise UserError(f"{target} exists; nothing was written. Pass --force to replace it, or another --name.")
    keys = _keys(model, data, predictor, gpus, count, gpu_gib, snapshot_dir)
    text = render(keys, GPU_BASE if gpus else None, _summary(gpus, count))
    _validate(text, target)
    _write(target, text)
    check = f"--preset {target.stem}" if target.parent.resolve() == Path("configs").resolve() else f"-p {target}"
    typer.echo(f"wrote {target} ({len(keys)} keys{', extends ' + GPU_BASE if gpus else ''}).")
    typer.echo(f"next: asp params check {check}   (explains each key, checks the layout and memory)")


def _number(value: int | None, flag: str, prompt: str, default: int, ask: bool, minimum: int) -> int:
    if value is None:
        value = typer.prompt(prompt, default=default, type=int) if ask else default
    if value < minimum:
        raise UserError(f"{flag} {value}: must be {minimum} or more; nothing was written.")
    return value


def _text(value: str | None, flag: str, prompt: str, default: str | None, ask: bool) -> str:
    """The flag's value, else asked on a terminal, else the default; `UserError` when required and missing."""
    if value is None and ask:
        value = typer.prompt(prompt, default=default or "", show_default=bool(default)) or None
    if value is None:
        if default is None:
            raise UserError(f"{flag} is required with GPUs (no model is downloaded); nothing was written.")
        return default
    return value


def _preset_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name.endswith((".yaml", ".yml")):
        raise UserError(f"--name {name!r}: a preset name is letters, digits, '.', '_' and '-' (no path, no .yaml).")
    return name


def _local_dir(path: str, flag: str, what: str) -> str:
    """The checkpoint directory, absolute: a preset run is a DVC experiment in a temporary copy of the repository,
    where a relative path would point into the copy (which holds only what git and DVC track)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: no such directory. Give the local {what} (nothing is downloaded).")
    if not (folder / "config.json").is_file():
        raise UserError(f"{flag} {path}: no config.json in it; give a Hugging Face checkpoint directory.")
    return str(folder.resolve())


def _dataset(path: str) -> str:
    if path == DEMO_DATASET:
        return path
    file = Path(path).expanduser()
    if not file.is_file() or file.suffix not in DATA_SUFFIXES:
        raise UserError(
            f"--data {path}: not a {' / '.join(DATA_SUFFIXES)} file here; give your prompts file or {DEMO_DATASET}."
        )
    return str(file) if not file.is_absolute() else str(file.resolve())


def layout(gpus: int, nodes: int) -> dict[str, int]:
    """Training Unit ranks, Generation Units and actors per unit for `gpus` × `nodes` (one GPU each)."""
    total = gpus * nodes
    ranks = max(1, total // 4)
    actors = total - ranks
    per_unit = max(d for d in range(1, min(gpus, MAX_ACTORS_PER_UNIT) + 1) if actors % d == 0)
    return {"world_size": ranks, "generation_units": actors // per_unit, "actors_per_unit": per_unit}


Key = tuple[str, Any, str]  # dotted key, value, where it came from


def _keys(
    model: str, data: str, predictor: str, gpus: int, nodes: int, gib: float | None, snaps: str | None
) -> list[Key]:
    keys: list[Key] = []
    if model:
        keys += [
            ("policy.source", "path", "--model: a local checkpoint, recorded with its content hash"),
            ("policy.path", _local_dir(model, "--model", "policy checkpoint"), "--model"),
        ]
    if data:
        keys.append(("prepare.dataset", _dataset(data), "--data"))
    if predictor:
        what = "predictor backbone"
        backbone = predictor if predictor == BUILTIN_PREDICTOR else _local_dir(predictor, "--predictor", what)
        keys.append(("predictor.backbone", backbone, "--predictor"))
    if not gpus:
        return keys
    lay, total = layout(gpus, nodes), gpus * nodes
    used = lay["world_size"] + lay["generation_units"] * lay["actors_per_unit"]
    keys += [
        ("runtime.memory.architecture", None, "null: sized from --model's config.json"),
        ("runtime.grpo.world_size", lay["world_size"], f"derived: a quarter of the {total} GPUs train (FSDP2 ranks)"),
        ("runtime.ray.generation_units", lay["generation_units"], f"derived: {total - lay['world_size']} vLLM actors"),
        (
            "runtime.ray.actors_per_unit",
            lay["actors_per_unit"],
            f"derived: up to {MAX_ACTORS_PER_UNIT}, within a node",
        ),
        ("simulate.plan.devices", total, f"--gpus-per-node {gpus} x --nodes {nodes}; {used} used"),
        ("simulate.plan.devices_per_node", gpus, "--gpus-per-node"),
    ]
    if gib is not None:
        keys.append(("runtime.memory.device_gib", gib, "--gpu-gib"))
    if snaps is not None:
        keys.append(("runtime.grpo.snapshot_dir", snaps, "--snapshot-dir: a path every node sees"))
    return keys


def render(keys: list[Key], base: str | None, summary: str) -> str:
    """The overlay as YAML, one comment per key saying where its value came from."""
    lines = [f"# {summary} (written by asp init; check: asp params check --preset NAME)"]
    if base:
        lines.append(f"extends: {base}   # everything not set here comes from configs/{base}.yaml")
    tree: dict[str, Any] = {}
    for key, value, why in keys:
        *sections, leaf = key.split(".")
        node = tree
        for part in sections:
            node = node.setdefault(part, {})
        node[leaf] = (value, why)
    return "\n".join(lines + _lines(tree, 0)) + "\n"


def _lines(tree: dict[str, Any], depth: int) -> list[str]:
    import yaml

    out = []
    for key, item in tree.items():
        if isinstance(item, dict):
            out += [f"{'  ' * depth}{key}:", *_lines(item, depth + 1)]
        else:
            scalar = yaml.safe_dump(item[0], default_flow_style=True).strip().removesuffix("...").strip()
            out.append(f"{'  ' * depth}{key}: {scalar}   # {item[1]}")
    return out


def _summary(gpus: int, nodes: int) -> str:
    return f"{nodes} node(s) x {gpus} GPUs" if gpus else "CPU demo with your paths"


def _validate(text: str, target: Path) -> None:
    """The overlay, resolved as `asp params check` resolves it, must validate before anything is written."""
    import yaml

    from asp.config import deep_merge, read_yaml, validate_params
    from asp.orchestration.request import EXTENDS, read_preset

    raw = yaml.safe_load(text) or {}  # no flag and no GPUs: an overlay of comments only, the demo as it is
    base = raw.pop(EXTENDS, None)
    merged = deep_merge(read_yaml("params.yaml"), read_preset(base) if base else {})
    validate_params(deep_merge(merged, raw), f"params.yaml + {target} (nothing was written)")


def _write(target: Path, text: str) -> None:
    from asp.io import atomic_path

    try:
        with atomic_path(target) as tmp:
            tmp.write_text(text)
    except OSError as exc:
        raise UserError(f"{target}: cannot be written ({exc.strerror or exc}); nothing was written.") from None


def explain(path: Path) -> list[str]:
    """`dotted.key: value   # why` for every leaf a preset file sets, from its own lines and comments (what
    `asp params check --preset` prints for a preset `asp init` wrote, or any other)."""
    out: list[str] = []
    stack: list[tuple[int, str]] = []  # the open sections: (indent, key)
    for line in path.read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z_][\w.-]*):(.*)$", line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3).strip()
        stack = [(i, k) for i, k in stack if i < indent]
        if rest and not rest.startswith("#"):
            out.append(".".join([k for _, k in stack] + [key]) + ": " + rest)
        else:
            stack.append((indent, key))
    return out
