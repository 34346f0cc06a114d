"""Input validation for the scheduler's public functions.

Every public entry point of `asp.schedule` checks its arguments here before any numba kernel runs, so bad
input gives a `ValueError` that names the argument and the offending value instead of a crash or silent
garbage. The array check is one fused numba pass (finite, positive, at most `MAX_LENGTH`, optionally
non-decreasing). The upper bound keeps every derived quantity (sums, squared deviations, group-load CV) finite:
lengths near 1e300 would overflow to inf/NaN and end up as invalid JSON in a summary.
"""

from __future__ import annotations

import numbers

import numba as nb
import numpy as np

MAX_LENGTH = 1e15  # tokens; far above any real response, far below where squares of sums overflow float64
MAX_LENGTH_TEXT = "1e15"
_OK, _NAN, _INF, _NONPOS, _UNSORTED, _HUGE = 0, 1, 2, 3, 4, 5
_WHAT = {
    _NAN: "NaN",
    _INF: "infinite",
    _NONPOS: "zero or negative",
    _UNSORTED: "not sorted (decreases)",
    _HUGE: f"larger than {MAX_LENGTH_TEXT}",
}


@nb.njit(cache=True, nogil=True)
def _first_bad(x, need_sorted, max_value):  # pragma: no cover - compiled
    """Return (index, code) of the first bad element of a float64 array, or (-1, 0) if all are fine."""
    prev = -np.inf
    for i in range(x.shape[0]):
        v = x[i]
        if v != v:
            return i, 1
        if v == np.inf or v == -np.inf:
            return i, 2
        if v <= 0.0:
            return i, 3
        if v > max_value:
            return i, 5
        if need_sorted and v < prev:
            return i, 4
        prev = v
    return -1, 0


def as_lengths(values: object, name: str, *, need_sorted: bool = False, allow_empty: bool = False) -> np.ndarray:
    """Convert `values` to a contiguous 1-D float64 array of finite, strictly positive lengths <= `MAX_LENGTH`.

    Args:
        values: array-like of lengths (tokens). Integers and floats are accepted.
        name: argument name used in error messages.
        need_sorted: also require a non-decreasing order.
        allow_empty: accept a zero-length array.

    Returns:
        float64 array of shape (n,), C-contiguous (a copy only when needed).

    Raises:
        ValueError: wrong shape or dtype, empty, NaN, inf, zero, negative or huge (> MAX_LENGTH) values, or
            unsorted when required.
    """
    try:
        arr = np.ascontiguousarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a 1-D array of numbers, got {type(values).__name__}: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name} is empty; give at least one length")
    idx, code = _first_bad(arr, need_sorted, MAX_LENGTH)
    if code != _OK:
        hint = (
            "sort them ascending first"
            if code == _UNSORTED
            else f"lengths must be finite, > 0 and <= {MAX_LENGTH_TEXT}"
        )
        raise ValueError(f"{name}[{idx}] = {float(arr[idx])!r} is {_WHAT[code]}; {hint}")
    return arr


def as_int(value: object, name: str, *, minimum: int) -> int:
    """Return `value` as a Python int >= `minimum`, or raise a ValueError naming `name`."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer():  # 3.0, np.float64(3.0), and True / False
        number = int(float(value))
    else:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def as_choice(value: str, name: str, choices: tuple[str, ...]) -> str:
    """Return `value` if it is one of `choices`, else raise a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value
