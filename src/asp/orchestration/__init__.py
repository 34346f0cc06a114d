"""The one orchestration layer behind `asp repro` and the Prefect flow: every stage runs THROUGH DVC.

* `request`  — what a run is asked to do (stages, preset, overrides), validated before anything runs
* `dvc`      — DVC command lines, streaming their output, timeouts, clean stops, what DVC did per stage
* `pipeline` — `PipelineRun` (one MLflow parent run; `run_stage` / `run_experiment`) and `run_pipeline`
* `flow`     — the Prefect flow, its tasks, artifacts and `serve()` (imports prefect; nothing else here does)

`asp repro` = `run_pipeline`; `asp serve` = `flow.serve`; `flows/pipeline.py` only re-exports the flow.
"""
