"""Every stage's inputs and outputs: the one table of the pipeline's file paths.

One frozen dataclass per dvc.yaml stage; each field's default is a repository-relative path made by `dep` (an input:
in the stage's ``deps``, itself or a directory holding it; `reads` names the files of an input directory that the
stage reads, each of them listed), `output` (in ``outs``, ``metrics`` or ``plots``) or `untracked` (written by the
stage but not declared to DVC: scratch space, an optional plot). `STAGE_PATHS` maps each stage name to its class; a
stage module's ``Paths`` is its class here, `asp stage NAME` runs it with the defaults and tests move every path
under a temporary directory with `rebase`. tests/steps/test_paths.py checks dvc.yaml's deps and outs against this
table, so the two cannot drift apart.

The re-profiling path (`asp.adaptation`) reads the launch stage's inputs, so it takes `LaunchPaths`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

P = TypeVar("P")
ROLE = "role"  # the field metadata key: "dep", "out" or "untracked"
READS = "reads"  # dep metadata: the files of a dependency directory the stage reads


def dep(path: str, reads: tuple[str, ...] = ()) -> Any:
    """An input of the stage (in dvc.yaml ``deps``; with `reads`, the files of directory `path` listed there)."""
    return dataclasses.field(default=Path(path), metadata={ROLE: "dep", READS: reads})


def output(path: str) -> Any:
    """An output of the stage (in dvc.yaml ``outs``, ``metrics`` or ``plots``)."""
    return dataclasses.field(default=Path(path), metadata={ROLE: "out"})


def untracked(path: str) -> Any:
    """A path the stage writes that dvc.yaml does not declare (scratch space, an optional plot)."""
    return dataclasses.field(default=Path(path), metadata={ROLE: "untracked"})


@dataclass(frozen=True)
class PolicyPaths:
    out_dir: Path = output("outputs/policy")
    metrics: Path = output("metrics/policy.json")


@dataclass(frozen=True)
class PreparePaths:
    policy: Path = dep("outputs/policy")
    out_dir: Path = output("outputs/prompts")
    metrics: Path = output("metrics/prepare.json")


@dataclass(frozen=True)
class ProfilePaths:
    policy: Path = dep("outputs/policy")
    # train.parquet: profile.source: file matches the user's records against every prepared prompt
    prompts: Path = dep("outputs/prompts", reads=("profile.parquet", "heldout.parquet", "train.parquet"))
    out_dir: Path = output("outputs/profile")
    work_dir: Path = untracked("outputs/.work/profile")  # resumable chunks, removed after success
    metrics: Path = output("metrics/profile.json")
    timings: Path = output("metrics/profile_timings.csv")
    plot: Path = output("plots/profile_lengths.png")


@dataclass(frozen=True)
class TrainPredictorPaths:
    prompts: Path = dep("outputs/prompts", reads=("profile.parquet",))
    profile: Path = dep("outputs/profile", reads=("prompts.parquet",))
    out_dir: Path = output("outputs/predictor")
    metrics: Path = output("metrics/train_predictor.json")
    plot: Path = output("plots/predictor_curves.png")


@dataclass(frozen=True)
class EvaluatePaths:
    prompts: Path = dep("outputs/prompts", reads=("heldout.parquet",))
    profile: Path = dep("outputs/profile", reads=("prompts.parquet", "samples.parquet"))
    predictor: Path = dep("outputs/predictor")
    calibration: Path = output("outputs/calibration.json")
    metrics: Path = output("metrics/predictor.json")
    plot: Path = output("plots/predictor_scatter.png")


@dataclass(frozen=True)
class PredictPaths:
    prompts: Path = dep("outputs/prompts/train.parquet")
    predictor: Path = dep("outputs/predictor")
    calibration: Path = dep("outputs/calibration.json")
    out: Path = output("outputs/predictions.parquet")
    metrics: Path = output("metrics/predict.json")


@dataclass(frozen=True)
class SchedulePaths:
    predictions: Path = dep("outputs/predictions.parquet")
    calibration: Path = dep("outputs/calibration.json")
    profile: Path = dep("outputs/profile/prompts.parquet")
    heldout: Path = dep("outputs/prompts/heldout.parquet")
    out_dir: Path = output("outputs/schedule")
    metrics: Path = output("metrics/schedule.json")
    plot: Path = output("plots/schedule_loads.png")
    ablation_csv: Path = output("plots/schedule_ablation.csv")


@dataclass(frozen=True)
class SimulatePaths:
    predictions: Path = dep("outputs/predictions.parquet")
    calibration: Path = dep("outputs/calibration.json")
    samples: Path = dep("outputs/profile/samples.parquet")
    heldout: Path = dep("outputs/prompts/heldout.parquet")
    timings: Path = dep("metrics/profile_timings.csv")
    schedule: Path = dep("outputs/schedule/schedule.parquet")
    sharing_probe: Path = dep("metrics/sharing_probe.json")  # simulate.sharing: measured (asp simulate probe-sharing)
    trainer_alone: Path = dep("metrics/trainer_alone.json")  # the trainer's step alone in this sitting
    out_dir: Path = output("outputs/simulate")
    metrics: Path = output("metrics/simulate.json")
    plot: Path = output("plots/simulate_timeline.png")


@dataclass(frozen=True)
class TrainerAlonePaths:
    """The GRPO trainer's step timed alone in the pipeline's sitting (`asp.pipeline.trainer_alone`)."""

    policy: Path = dep("outputs/policy")
    prompts: Path = dep("outputs/prompts/profile.parquet")  # the batch: the first global batch of profile prompts
    # not read: a re-timed profile re-times the step (the simulate stage's two full speeds are of one sitting)
    profile_timings: Path = dep("metrics/profile_timings.csv")
    metrics: Path = output("metrics/trainer_alone.json")


@dataclass(frozen=True)
class LaunchPaths:
    """The launch stage's paths, also what re-profiling (`asp.adaptation.reprofile`) reads."""

    policy: Path = dep("outputs/policy")
    prompts: Path = dep("outputs/prompts/train.parquet")
    schedule: Path = dep("outputs/schedule/schedule.parquet")
    predictions: Path = dep("outputs/predictions.parquet")
    calibration: Path = dep("outputs/calibration.json")
    predictor: Path = dep("outputs/predictor")  # re-profiling fine-tunes it (version 1)
    predictor_metrics: Path = dep("metrics/predictor.json")  # drift: the reference Kendall tau
    out_dir: Path = output("outputs/launch")
    state_dir: Path = output("outputs/launch_state")
    metrics: Path = output("metrics/launch.json")
    plot: Path = output("plots/launch_timeline.png")
    curve_plot: Path = output("plots/learning_curve.png")
    drift_plot: Path = untracked("plots/launch_drift.png")  # drawn only with drift.enabled


@dataclass(frozen=True)
class SimCheckPaths:
    """The simulate stage's prediction and the launch's measurement, compared (`asp.pipeline.sim_check`)."""

    simulate_metrics: Path = dep("metrics/simulate.json")
    launch_metrics: Path = dep("metrics/launch.json")
    sharing_probe: Path = dep("metrics/sharing_probe.json")  # the day it was timed, named beside a large error
    metrics: Path = output("metrics/sim_check.json")


STAGE_PATHS: dict[str, type] = {
    "policy": PolicyPaths,
    "prepare": PreparePaths,
    "profile": ProfilePaths,
    "train_predictor": TrainPredictorPaths,
    "evaluate": EvaluatePaths,
    "predict": PredictPaths,
    "schedule": SchedulePaths,
    "trainer_alone": TrainerAlonePaths,
    "simulate": SimulatePaths,
    "launch": LaunchPaths,
    "sim_check": SimCheckPaths,
}


def rebase(paths: P, root: str | Path) -> P:
    """A copy of a stage's paths with every relative path placed under `root` (absolute ones kept)."""
    root = Path(root)
    moved = {
        f.name: root / value
        for f in dataclasses.fields(paths)  # type: ignore[arg-type]
        if isinstance(value := getattr(paths, f.name), Path) and not value.is_absolute()
    }
    return dataclasses.replace(paths, **moved)  # type: ignore[type-var]


def declared(paths_class: type, role: str) -> dict[str, Path]:
    """Field name -> default path of every field of `role` ("dep", "out" or "untracked") in a paths class."""
    return {f.name: _default(f) for f in dataclasses.fields(paths_class) if f.metadata.get(ROLE) == role}


def dep_files(paths_class: type) -> list[Path]:
    """The input paths as dvc.yaml lists them: a dependency directory with `reads` as the files it names."""
    files = []
    for f in dataclasses.fields(paths_class):
        if f.metadata.get(ROLE) == "dep":
            reads = f.metadata.get(READS) or ()
            files += [_default(f) / name for name in reads] if reads else [_default(f)]
    return files


def _default(f: dataclasses.Field[Any]) -> Path:
    """A path field's default (`dep`, `output` and `untracked` give every field a Path)."""
    return cast(Path, f.default)
