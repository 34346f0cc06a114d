"""The one orchestration layer behind `asp repro` and the Prefect flow: every stage runs THROUGH DVC.

* `request`  — what a run is asked to do (stages, preset, overrides), validated before anything runs
* `dvc`      — DVC command lines, streaming their output, timeouts, clean stops, what DVC did per stage
* `pipeline` — `PipelineRun` (one MLflow parent run; `run_stage` / `run_experiment`) and `run_pipeline`
* `flow`     — the Prefect flow, its tasks, artifacts and `serve()` (imports prefect)
* `drift_loop` — the Prefect flow `asp-drift-loop`: launch -> drift -> re-profile -> resume (imports prefect)

`asp repro` = `run_pipeline`; `asp serve` = `flow.serve` (both flows); `flows/pipeline.py` only re-exports the flow.
"""
