"""The `asp` command.

    asp repro [STAGE...] [--set K=V]   stages through DVC under one MLflow parent run (what `make run` calls)
    asp stage NAME              run one pipeline stage (what dvc.yaml calls; stages/NAME.py)
    asp params check            validate params.yaml (optionally a preset, --set), check it fits in memory
    asp params migrate [FILE...]   rewrite params files / presets that use moved keys (comments kept)
    asp preset list|apply NAME  list presets in configs/ or write one over params.yaml
    asp init --model DIR --gpus-per-node N --nodes N   a preset for your setup (configs/my-cluster.yaml)
    asp schedule build|ablation|sweep   schedule a lengths/predictions file without the pipeline
    asp heldout-reward [--weights F]    demo reward of the policy (or trained weights) on new problems
    asp reprofile [--state-dir D]       re-profile a stopped launch run and re-schedule its remaining prompts
    asp simulate [-c C4] [--set K=V]    the launch run predicted on a simulated clock (src/asp/cli/simulate.py)
    asp plan layout [--devices N]       GUs, actors, TU devices, q_max, b, k for a cluster (B.6 + simulated search)
    asp plan memory [-c PRESET]         does it fit? GiB per trainer rank and per vLLM GPU (docs/memory.md)
    asp serve                   serve the Prefect flows asp-pipeline and asp-drift-loop (run them from the UI)
    asp ui mlflow|prefect       MLflow / Prefect UI on 127.0.0.1, printing the URL to open (src/asp/cli/ui.py)

Exit codes: 0 done; 2 a user or usage error (one message, no traceback); 1 a run that cannot go on (one message,
e.g. launch after losing a node); 130 Ctrl-C, 143 SIGTERM (MLflow runs end KILLED); a failed sub-process (`dvc
repro`, a server) passes its own code on. Heavy libraries (pydantic models, numpy, torch, mlflow, prefect, dvc) are
imported inside the commands, so `asp --help` starts fast.

The app and its top-level commands are in `asp.cli.commands`, the command groups in the sibling modules; the
console script `asp` is `asp.cli:main`.
"""

from asp.cli.commands import app, main

__all__ = ["app", "main"]
