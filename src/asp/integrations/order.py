"""A dataset in asp's dispatch order, for trainers that take an ordered dataset and walk it sequentially (verl's
``data.custom_cls`` with ``data.shuffle=False``, OpenRLHF with its shuffle turned off): docs/integrations.md.

    from asp.integrations.order import dispatch_rows
    rows = dispatch_rows(schedule_frame.sort_values("dispatch_rank")["prompt_id"], dataframe["prompt_id"])
    dataframe = dataframe.iloc[rows]   # walked in order, batch after batch = minibatch after minibatch

Pure: numpy only (no trainer is imported). Tests: tests/integrations/test_order.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def dispatch_rows(scheduled_ids: Sequence[Any], dataset_ids: Sequence[Any]) -> np.ndarray:
    """Row indices of a dataset that put its prompts in the schedule's dispatch order.

    Args:
        scheduled_ids: (n,) prompt ids in dispatch order (a schedule's ``prompt_ids``, or its frame sorted by
            ``dispatch_rank``).
        dataset_ids: (m,) the dataset's prompt id column, m >= n.

    Returns:
        (m,) int64 rows: the scheduled prompts in dispatch order, then the dataset's unscheduled rows in their own
        order (a trainer that drops an incomplete last batch drops those first).

    Raises:
        ValueError: a scheduled id is not in the dataset, or the dataset repeats a prompt id.

    Example: scheduled [7, 5], dataset [5, 6, 7] -> [2, 0, 1].
    """
    ids = list(dataset_ids)
    index = {pid: i for i, pid in enumerate(ids)}
    if len(index) != len(ids):
        raise ValueError(f"the dataset repeats prompt ids ({len(ids) - len(index)} duplicates): ids must be unique")
    missing = [p for p in scheduled_ids if p not in index]
    if missing:
        raise ValueError(
            f"{len(missing)} scheduled prompt ids are not in the dataset (first: {missing[:3]}); order the prompts"
            " the schedule was built from"
        )
    first = [index[p] for p in scheduled_ids]
    taken = set(first)
    return np.asarray(first + [i for i in range(len(ids)) if i not in taken], dtype=np.int64)
