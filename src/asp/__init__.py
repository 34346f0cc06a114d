"""asp: the Adaptive Scheduling Pipeline, length-aware rollout scheduling and asynchronous RL post-training.

Run it with the `asp` command (`asp --help`; `asp repro` runs the DVC pipeline) or `dvc repro`; use the libraries
by importing their packages (`asp.schedule`, `asp.predictor`, `asp.rl`, `asp.runtime`, ...), each of whose
`__init__` says what it holds and how to use it. The layers and what may import what: CONTRIBUTING.md "Layout" and
pyproject.toml's import-linter contracts. Importing `asp` itself loads nothing.
"""
