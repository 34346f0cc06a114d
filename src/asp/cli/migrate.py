"""`asp params migrate FILE...`: rewrite a params file or preset written in an earlier shape of the params into the
current one, in place, keeping its comments and key order (a round-trip YAML load, `asp.config.migrate_params`,
then an atomic write). Which keys moved where is `asp.config.moved_keys`; loading a file that still has them is
refused with a message naming the new key and this command.

    asp params migrate                       # params.yaml
    asp params migrate configs/my-cluster.yaml
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from asp.config import migrate_params, moved_keys
from asp.errors import UserError


def migrate_file(path: Path) -> list[tuple[str, str]]:
    """Migrate `path` in place; returns the (old, new) keys moved ([] when it was current and is left untouched).

    Raises:
        UserError: the file is missing or is not a YAML mapping.
    """
    if not path.is_file():
        raise UserError(f"{path}: file not found. Give the params file or preset to migrate.")
    rt = YAML()  # round-trip: comments, order and quoting kept
    rt.width = 4096
    rt.indent(mapping=2, sequence=4, offset=2)
    rt.representer.add_representer(type(None), _null)  # `key: null` stays `null`, not an empty value
    try:
        data = rt.load(path.read_text())
    except YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc}). Fix the syntax and run again.") from None
    if data is None:
        return []
    if not hasattr(data, "items"):
        raise UserError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}.")
    notes = {old: _comment(*_holder(data, old)) for old, _ in moved_keys(data)}  # `q_max: 16  # depth`
    moved = migrate_params(data)
    for old, new in moved:  # each moved key keeps its comment (and the comment lines that followed it)
        if notes.get(old) is None:
            continue
        parent, key = _holder(data, old)
        getattr(getattr(parent, "ca", None), "items", {}).pop(key, None)
        section, target = _holder(data, new)
        section.ca.items[target] = notes[old]
    if moved:
        out = io.StringIO()
        rt.dump(data, out)
        tmp = path.with_name(f".{path.name}.migrate.tmp")
        tmp.write_text(out.getvalue())
        os.replace(tmp, path)
    return moved


def _null(representer, value):  # noqa: ANN001, ANN202 (ruamel's representer protocol)
    return representer.represent_scalar("tag:yaml.org,2002:null", "null")


def _holder(data: Any, dotted: str) -> tuple[Any, str]:
    """The round-trip mapping that holds the last part of `dotted` (None where a parent is missing), and that part."""
    *parents, key = dotted.split(".")
    for part in parents:
        data = data.get(part) if hasattr(data, "get") else None
    return data, key


def _comment(section: object, key: str) -> list[Any] | None:
    """The comment tokens after `key`'s scalar value in a round-trip `section` (its end-of-line comment and any
    comment lines up to the next key), or None."""
    items = getattr(getattr(section, "ca", None), "items", {})
    tokens = items.get(key)
    return tokens if tokens and len(tokens) > 2 and tokens[2] is not None else None
