"""`dispatch_rows`: a dataset reordered to the schedule's dispatch order (the hand example, unscheduled rows last,
bad ids refused by name), on a real schedule."""

from __future__ import annotations

import numpy as np
import pytest

from asp.integrations.order import dispatch_rows
from asp.schedule import build_schedule


def test_hand_example_and_unscheduled_rows_last() -> None:
    assert dispatch_rows([7, 5], [5, 6, 7]).tolist() == [2, 0, 1]


def test_a_real_schedule_is_walked_in_dispatch_order() -> None:
    ids = np.arange(40, 0, -1)
    schedule = build_schedule(ids, np.linspace(5.0, 90.0, 40), b=4, kappa=1, k=2, iterations=0, seed=0, method="asp")
    rows = dispatch_rows(schedule.prompt_ids, ids)
    assert ids[rows].tolist() == schedule.prompt_ids.tolist()


def test_missing_and_repeated_ids_are_refused() -> None:
    with pytest.raises(ValueError, match=r"1 scheduled prompt ids are not in the dataset \(first: \[9\]\)"):
        dispatch_rows([9, 5], [5, 6])
    with pytest.raises(ValueError, match="repeats prompt ids"):
        dispatch_rows([5], [5, 5])
