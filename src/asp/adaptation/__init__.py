"""Adaptation during a launch run: drift watching, re-profiling and the launch-drift handoff (docs/drift.md).

* `watch`: `DriftWatch`, the Control Unit's observer: drift windows, events, recalibration, stop for a re-profile;
* `predictions`: one predictor version's raw and calibrated predicted lengths;
* `reprofile`: a new predictor version for the current policy and a schedule of the remaining prompts
  (`position`: where the stopped run is; `versions`: ``<state_dir>/predictors/v<k>/`` read back); `refit`: the
  same without generation, fine-tuned on the run's own realized lengths (drift.action refit_from_run);
* `launch_drift`: what the launch stage calls: build the watch, re-profile and resume or hand off to the Prefect
  drift loop, finish (`summary`: the ``drift/summary/...`` metrics).

`asp.pipeline.launch` and ``asp reprofile`` use this package; it never imports `asp.pipeline` (its shared steps
come from `asp.steps`).
"""
