"""The pipeline's stages, one module per dvc.yaml stage: `run(params, paths, tracker)` = load, compute, save, log.

Each stage module's `Paths` is its class in `asp.steps.paths` (the one table of stage inputs and outputs, whose
defaults are the repository-relative paths `dvc.yaml` lists; `asp.steps.paths.rebase` moves them under another
root). Stage modules never import each other; what several of them do lives once in `asp.steps`, and drift
watching and re-profiling (which launch uses) in `asp.adaptation`. The list and order of stages is `dvc.yaml`
(see `asp.stage.stage_names`).
"""
