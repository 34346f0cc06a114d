"""The examples in the public docstrings run and give the documented output."""

from __future__ import annotations

import doctest

import pytest

from asp.schedule import balance, dp, metrics, schedule


@pytest.mark.parametrize("module", [dp, balance, metrics, schedule])
def test_docstring_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
