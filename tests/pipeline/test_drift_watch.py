"""The drift watch without Ray: real `MinibatchOutput`s, a real `Database`, a real MLflow run (SQLite store).

The Control Unit is replaced by `StandInCU`, a stand-in holding only what the watch touches (db, step,
replan, request_stop): it completes each task in the Database before showing its output to the watch, trains
every minibatch (marks its prompts consumed) and advances one trainer step per batch group, as the Control Unit
does. The stream: 512 prompts, predictions = expected length x log-noise 0.1, the C4 schedule (b = 8, k = 4:
64 minibatches, 16 groups), 4 samples per prompt; from minibatch 16 on every response is 1.5x longer (a
calibration bias of 1.5, far outside the 1.12 band).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from asp.adaptation import launch_drift
from asp.adaptation.predictions import Predictions
from asp.adaptation.summary import drift_summary
from asp.adaptation.watch import HISTORY_FILE, DriftWatch
from asp.control.database import Database
from asp.control.messages import MinibatchOutput
from asp.control.metrics import RunSummary
from asp.control.plan import WorkPlan
from asp.drift.rebalance import rebalance
from asp.io import write_json, write_parquet
from asp.plots import save_figure
from asp.plots.drift import drift_figure
from asp.predictor.calibration import CalibrationMap
from asp.schedule import build_schedule, schedule_to_frame
from asp.tracking import MlflowTracker

from .conftest import make_params

N, B, K, SAMPLES, SHIFT_AT = 512, 8, 4, 4, 16
DRIFT = {"window": 4, "min_prompts": 16, "patience": 2, "cooldown": 2, "max_actions": 1, "recalibrate_min_prompts": 64}
BALANCE = {"method": "asp", "iterations": 2000, "seed": 0, "shuffle": True}


class StandInCU:
    """A stand-in for `asp.runtime.ControlUnit` with the attributes the watch uses (db, step, replan,
    request_stop); `replan` goes to the real Database as `ControlUnit.replan` does."""

    def __init__(self, db: Database, step: int = 0) -> None:
        self.db, self.step = db, step
        self.stop_reason = ""
        self.replans: list[tuple[list, WorkPlan, WorkPlan | None]] = []

    def replan(self, rest: WorkPlan, full: WorkPlan | None = None) -> int:
        self.replans.append((self.db.pending_prompts(), rest, full))
        return self.db.replan(rest, full)

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason


@pytest.fixture(scope="module")
def stream() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    ids = [f"p{i:03d}" for i in range(N)]
    expected = 100 * np.exp(rng.normal(0, 0.7, N))
    raw = expected * np.exp(rng.normal(0, 0.1, N))
    plan = WorkPlan.from_schedule(build_schedule(ids, raw, b=B, kappa=0, k=K, iterations=2000, seed=0, method="asp"))
    frame = pd.DataFrame({"prompt_id": ids, "predicted_length": raw, "calibrated_length": raw})
    return {"ids": ids, "expected": dict(zip(ids, expected, strict=True)), "plan": plan, "frame": frame}


def output(item: Any, expected: dict[str, float], factor: float, version: int, rng: np.random.Generator) -> Any:
    """The `MinibatchOutput` of one `WorkItem`: 4 samples per prompt around factor x its expected length."""
    mean = np.repeat([expected[p] * factor for p in item.prompt_ids], SAMPLES)
    lengths = np.maximum(1, np.round(mean * np.exp(rng.normal(0, 0.2, mean.size)))).astype(np.int32)
    p, s = len(item.prompt_ids), lengths.size
    return MinibatchOutput(
        task_id=item.task_id,
        minibatch_id=item.minibatch_id,
        attempt=item.attempt,
        gu=0,
        actor=0,
        policy_version=version,
        prompt_ids=list(item.prompt_ids),
        n=SAMPLES,
        lengths=lengths,
        stopped=np.ones(s, dtype=bool),
        token_ids=np.zeros(0, dtype=np.int32),
        logprobs=np.zeros(0, dtype=np.float32),
        prompt_tokens=np.full(p, 8, dtype=np.int32),
        texts=[""] * s,
        gen_start=0.0,
        gen_end=1.0,
    )


def drive(cu: StandInCU, watch: DriftWatch, stream: dict[str, Any], limit: int | None = None, seed: int = 0) -> int:
    """Issue, complete, observe and train batch groups until the Database is exhausted (or the stand-in was asked
    to stop, or `limit` minibatches were ingested); returns the minibatches ingested."""
    rng = np.random.default_rng(seed)
    done = 0
    while not cu.db.exhausted and not cu.stop_reason and (limit is None or done < limit):
        unit = cu.db.next_unit(0)
        for item in unit:
            assert cu.db.complete(item.task_id)
            factor = 1.5 if item.task_id >= SHIFT_AT else 1.0  # task ids go on increasing after a replan
            out = output(item, stream["expected"], factor, cu.step, rng)
            watch(cu, out)
            cu.db.mark_consumed(item.task_id, len(item.prompt_ids))
            trained = len(out.prompt_ids)  # the lengths runtime.history records of a trained minibatch
            cu.db.history.add(out.prompt_ids, out.lengths.reshape(trained, -1), [out.policy_version] * trained)
            done += 1
        cu.step += 1
    return done


def make_watch(stream: dict[str, Any], tracker: Any, state_dir: Path | None, action: str, **drift: Any) -> DriftWatch:
    params = make_params({"drift": {**DRIFT, "enabled": True, "action": action, **drift}})
    return DriftWatch(
        params.drift,
        Predictions.from_frame(stream["frame"]),
        reference_tau=None,  # the bias signal alone: window tau of 32 length-grouped prompts is noisy
        k=K,
        tracker=tracker,
        balance=BALANCE,
        state_dir=state_dir,
        prompt_ids=stream["plan"].prompt_ids(),
    )


def metric_history(tracker: MlflowTracker, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in tracker.client.get_metric_history(tracker.run_id, key)]


def test_windows_are_logged_and_warn_tags_the_run(
    stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], tmp_path: Path
) -> None:
    tracker = new_tracker("drift-warn")
    watch = make_watch(stream, tracker, tmp_path, "warn")
    cu = StandInCU(Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0))
    assert drive(cu, watch, stream) == 64
    windows = watch.windows()
    assert len(windows) == 16  # 64 minibatches / 4
    # one window per batch group of 4; the group closes before its trainer step: steps 0, 1, ..., 15
    assert [s for s, _ in metric_history(tracker, "drift/tau_window")] == list(range(16))
    bias = [b for _, b in metric_history(tracker, "drift/bias_window")]
    assert all(0.9 < b < 1.12 for b in bias[:4]) and all(b > 1.3 for b in bias[4:])  # shift at minibatch 16
    tags = tracker.client.get_run(tracker.run_id).data.tags
    events = [r for r in windows if r.get("event")]
    # first firing: windows 4 and 5 offend (patience 2); then cooldown 2, and again after 2 more, ...
    assert [r["drift/window_index"] for r in events] == [5.0, 9.0, 13.0]
    assert "calibration bias" in tags["drift.event.1"] and set(tags) >= {"drift.event.2", "drift.event.3"}
    assert all(r["action"] == "warn" for r in events) and not cu.replans and not cu.stop_reason
    summary = drift_summary(watch)
    assert summary["drift/summary/events"] == 3 and summary["drift/summary/actions"] == 0
    assert summary["drift/summary/first_event_step"] == 5.0
    assert summary["drift/summary/lost_prompts"] == 0 and summary["drift/summary/duplicated_prompts"] == 0
    assert math.isnan(summary["drift/summary/tau_after_last_switch"])  # no switch
    persisted = [json.loads(line) for line in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    assert persisted == watch.rows


def test_recalibrate_replans_exactly_the_pending_prompts(
    stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], tmp_path: Path
) -> None:
    tracker = new_tracker("drift-recalibrate")
    watch = make_watch(stream, tracker, tmp_path, "recalibrate")
    db = Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0)
    cu = StandInCU(db)
    drive(cu, watch, stream)
    assert len(cu.replans) == 1  # max_actions 1
    pending, rest, full = cu.replans[0]
    assert rest.prompt_ids() != pending and sorted(rest.prompt_ids()) == sorted(pending)  # re-ordered, same set
    assert sorted(full.prompt_ids()) == sorted(stream["ids"])
    assert db.plan_version() == 2
    switch = next(r for r in watch.rows if r["kind"] == "switch")
    assert switch["action"] == "recalibrate" and switch["plan_version"] == 2 and switch["prompts"] >= 64
    # the refit map learned the 1.5x shift: calibrated predictions of the remaining prompts are ~1.5x raw
    ratio = np.median([watch.predictions.calibrated[p] / watch.predictions.raw[p] for p in pending])
    assert 1.3 < ratio < 1.7
    # the same minibatches as the loads of the refit map balance them
    loads = watch.predictions.calibrated
    expect, _ = rebalance(db.plans[1][1].minibatches, loads, K, **BALANCE)
    assert [list(mb) for mb in full.minibatches] == expect
    summary = drift_summary(watch)
    assert summary["drift/summary/actions"] == 1 and summary["drift/summary/switches"] == 1
    assert summary["drift/summary/lost_prompts"] == 0 and summary["drift/summary/duplicated_prompts"] == 0
    after = [r for r in watch.windows() if r["plan_version"] == 2]
    assert after and all(0.85 < r["drift/bias_window"] < 1.15 for r in after[1:])  # recalibrated: bias ~1 again
    # the cure: the reference re-measured on the refit prompts, and the recalibrated stream no longer offends
    assert watch.detector.reference_bias == switch["reference_bias"] == pytest.approx(1.0, abs=0.05)
    assert 0 < watch.detector.reference_bias_se == switch["reference_bias_se"] < 0.05
    assert [watch.detector.offending(r)[0] for r in after[1:]] == [{}] * (len(after) - 1)
    assert not any(r.get("event") for r in after)
    assert summary["drift/summary/tau_after_last_switch"] == pytest.approx(
        np.mean([r["drift/tau_window"] for r in after])
    )


def test_recalibrate_waits_for_enough_realized_prompts(
    stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], tmp_path: Path
) -> None:
    watch = make_watch(stream, new_tracker("drift-wait"), None, "recalibrate", recalibrate_min_prompts=160)
    cu = StandInCU(Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0))
    drive(cu, watch, stream)
    switch = next(r for r in watch.rows if r["kind"] == "switch")
    assert switch["prompts"] == 160 and switch["step"] == 8  # the streak began at window 4: 160 prompts by window 8
    assert len(cu.replans) == 1 and sorted(cu.replans[0][1].prompt_ids()) == sorted(cu.replans[0][0])


@pytest.mark.parametrize("action", ["reprofile", "refit_from_run"])  # refit_from_run: the same stop, no generation
def test_reprofile_requests_a_stop_and_later_events_only_warn(
    action: str, stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], tmp_path: Path
) -> None:
    watch = make_watch(stream, new_tracker("drift-reprofile"), tmp_path, action)
    cu = StandInCU(Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0))
    drive(cu, watch, stream)
    assert cu.stop_reason == watch.stop_event.message and f"Action: {action}" in cu.stop_reason
    first = next(r for r in watch.windows() if r.get("event"))
    assert first["action"] == action and first["step"] == 5 and watch.actions == 1
    assert len(cu.db.history) >= watch.params.refit_min_prompts  # refit_from_run had enough lengths: no wait
    # the Control Unit keeps ingesting what is in flight; later events only warn (a stop is pending)
    cu.stop_reason = ""
    drive(cu, watch, stream)
    later = [r for r in watch.windows() if r.get("event")][1:]
    assert later and all(r["action"] == "warn" for r in later)


def test_resume_keeps_the_history_up_to_the_step_and_applies_an_accepted_reprofile(
    stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], tmp_path: Path
) -> None:
    tracker = new_tracker("drift-resume")
    watch = make_watch(stream, tracker, tmp_path, "reprofile")
    db = Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0)
    cu = StandInCU(db)
    drive(cu, watch, stream)
    stopped_at = cu.step  # request_stop: the checkpoint covers everything trained so far
    state = db.state()
    # a re-profile accepted as v2 (the files `asp.adaptation.reprofile` writes): new predictions, C4 plans
    db2 = Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0)
    db2.restore(state)
    pending = db2.pending_prompts()
    frame = stream["frame"].assign(predicted_length=stream["frame"]["predicted_length"] * 1.5)
    frame["calibrated_length"] = frame["predicted_length"]
    v2 = tmp_path / "predictors" / "v2"
    v2.mkdir(parents=True)
    cal = CalibrationMap((1.0, 10_000.0), (1.0, 10_000.0))
    write_json(cal.to_dict(), v2 / "calibration.json")
    write_parquet(frame, v2 / "predictions.parquet")
    rest_frame = frame.set_index("prompt_id").loc[pending].reset_index()
    for name, f in (("rest", rest_frame), ("full", frame)):
        sched = build_schedule(
            f["prompt_id"].to_numpy(),
            f["predicted_length"].to_numpy(),
            b=B,
            kappa=0,
            k=K,
            iterations=2_000_000,
            seed=0,
            method="asp",
        )
        write_parquet(schedule_to_frame(sched), v2 / f"{name}.parquet")
    write_json({"version": 2, "accepted": True, "kendall_tau": 0.95, "seconds": {"total": 12.5}}, v2 / "report.json")
    # a new session (as after the in-process re-profile or a new launch): on_start after the restore
    resumed = make_watch(stream, tracker, tmp_path, "reprofile")
    cu2 = StandInCU(db2, step=stopped_at)
    resumed.on_start(cu2)
    assert len(cu2.replans) == 1 and sorted(cu2.replans[0][1].prompt_ids()) == sorted(pending)
    assert resumed.predictions.version == 2 and resumed.reference_tau == 0.95 and db2.plan_version() == 2
    assert resumed.windows() == [r for r in watch.windows() if r["step"] <= stopped_at]
    assert resumed.monitor.windows_emitted == len(resumed.windows()) and resumed.actions == 1
    drive(cu2, resumed, stream)
    assert db2.exhausted
    summary = drift_summary(resumed)
    assert summary["drift/summary/predictor_version_final"] == 2 and summary["drift/summary/switches"] == 1
    assert summary["drift/summary/reprofile_s"] == 12.5 and summary["drift/summary/reprofile_accepted"] == 1
    assert summary["drift/summary/lost_prompts"] == 0 and summary["drift/summary/duplicated_prompts"] == 0
    # a crash-resume from the same checkpoint again: the switch is in the checkpoint only if the plan version is
    again = make_watch(stream, tracker, tmp_path, "reprofile")
    db3 = Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0)
    db3.restore(state)  # the checkpoint before the switch: v2 is applied again, once
    again.on_start(StandInCU(db3, step=stopped_at))
    assert db3.plan_version() == 2 and sum(r["kind"] == "switch" for r in again.rows) == 1


def test_handoff_writes_the_pending_file_and_the_plot(
    stream: dict[str, Any],
    new_tracker: Callable[[str], MlflowTracker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = new_tracker("drift-handoff")
    watch = make_watch(stream, tracker, tmp_path, "reprofile")
    cu = StandInCU(Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0))
    drive(cu, watch, stream)
    summary = RunSummary({}, [], [], [], cu.step, cu.step, 0, "", False, stopped=cu.stop_reason)
    monkeypatch.setenv(launch_drift.HANDOFF_ENV, "1")
    metrics = launch_drift.finish(watch, summary, tmp_path, tmp_path / "plots" / "drift.png", tracker)
    assert metrics["drift/summary/handoff"] == 1 and metrics["drift/summary/events"] == 1
    pending = json.loads((tmp_path / launch_drift.PENDING_FILE).read_text())
    assert pending["step"] == cu.step and pending["signals"] == ["bias"] and "reprofile" in pending["message"]
    assert (tmp_path / "plots" / "drift.png").stat().st_size > 0
    logged = tracker.client.get_run(tracker.run_id).data.metrics
    assert logged["drift/summary/handoff"] == 1
    launch_drift.consume_pending(tmp_path)
    assert not (tmp_path / launch_drift.PENDING_FILE).exists()


def test_drift_figure_marks_actions(tmp_path: Path) -> None:
    rows = [
        {"kind": "window", "step": s, "drift/tau_window": 0.9 - 0.05 * (s > 3), "drift/mean_length": 100 + 10 * s}
        for s in range(8)
    ]
    rows[5] |= {"event": "length drift ...", "action": "recalibrate"}
    rows.append({"kind": "switch", "step": 5, "action": "recalibrate", "plan_version": 2, "predictor_version": 1})
    fig = drift_figure(rows, 0.9, 0.08)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "drift: recalibrate" in labels and any(t.startswith("switch: recalibrate") for t in labels)
    assert save_figure(fig, tmp_path / "d.png").stat().st_size > 0


def test_reference_tau_and_predictions_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asp.errors import UserError
    from asp.steps.paths import LaunchPaths, rebase
    from asp.tracking import NullTracker

    # on by default, the watch steps aside (saying so) where the pipeline's predictions / references are not there
    missing = rebase(LaunchPaths(), tmp_path)
    assert launch_drift.build_watch(make_params(), missing, None, tmp_path, NullTracker()) is None
    assert "the drift watch is off for this run" in capsys.readouterr().err

    with pytest.raises(UserError, match="predictor.json: missing; drift.enabled needs"):
        launch_drift.reference_tau(tmp_path / "predictor.json")
    write_json({"predictor/spearman": 0.9}, tmp_path / "predictor.json")
    with pytest.raises(UserError, match="cannot read predictor/kendall_tau"):
        launch_drift.reference_tau(tmp_path / "predictor.json")
    write_json({"predictor/kendall_tau": 0.8}, tmp_path / "predictor.json")
    assert launch_drift.reference_tau(tmp_path / "predictor.json") == 0.8
    with pytest.raises(UserError, match="no positive predictor/bias_reference .* drift.bias_reference to a number"):
        launch_drift.references(tmp_path / "predictor.json", "auto")
    assert launch_drift.references(tmp_path / "predictor.json", 0.9) == (0.8, 0.9, (0.0, 0.0))
    metrics = {"predictor/kendall_tau": 0.8, "predictor/kendall_tau_se": 0.03}
    metrics |= {"predictor/bias_reference": 1.01, "predictor/bias_reference_se": 0.02}
    write_json(metrics, tmp_path / "predictor.json")
    assert launch_drift.references(tmp_path / "predictor.json", "auto") == (0.8, 1.01, (0.03, 0.02))
    assert launch_drift.references(tmp_path / "predictor.json", 1.0) == (0.8, 1.0, (0.03, 0.0))
    with pytest.raises(UserError, match="Run the predict stage first"):
        launch_drift.load_predictions(tmp_path / "none.parquet", tmp_path / "cal.json")


def test_recalibrate_does_not_answer_a_ranking_drop(
    stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], capsys: pytest.CaptureFixture[str]
) -> None:
    """A monotone map cannot restore a ranking: a tau-only event warns (naming reprofile) and spends no action."""
    from asp.drift import DriftEvent

    watch = make_watch(stream, new_tracker("drift-tau-only"), None, "recalibrate")
    cu = StandInCU(Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0))
    row: dict[str, Any] = {}
    watch._on_event(cu, DriftEvent(3, ("tau",), {"tau": 0.2}, {"tau": 0.5}, "recalibrate", 3), row)
    assert row["action"] == "warn" and "drift.action: reprofile" in row["event"]
    assert watch.actions == 0 and cu.replans == [] and watch.waiting is None
    assert "cannot restore it" in capsys.readouterr().err


def test_refit_from_run_waits_for_enough_recorded_lengths_before_stopping(
    stream: dict[str, Any], new_tracker: Callable[[str], MlflowTracker], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A refit needs the realized lengths of drift.refit_min_prompts trained prompts: an event that comes earlier
    waits (and says so), and the stop is asked for at the first window with enough of them."""
    watch = make_watch(stream, new_tracker("drift-refit-wait"), tmp_path, "refit_from_run", refit_min_prompts=300)
    cu = StandInCU(Database(stream["plan"], {p: p for p in stream["ids"]}, max_attempts=3, seed=0))
    drive(cu, watch, stream)
    first = next(r for r in watch.windows() if r.get("event"))
    assert first["action"] == "refit_from_run" and first["step"] == 5 and watch.actions == 1
    err = capsys.readouterr().err
    assert "refit_from_run waits: " in err and "300 needed" in err
    assert cu.stop_reason == watch.stop_event.message  # asked for once the lengths were there, not before
    assert 300 <= len(cu.db.history) < 300 + 2 * K * B and cu.step > first["step"] + 2
