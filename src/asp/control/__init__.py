"""The Control Unit's decisions, clock-agnostic: one core that the Ray runtime and the simulator both drive.

* `core.ControlCore`: dispatch (async units / sync rounds), the lag bound, when to train and what to take,
  backpressure, stop / replan, the run's records and the run summary; the driver passes its own clock's `now`;
* `settings.ControlSettings`: the plain settings it reads (built from the params at the edge: the runtime's
  `RuntimeConfig.control_settings()`, the simulate stage / CLI for the simulator);
* the pure parts it is made of: `database` (scheduled tasks and their states), `queue` (Training Queue,
  backpressure), `sender` (dispatch policy, sync rounds, lag bound), `messages` (typed messages), `plan`
  (`WorkPlan`), `metrics` (iteration and summary metrics, `RunSummary`). `asp.runtime` re-exports their public names
  (`from asp.runtime import WorkPlan, Database, ...`).

Drivers: `asp.runtime.control.ControlUnit` (Ray futures, wall clock) and `asp.sim.engine` (event queue, time
models). Pure: no Ray, no config, no I/O, no tracking. Tests: tests/control (and tests/runtime for the parts).
"""
