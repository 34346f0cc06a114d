"""The one orchestration layer behind `asp repro` and the Prefect flow: every stage runs THROUGH DVC.

* `request`  — what a run is asked to do (stages, preset, overrides), validated before anything runs
* `dvc`      — DVC command lines, streaming their output, timeouts, clean stops, what DVC did per stage
* `pipeline` — `PipelineRun` (one MLflow parent run; `run_stage` / `run_experiment`) and `run_pipeline`
* `retry`    — the one retry policy of a stage attempt, used by `asp repro` and the Prefect tasks alike
* `flow`     — the Prefect flow `asp-pipeline`, its tasks and artifacts (imports prefect)
* `drift_loop` — the Prefect flow `asp-drift-loop`: launch -> drift -> re-profile -> resume (imports prefect; uses
  `flow`'s stage task, never the other way round)
* `serve`    — `asp serve`: both flows as Prefect deployments (the only module that imports both)

`asp repro` = `run_pipeline`; `asp serve` = `serve.serve`; `flows/*.py` are thin entry points to the flows.
"""
