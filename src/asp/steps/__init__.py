"""Shared steps: what several pipeline stages and re-profiling (`asp.adaptation`) do, each written once.

* `paths`: every stage's inputs and outputs, the one table (dvc.yaml agrees with it, tests/steps/test_paths.py);
* `loaders`: read earlier stages' outputs (policy checkpoint and tokenizer, profiled lengths, trained predictor,
  calibration map);
* `engine`: build the generation engine from params (profile, re-profile, the launch's actors);
* `checkpoint`: save / load a trained predictor (adapter + head + tokenizer, safetensors; train_predictor,
  re-profile, the loaders);
* `fit`: fit a predictor, its training arguments from params (train_predictor, re-profile);
* `scheduling`: schedule these predictions from the ``schedule:`` params (schedule, simulate, launch,
  re-profile) and the launch's work plan;
* `launch_state`: the launch's state directory and what a checkpoint must match (launch, re-profile);
* `memory_check`, `layout_check`: does the run fit its devices (launch, ``asp params check``, ``asp plan``).
* `launch_check`: the metrics the simulator is checked on against a launch and their errors (``asp simulate``,
  sim_check).

Stage modules (`asp.pipeline`) and `asp.adaptation` import these; nothing here imports either.
Tests: `.venv/bin/python -m pytest tests/steps -q`.
"""
