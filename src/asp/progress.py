"""Progress bars for long loops (tqdm; quiet when ASP_PROGRESS=0, e.g. in tests)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm


def progress_bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr; disabled when ASP_PROGRESS=0."""
    kwargs.setdefault("disable", os.environ.get("ASP_PROGRESS", "1") == "0")
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)
