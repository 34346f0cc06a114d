"""`asp.progress.progress_bar`: on a stream that is not a terminal, one flushed plain line per ~10 % (plus a
start and an end line), no carriage returns; tqdm on a terminal; nothing when ASP_PROGRESS=0.

    .venv/bin/python -m pytest tests/test_progress.py
"""

from __future__ import annotations

import io
import re

import pytest

from asp import progress
from asp.progress import LineProgress, progress_bar


class Clock:
    """A stand-in for time.monotonic that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recording(io.StringIO):
    """A non-TTY stream that notes whether every line was flushed as soon as it was written."""

    def __init__(self) -> None:
        super().__init__()
        self.unflushed = 0
        self.max_unflushed = 0

    def write(self, text: str) -> int:
        self.unflushed += 1
        self.max_unflushed = max(self.max_unflushed, self.unflushed)
        return super().write(text)

    def flush(self) -> None:
        self.unflushed = 0
        super().flush()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    monkeypatch.setenv("ASP_PROGRESS", "1")
    fake = Clock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


def test_iterator_prints_a_line_per_10_percent_without_carriage_returns(clock: Clock) -> None:
    out = Recording()
    seen = []
    for item in progress_bar(range(200), desc="train predictor", unit="step", file=out):
        clock.now += 0.1
        seen.append(item)
    assert seen == list(range(200))
    text = out.getvalue()
    assert "\r" not in text and out.max_unflushed == 1
    lines = text.splitlines()
    assert lines[0] == "[train predictor] 0% (0/200 step) started"
    assert [re.match(r"\[train predictor\] (\d+)%", line)[1] for line in lines] == [str(p) for p in range(0, 101, 10)]
    assert lines[4] == "[train predictor] 40% (80/200 step) 8.0s elapsed, ~12.0s left"
    assert lines[-1] == "[train predictor] 100% (200/200 step) done in 20.0s (10 step/s)"


def test_context_manager_with_update_initial_and_postfix(clock: Clock) -> None:
    out = io.StringIO()
    with progress_bar(total=1000, desc="profile", unit="minibatch", initial=300, file=out) as bar:
        for _ in range(7):
            clock.now += 60
            bar.update(100)
            bar.set_postfix(tok_s="812")
    assert bar.n == 1000
    lines = out.getvalue().splitlines()
    assert lines[0] == "[profile] 30% (300/1000 minibatch) resumed"
    assert lines[1] == "[profile] 40% (400/1000 minibatch) 1m00s elapsed"  # one update: no estimate yet
    assert lines[2] == "[profile] 50% (500/1000 minibatch) 2m00s elapsed, ~5m00s left, tok_s=812"
    assert lines[-1] == "[profile] 100% (1000/1000 minibatch) done in 7m00s (1.67 minibatch/s), tok_s=812"
    assert len(lines) == 8


def test_jumps_print_one_line_and_unfinished_loops_say_stopped(clock: Clock) -> None:
    out = io.StringIO()
    bar = progress_bar(total=10, desc="predict", unit="prompt", file=out)
    bar.update(7)  # 0 -> 70 %: one line, not seven
    bar.update(0.5)
    bar.close()
    bar.close()  # once only
    assert out.getvalue().splitlines()[1:] == [
        "[predict] 70% (7/10 prompt) 0.0s elapsed",
        "[predict] 75% (7.50/10 prompt) stopped after 0.0s",
    ]

    out = io.StringIO()
    for i in progress_bar(range(100), desc="hash", file=out):
        if i == 35:
            break
    assert out.getvalue().splitlines()[-1] == "[hash] 35% (35/100 it) stopped after 0.0s"

    out = io.StringIO()
    with pytest.raises(RuntimeError), progress_bar(total=4, desc="warm start", file=out) as bar:
        bar.update(4)
        raise RuntimeError
    assert out.getvalue().splitlines()[-1].startswith("[warm start] 100% (4/4 it) stopped")


def test_without_total_a_line_every_30_s_and_done(clock: Clock) -> None:
    out = io.StringIO()
    for _ in progress_bar(iter(range(100)), desc="stream", unit="row", file=out):
        clock.now += 1.0
    lines = out.getvalue().splitlines()
    assert lines[0] == "[stream] 0 row started"
    assert lines[1] == "[stream] 30 row 30.0s elapsed (1 row/s)"
    assert len(lines) == 5 and lines[-1] == "[stream] 100 row done in 1m40s (1 row/s)"


def test_default_stream_is_stderr_read_when_printing(clock: Clock, capsys: pytest.CaptureFixture) -> None:
    for _ in progress_bar(range(3), desc="files"):
        pass
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines()[-1].startswith("[files] 100% (3/3 it) done")


def test_asp_progress_0_silences(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("ASP_PROGRESS", "0")
    out = io.StringIO()
    with progress_bar(total=5, desc="quiet", file=out) as bar:
        bar.update(5)
        bar.set_postfix(loss="0.1")
    assert list(progress_bar(range(3), file=out)) == [0, 1, 2]
    assert out.getvalue() == "" and capsys.readouterr().err == ""


def test_a_terminal_gets_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASP_PROGRESS", "1")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = progress_bar(total=5, desc="tty", file=Tty())
    assert not isinstance(bar, LineProgress)
    bar.update(5)
    bar.close()
    assert isinstance(progress_bar(total=5, file=io.StringIO()), LineProgress)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.04, "0.0s"), (59.94, "59.9s"), (61, "1m01s"), (3599, "59m59s"), (7380, "2h03m")]
)
def test_durations(seconds: float, text: str) -> None:
    assert progress._duration(seconds) == text


def test_heartbeat_adds_a_line_when_steps_are_slow(clock: Clock) -> None:
    """launch: 200 steps of ~5 s would print its first line after 100 s; with heartbeat_s a slow step prints one."""
    out = io.StringIO()
    bar = progress_bar(total=200, desc="launch", unit="step", file=out, heartbeat_s=30)
    clock.now += 5
    bar.update(1)  # 5 s since the start line: no line
    clock.now += 31
    bar.update(1)  # 31 s since the last line: a heartbeat line, though only 1 % more is done
    clock.now += 5
    bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[launch] 0% (0/200 step) started"
    # the estimate leaves out the first step (its start-up): 1 step in the 31 s since, 198 to go
    assert lines[1] == "[launch] 1% (2/200 step) 36.0s elapsed, ~1h42m left"
    assert lines[2].startswith("[launch] 1% (3/200 step) stopped after") and len(lines) == 3
