"""Discrete-event simulator of the ASP runtime, and the resource planner (paper appendix B.6).

* `engine.simulate`: the runtime's own Control Unit core (`asp.control`: dispatch or sync rounds, Training Queue,
  backpressure, lag bound, metrics) on a simulated clock, async or sync (``runtime.mode``), with Generation Units,
  actors and the Training Unit modelled by time models;
* `timemodel`: generation time per minibatch (static / continuous batching) and training times, fitted on
  measured timings; `lengths`: realized response lengths around the calibrated predictions;
* `planner` / `evaluate`: B.6 and a simulated search over layouts.

Used by the `simulate` stage, `asp simulate` and `asp plan layout` (docs/simulator.md). Imports neither Ray nor
torch. Tests: tests/sim.
"""
