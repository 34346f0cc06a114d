"""History-aware passes in the Control Unit core: each new pass re-scheduled on the run's own lengths at the pass
boundary, the history kept in the checkpoint state exactly once, and a resume at a pass boundary that goes on with
the history and the pass plans intact.

The runs are driven by hand (every work item completes at once): 24 prompts in minibatches of 2, batch groups of
2, batches of 4 prompts, n = 2 samples; prompt p's responses are ``LENGTH[p]`` tokens (a pattern the original plan
knows nothing of: its predictions are all 100), so a re-scheduled pass puts prompts of equal length together.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from asp.control.core import ControlCore
from asp.control.database import Database
from asp.control.history import CATCH_UP_REASON, PASS_REASON, HistorySettings, plan_next_pass
from asp.control.messages import GUReport, MinibatchOutput, WorkItem
from asp.control.plan import WorkPlan
from asp.schedule.history import HistoryEstimator
from asp.schedule.spec import ScheduleSpec
from tests.control import helpers
from tests.control.helpers import gu_slots, settings

N_PROMPTS, STEPS_PER_PASS = 96, 24  # 96 prompts / 4 per step
LENGTH = {p: 10 if p % 2 == 0 else 130 for p in range(N_PROMPTS)}  # the original plan pairs a short and a long one
HISTORY = HistorySettings(
    estimator=HistoryEstimator(prior_samples=0.5, drift_per_version=0.01),
    spec=ScheduleSpec(b=2, kappa=0, k=2, iterations=2000, method="asp"),
    shuffle=False,
    seed=0,
    catch_up=True,
)


def original_plan() -> WorkPlan:
    """Consecutive ids in minibatches of 2 (each pairs a short and a longer prompt), every prediction 100."""
    plan = WorkPlan.from_lists([[p, p + 1] for p in range(0, N_PROMPTS, 2)], [r // 2 for r in range(N_PROMPTS // 2)])
    return replace(plan, predicted={p: 100.0 for p in range(N_PROMPTS)})


def make_core(history: HistorySettings | None, passes: int) -> ControlCore:
    s = settings(iterations=passes * STEPS_PER_PASS, history=history, checkpoint_interval=1)
    plan = original_plan()
    db = Database(plan, {p: f"prompt {p}" for p in plan.prompt_ids()}, epochs=None, seed=0, max_attempts=3)
    core = ControlCore(s, db, gu_slots(s.generation_units, s.actors_per_unit), checkpointing=True)
    core.begin(0.0)
    return core


def output(item: WorkItem, gu: int, version: int) -> MinibatchOutput:
    lengths = np.repeat(np.asarray([LENGTH[p] for p in item.prompt_ids], np.int32), 2)
    return helpers.output(item, gu, gu * 2, version, 0.0, 1.0, lengths=lengths)


def drive(core: ControlCore, until_step: int) -> None:
    """Dispatch, complete everything at once, train, until `until_step` steps are trained or the run finished."""
    now = 1.0
    while core.step < until_step and not core.finished():
        for gu, items in core.dispatch(now).items():
            core.on_report(GUReport(gu, [output(it, gu, core.version) for it in items], [], []), now)
        batch = core.maybe_train(now)
        if batch is not None:
            core.on_step(core.step + 1, core.version + 1, 0.1, now + 0.5)
        now += 1.0


def padding(plan: WorkPlan) -> float:
    """Padding rate of a plan on the true lengths: 1 - tokens / (minibatch max x size), over the whole plan."""
    tokens = sum(LENGTH[p] for mb in plan.minibatches for p in mb)
    boxes = sum(max(LENGTH[p] for p in mb) * len(mb) for mb in plan.minibatches)
    return 1.0 - tokens / boxes


def replans(core: ControlCore, reason: str) -> list[tuple[WorkPlan | None, WorkPlan]]:
    """(rest, full) plans of each replan with `reason`, in order (the i-th replan made plan version i + 2)."""
    return [core.db.plans[i + 2] for i, r in enumerate(core.db.replans) if r.get("reason") == reason]


def pass_plans(core: ControlCore) -> list[WorkPlan]:
    """The full plan of each pass-boundary replan, in order."""
    return [full for _, full in replans(core, PASS_REASON)]


def dispatched(core: ControlCore, epoch: int) -> list[list[int]]:
    """The minibatches pass `epoch` (0-based) trained, in task order (replaced tasks left out)."""
    tasks = sorted((t for t in core.db.tasks.values() if t.epoch == epoch), key=lambda t: t.task_id)
    return [list(core.db._plan_of(t).minibatches[t.rank]) for t in tasks if t.state.value != "replaced"]


def test_each_new_pass_is_rescheduled_on_the_realized_lengths_at_the_pass_boundary():
    core = make_core(HISTORY, passes=3)
    drive(core, 3 * STEPS_PER_PASS)
    assert core.finished() and core.step == 3 * STEPS_PER_PASS
    records = [r for r in core.db.replans if r.get("reason") == PASS_REASON]
    # once before every pass after the first (the sender runs ahead into pass 4 while pass 3 trains)
    assert [r["epochs_created"] for r in records] == list(range(1, core.db.epochs_created))
    assert len(records) >= 2
    assert all(r["replaced"] == [] for r in records)
    second, third = pass_plans(core)[:2]
    # pass 2 is planned when pass 1 is all issued: the prompts still in flight (12 here) have no history yet
    seen = [p for p in range(N_PROMPTS) if abs(second.predicted[p] - 100.0) > 1e-9]
    assert len(seen) >= N_PROMPTS - 16
    # the loads it used: prompts trained in pass 1 sit near their realized length, shrunk towards 100 by at most
    # kappa / (kappa + w) = 0.5 / (0.5 + 1 / (1/2 + 0.01 * 24)) = 0.27 of the way (n 2, at most 24 versions old)
    assert all(abs(second.predicted[p] - LENGTH[p]) < 0.28 * abs(100 - LENGTH[p]) for p in seen)
    # equal lengths paired once they are known: 46 % padding in pass 1, (almost) none later
    assert padding(original_plan()) > 0.4 and padding(second) < 0.1 and padding(third) == 0.0
    # pass 2's tasks dispatch the new plan (the ones not issued when its in-flight prompts trained: its catch-up)
    tasks = [t for t in core.db.tasks.values() if t.epoch == 1]
    assert {core.db.plan_version(t.task_id) for t in tasks} == {2, 3}
    summary = core.summary_metrics()
    assert summary["runtime/summary/history_passes"] == len(records)
    # which knowledge each pass ran on: pass 1's loads are all 100 (tau undefined); pass 3's order every short prompt
    # below every long one: tau-b's ceiling with two true lengths, sqrt(48^2 / (96 * 95 / 2)) = 0.71 over one pass
    assert np.isnan(summary["runtime/summary/load_tau/pass_1"])
    assert summary["runtime/summary/load_tau/pass_2"] > 0.5 and summary["runtime/summary/load_tau/pass_3"] > 0.7


def test_the_rest_of_a_pass_is_rescheduled_once_the_prompts_in_flight_at_its_boundary_are_trained():
    core = make_core(HISTORY, passes=3)
    drive(core, 3 * STEPS_PER_PASS)
    records = [r for r in core.db.replans if r.get("reason") == CATCH_UP_REASON]
    # once in pass 2 and once in pass 3 (and in the pass 4 the sender ran ahead into while pass 3 trained)
    assert [r["epochs_created"] for r in records][:2] == [2, 3]
    assert all(r["replaced"] for r in records)  # it swaps pending tasks (a rest plan), later passes keep theirs
    (rest2, _), (rest3, _) = replans(core, CATCH_UP_REASON)[:2]
    assert rest2 is not None and rest3 is not None
    # every load is now near the prompt's realized length: the prompts in flight at the boundary (prediction 100
    # there) have a visit now, so the pass's rest pairs equal lengths
    assert all(abs(rest2.predicted[p] - LENGTH[p]) < 0.28 * abs(100 - LENGTH[p]) for p in rest2.prompt_ids())
    assert padding(pass_plans(core)[0]) > 0.0 and padding(rest2) == 0.0
    # what pass 2 trained: the boundary plan's head, then the catch-up's rest, every prompt once
    trained = dispatched(core, 1)
    assert sorted(p for mb in trained for p in mb) == list(range(N_PROMPTS))
    assert [list(mb) for mb in rest2.minibatches] == trained[-rest2.n_minibatches :]
    assert core.summary_metrics()["runtime/summary/history_catch_ups"] == len(records)

    off = make_core(replace(HISTORY, catch_up=False), passes=3)
    drive(off, 3 * STEPS_PER_PASS)
    assert [r.get("reason") for r in off.db.replans] == [PASS_REASON, PASS_REASON, PASS_REASON][: len(off.db.replans)]
    assert off.summary_metrics()["runtime/summary/history_catch_ups"] == 0.0


def test_history_off_keeps_the_original_plan_every_pass():
    core = make_core(None, passes=2)
    drive(core, 2 * STEPS_PER_PASS)
    assert core.finished() and core.db.replans == [] and len(core.db.history) == 0
    assert "history" not in core.db.state()
    summary = core.summary_metrics()
    assert summary["runtime/summary/history_passes"] == 0.0
    assert np.isnan(summary["runtime/summary/load_tau/pass_2"])  # every pass on the predictions (all 100)


def test_every_trained_prompt_is_recorded_exactly_once_with_its_generating_version():
    core = make_core(HISTORY, passes=2)
    drive(core, 2 * STEPS_PER_PASS)
    counts = core.db.trained_counts()
    assert counts == {p: 2 for p in range(N_PROMPTS)}
    assert {p: len(v) for p, v in core.db.history.visits.items()} == counts
    for p, visits in core.db.history.visits.items():
        assert all(n == 2 and m == LENGTH[p] for _, n, m in visits)
        assert [v for v, _, _ in visits] == sorted(v for v, _, _ in visits)


def test_a_resume_at_a_pass_boundary_keeps_the_history_and_replays_the_pass_plans():
    whole = make_core(HISTORY, passes=3)
    drive(whole, 3 * STEPS_PER_PASS)

    first = make_core(HISTORY, passes=3)
    drive(first, STEPS_PER_PASS)  # pass 2 was planned at the boundary, a checkpoint step: the kill comes here
    assert [r["epochs_created"] for r in first.db.replans if r.get("reason") == PASS_REASON] == [1]
    state = first.db.state()
    trained = first.db.trained_counts()
    # the checkpoint carries every trained prompt's lengths, once per time it was trained, and nothing else
    assert {p: len(v) for p, v in first.db.history.visits.items()} == trained
    assert len(state["history"]) == sum(trained.values()) >= N_PROMPTS - 4

    resumed = make_core(HISTORY, passes=3)
    resumed.db.restore(state)
    resumed.step = resumed.start_step = first.step
    resumed.version = first.version
    assert resumed.db.history == first.db.history
    drive(resumed, 3 * STEPS_PER_PASS)
    assert resumed.finished()
    trained = resumed.db.trained_counts()
    assert sum(trained.values()) == sum(whole.db.trained_counts().values()) == 3 * N_PROMPTS
    assert {p: len(v) for p, v in resumed.db.history.visits.items()} == trained  # nothing twice, nothing lost
    assert pass_plans(resumed)[0].minibatches == pass_plans(whole)[0].minibatches  # replayed, not recomputed
    assert padding(pass_plans(resumed)[1]) == 0.0

    again = make_core(HISTORY, passes=3)  # a second resume from the finished state replays both pass plans
    again.db.restore(resumed.db.state())
    assert [p.minibatches for p in pass_plans(again)] == [p.minibatches for p in pass_plans(resumed)]
    rests = [[rest.minibatches for rest, _ in replans(c, CATCH_UP_REASON)] for c in (again, resumed)]
    assert rests[0] == rests[1] and len(rests[0]) >= 2  # the catch-ups made after the resume, replayed
    assert again.db.history == resumed.db.history


def test_plan_next_pass_covers_the_prompts_and_uses_history_aware_loads():
    core = make_core(HISTORY, passes=2)
    drive(core, STEPS_PER_PASS)
    ids = list(range(N_PROMPTS))
    plan = plan_next_pass(ids, {p: 100.0 for p in ids}, core.db.history, core.version, HISTORY, 1)
    assert plan is not None and sorted(plan.prompt_ids()) == ids
    assert plan_next_pass(ids, {}, type(core.db.history)(), 0, HISTORY, 1) is None


def test_the_simulator_reschedules_each_pass_too_and_runs_faster_for_it():
    """The simulator drives the same core: a three-pass simulated run plans passes 2 and 3 on the run's lengths (a
    simulated Database has no prompt texts, and the new plans must still be accepted) and, on a padded-batch time
    model, pairing equal lengths makes its iterations shorter than the same run on the original plan every pass."""
    from asp.sim.engine import Workload, simulate
    from asp.sim.timemodel import FEATURES, GenerationTimeModel, TrainingTimeModel

    gen = GenerationTimeModel("static", (0.5, 0.0, 0.02, 0.0, 0.0), FEATURES["static"])  # 0.5 s + 20 ms a row step
    train = TrainingTimeModel(
        step_base_s=0.5, step_per_token_s=0.0, save_s=0.0, convert_s=0.0, load_s=0.0, step_per_sample_s=0.0
    )
    ids = list(range(N_PROMPTS))
    work = Workload.from_arrays(ids, np.repeat([[LENGTH[p]] for p in ids], 2, axis=1), np.full(N_PROMPTS, 5), 160)
    runs = {}
    for name, history in (("history", HISTORY), ("off", None)):
        s = settings(iterations=3 * STEPS_PER_PASS, history=history)
        runs[name] = simulate(original_plan(), work, gen, train, s, record_decisions=True)
    on, off = runs["history"], runs["off"]
    assert on.metrics["runtime/summary/history_passes"] >= 2 and sum(d[1] == "pass_plan" for d in on.decisions) >= 2
    assert off.metrics["runtime/summary/history_passes"] == 0
    assert on.metrics["runtime/summary/prompts_trained"] == off.metrics["runtime/summary/prompts_trained"] == 288
    mean = "runtime/summary/mean_iteration_time_s"
    assert on.metrics[mean] < 0.9 * off.metrics[mean]
