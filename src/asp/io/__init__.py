"""File I/O shared by the stages: atomic writers (Parquet, JSON, whole directories) and JSON readers.

    from asp.io import atomic_path, read_json, write_json
    write_json({"tau": 0.62}, "metrics/predictor.json")    # temporary sibling, then rename; NaN -> null
    with atomic_path("outputs/predictor") as tmp:          # a directory (or file) appears whole or not at all
        model.save_pretrained(tmp)

* `files`: `atomic_path` / `atomic_paths`, `write_parquet`, `write_json` / `json_text` / `json_safe`, `read_json`,
  `read_json_lines` (append-only JSON-lines files whose last line a kill may have cut short), `read_user_json` /
  `read_user_jsonl` (a user's dataset or rollouts file: bad JSON is one `UserError` naming the line);
* `schedule`: reading length / prediction / calibration files for the scheduler CLI and stage.

Imports pandas (`write_parquet`). Tests: tests/test_io.py.
"""

from asp.io.files import (
    atomic_path,
    atomic_paths,
    json_safe,
    json_text,
    read_json,
    read_json_lines,
    read_user_json,
    read_user_jsonl,
    read_utf8_text,
    write_json,
    write_parquet,
)

__all__ = [
    "atomic_path",
    "atomic_paths",
    "json_safe",
    "json_text",
    "read_json",
    "read_json_lines",
    "read_user_json",
    "read_user_jsonl",
    "read_utf8_text",
    "write_json",
    "write_parquet",
]
