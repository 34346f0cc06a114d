"""Progress reports for long loops: a tqdm bar on a terminal, plain lines everywhere else.

`progress_bar(iterable=None, total=, desc=, unit=, initial=, ...)` wraps an iterable or is used as a context
manager / object with `.update(n)`, `.n`, `.set_postfix(...)` and `.close()`, as tqdm is. On a TTY it is a tqdm
bar. When the stream is not a terminal (a CI log, a pipe, a stage run by the Prefect flow, which forwards its
stderr line by line) it prints one flushed line when the loop starts, each time another ~10 % of the total is
done, and at the end, with no carriage returns::

    [train predictor] 40% (80/200 step) 12.3s elapsed, ~18s left, val_tau=0.812

The time left is estimated from the steps after the first (the first carries the loop's start-up), so it shows
from the second update on. Without a total, a line every 30 s and one at the end; with a total and
``heartbeat_s``, also a line whenever that long passed since the last one (launch: steps of many seconds).
`ASP_PROGRESS=0` silences both (the tests set it).
Tests: tests/test_progress.py.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tqdm.auto import tqdm

STEPS = 10  # lines per loop with a known total (one per 10 %)
HEARTBEAT_S = 30.0  # seconds between lines without a total


def progress_bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> tqdm | LineProgress:
    """A tqdm bar when stderr (or `file=`) is a terminal, else a `LineProgress`; silent when ASP_PROGRESS=0."""
    disable = kwargs.pop("disable", None)
    heartbeat_s = kwargs.pop("heartbeat_s", None)  # lines only: a bar redraws anyway
    if disable is None:
        disable = os.environ.get("ASP_PROGRESS", "1") == "0"
    stream = kwargs.get("file") or sys.stderr
    if disable or _is_tty(stream):
        kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, disable=disable, **kwargs)
    return LineProgress(iterable, heartbeat_s=heartbeat_s, **kwargs)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class LineProgress:
    """tqdm's interface (the part this project uses), reporting in whole lines; see the module docstring."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: float | None = None,
        desc: str | None = None,
        unit: str = "it",
        initial: float = 0,
        file: IO[str] | None = None,
        heartbeat_s: float | None = None,
        **_tqdm_only: Any,  # display options (dynamic_ncols, leave, position, ...) that lines do not need
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.heartbeat_s = heartbeat_s  # with a total: also a line when this long passed since the last one
        self.n = self.initial = initial
        self.file = file
        self.postfix = ""
        self.start = self._last_line_at = time.monotonic()
        self._first: tuple[float, float] | None = None  # (when, n) at the first update: the base of the estimate
        self._step = self._step_of(initial)
        self._closed = False
        self._line("started" if not initial else "resumed")

    def _step_of(self, n: float) -> int:
        return math.floor(STEPS * n / self.total) if self.total else 0

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("progress_bar() without an iterable is not iterable; call .update(n)")
        completed = False
        try:
            for item in self.iterable:
                yield item
                self.update(1)
            completed = True
        finally:
            self._finish("done" if completed else "stopped")  # a `break` or an exception: stopped

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._finish("stopped" if exc_type is not None else None)

    def __len__(self) -> int:
        return int(self.total or 0)

    def update(self, n: float = 1) -> None:
        """Count `n` more done; print a line when another 10 % is done (or, without a total, every 30 s)."""
        if self._closed:
            return
        self.n += n
        if self._first is None:
            self._first = (time.monotonic(), self.n)
        since = time.monotonic() - self._last_line_at
        if self.total:
            step = self._step_of(self.n)
            if self.n >= self.total:  # the 100 % line comes from close()
                return
            if step > self._step or (self.heartbeat_s is not None and since >= self.heartbeat_s):
                self._step = max(step, self._step)
                self._line()
        elif since >= HEARTBEAT_S:
            self._line()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        """Values appended to the next lines (`loss=0.123`), as tqdm shows them after the bar."""
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{key}={value}" for key, value in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        """Nothing to redraw: lines are printed as progress is made."""

    def close(self) -> None:
        """Print the last line, once: done (the total reached, or no total), else how far it got."""
        self._finish()

    def _finish(self, kind: str | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._line(kind or ("done" if not self.total or self.n >= self.total else "stopped"))

    def _elapsed(self) -> float:
        return time.monotonic() - self.start

    def _pace(self) -> float:
        """Units per second since the first update, for the time-left estimate: 0 until a second update. The
        first step carries the loop's start-up (launch: Ray, the model, the first rollouts), so an estimate from it
        alone overstates the time left many times over (docs/ui.md)."""
        if self._first is None:
            return 0.0
        seconds, done = time.monotonic() - self._first[0], self.n - self._first[1]
        return done / seconds if seconds > 0 and done > 0 else 0.0

    def _line(self, kind: str = "progress") -> None:
        """One line: kind is started / resumed / progress / done / stopped."""
        elapsed = self._elapsed()
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        parts = [f"[{self.desc}]"] if self.desc else []
        if self.total:
            percent = min(100, math.floor(100 * self.n / self.total))
            parts.append(f"{percent}% ({_number(self.n)}/{_number(self.total)} {self.unit})")
        else:
            parts.append(f"{_number(self.n)} {self.unit}")
        if kind in ("started", "resumed"):
            parts.append(kind)
        elif kind == "done":
            parts.append(f"done in {_duration(elapsed)}" + (f" ({rate:.3g} {self.unit}/s)" if rate > 0 else ""))
        elif kind == "stopped":
            parts.append(f"stopped after {_duration(elapsed)}")
        else:
            parts.append(f"{_duration(elapsed)} elapsed")
            pace = self._pace()
            if self.total and pace > 0:
                parts[-1] += f", ~{_duration(max(0.0, self.total - self.n) / pace)} left"
            elif not self.total and rate > 0:
                parts[-1] += f" ({rate:.3g} {self.unit}/s)"
        text = " ".join(parts) + (f", {self.postfix}" if self.postfix else "")
        stream = self.file or sys.stderr
        stream.write(text + "\n")
        stream.flush()
        self._last_line_at = time.monotonic()


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"
