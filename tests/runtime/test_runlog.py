"""The run log (`asp.runtime.runlog`) by hand: what a resumed position keeps, which steps it must still log, a line
cut short by a kill, the finished summary, notes and the closed mark. The runtime end to end: test_runtime.py
(Ctrl-C + resume) and tests/pipeline/test_kill_points.py (SIGKILL at each phase)."""

from __future__ import annotations

from pathlib import Path

from asp.runtime.runlog import FILENAME, RunLog


def _record(task: int, prompts: int = 2) -> dict:
    return {"task_id": task, "prompts": prompts, "gu": 0, "actor": 0, "tokens": 10}


def _segment(step: int, tasks: list[int], wall: float, **extra: object) -> dict:
    rows = [{"step": s, "m": float(s)} for s in (step - 1, step)]
    totals = {"wall_s": wall, "sessions": 1.0, "prompts_trained": 4.0 * step}
    return {"kind": "segment", "step": step, "iterations": rows, "records": [_record(t) for t in tasks],
            "trace": [[wall - 0.5, 2]], "totals": totals, **extra}  # fmt: skip


def test_restore_keeps_what_the_position_covers_and_names_the_steps_to_log(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.append(_segment(2, [0, 1], 1.0))
    log.mark("logged", 2)
    log.append(_segment(4, [2, 3, 4], 2.0))  # position 4 saved, killed before its metrics were logged
    log.append(_segment(6, [5], 3.0))  # an attempt whose position 6 is abandoned (its trainer checkpoint damaged)
    with (tmp_path / FILENAME).open("a") as fh:
        fh.write('{"kind": "logged", "st')  # cut short by the kill

    history = log.restore(4, consumed={"0": 2, "1": 2, "2": 2, "3": 1})  # task 4 was only queued at step 4
    assert [r["step"] for r in history.iterations] == [1, 2, 3, 4]
    assert [r["task_id"] for r in history.records] == [0, 1, 2, 3]  # task 4 is generated again after the resume
    assert history.unlogged == [(3, {"m": 3.0}), (4, {"m": 4.0})]  # logged up to 2 only
    assert history.totals["wall_s"] == 2.0 and history.trace == [(0.5, 2.0), (1.5, 2.0)]
    assert history.summary is None and not history.closed
    assert [e["step"] for e in RunLog(tmp_path).lines()] == [2, 2, 4]  # rewritten: position 6 and the cut line gone


def test_read_a_finished_run_with_its_summary_notes_and_close(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.append(_segment(2, [0, 1], 1.0))
    log.mark("logged", 2)
    log.append(_segment(3, [2], 1.5, summary={"trainer_step": 3, "metrics": {"runtime/summary/iterations": 3.0}}))
    history = log.read(3)
    assert history.summary["trainer_step"] == 3 and not history.summary_logged
    assert history.unlogged == [(3, {"m": 3.0})] and len(history.records) == 3  # a finished run drops nothing
    log.mark("logged", 3)
    log.mark("summary_logged", 3)
    log.note("heldout", 3, {"grpo/heldout_reward_after": 0.5})
    history = log.read(3)
    assert history.unlogged == [] and history.summary_logged and not history.closed
    assert history.notes == {"heldout": {"grpo/heldout_reward_after": 0.5}}
    log.mark("closed", 3)
    assert log.read(3).closed
    log.reset()
    assert RunLog(tmp_path).read(3).iterations == [] and not (tmp_path / FILENAME).exists()
