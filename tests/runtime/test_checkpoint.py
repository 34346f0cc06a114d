"""Runtime checkpoint file: atomic JSON, resumed only for the same plan and an unfinished run; a damaged trainer
checkpoint makes the run resume from the newest position whose trainer checkpoint is intact (both from one step)."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from asp.errors import UserError
from asp.runtime import Checkpointer
from asp.runtime.checkpoint import KEEP_POSITIONS, checkpoint_problem, write_manifest


def save(ck: Checkpointer, finished: bool) -> None:
    ck.save(
        database={"epochs_created": 1, "consumed": {"0": 2}},
        trainer_step=3,
        policy_version=3,
        trainer_state={"version": 3},
        finished=finished,
    )


def test_roundtrip_and_when_not_to_resume(tmp_path):
    ck = Checkpointer(tmp_path, "plan-a")
    assert ck.load() == (None, "no checkpoint")
    save(ck, finished=False)
    state, reason = ck.load()
    assert reason == "resumed" and state["trainer_step"] == 3 and state["database"]["consumed"] == {"0": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["runtime_state.json"]  # no temporary files left behind
    assert Checkpointer(tmp_path, "plan-b").load() == (None, "checkpoint of a different plan")
    save(ck, finished=True)
    assert ck.load() == (None, "previous run finished")


def test_unreadable_checkpoint_names_the_file(tmp_path):
    (tmp_path / "runtime_state.json").write_text("{not json")
    with pytest.raises(UserError, match=r"runtime_state.json cannot be read .* delete it"):
        Checkpointer(tmp_path, "x").load()


# ---- damaged trainer checkpoints: resume from the newest position whose trainer checkpoint is intact ---------
def trainer_dir(root, step: int):
    """A trainer checkpoint directory as the GRPO trainer writes it: safetensors files, then the manifest."""
    from safetensors.numpy import save_file

    path = root / "trainer" / f"step-{step:08d}"
    path.mkdir(parents=True)
    save_file({"w": np.full((64, 64), step, np.float32)}, str(path / "model.safetensors"))
    (path / "trainer.json").write_text(json.dumps({"step": step}))
    write_manifest(path)
    return path


def save_step(ck: Checkpointer, root, step: int) -> None:
    ck.save(
        database={"epochs_created": 1, "consumed": {str(t): 4 for t in range(step)}},
        trainer_step=step,
        policy_version=step,
        trainer_state={"version": step, "step": step, "checkpoint": str(trainer_dir(root, step))},
        finished=False,
    )


def truncate(path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_checkpoint_problem_names_the_damaged_file(tmp_path):
    path = trainer_dir(tmp_path, 1)
    assert checkpoint_problem(path) is None
    model = path / "model.safetensors"
    data = model.read_bytes()
    model.write_bytes(data[:-10])  # a cut in the tensor data
    size = len(data)
    assert checkpoint_problem(path) == (f"{model} is {size - 10:,} bytes, manifest.json records {size:,} (truncated?)")
    (path / "manifest.json").unlink()  # an old checkpoint without manifest: the safetensors header still tells
    assert (
        checkpoint_problem(path)
        == f"{model} holds 16,374 bytes of tensor data but its header describes 16,384 (truncated?)"
    )
    truncate(model, 20)  # a cut inside the header
    assert "its header alone claims" in checkpoint_problem(path)
    model.write_bytes(data[:8] + b"{" * (len(data) - 8))  # garbage header of the right size
    assert "unreadable header" in checkpoint_problem(path)
    assert checkpoint_problem(tmp_path / "gone") == f"{tmp_path / 'gone'} is missing"


def test_damaged_trainer_checkpoint_resumes_from_the_previous_position(tmp_path, caplog):
    ck = Checkpointer(tmp_path, "plan")
    for step in (2, 4):
        save_step(ck, tmp_path, step)
    truncate(tmp_path / "trainer" / "step-00000004" / "model.safetensors")

    again = Checkpointer(tmp_path, "plan")
    with caplog.at_level(logging.WARNING, logger="asp.runtime.checkpoint"):
        state, reason = again.load()
    # runtime position and trainer checkpoint of the SAME older step: database, version, trainer state of step 2
    assert state["trainer_step"] == 2 and state["policy_version"] == 2
    assert state["database"]["consumed"] == {"0": 4, "1": 4}
    assert state["trainer_state"]["checkpoint"].endswith("step-00000002")
    assert reason.startswith("resumed from step 2: the trainer checkpoint of step 4 is damaged (step 4: ")
    assert "step-00000004/model.safetensors is 100 bytes" in reason
    assert "Resuming from step 2, the newest position whose trainer checkpoint is intact" in caplog.text
    assert "steps 3-4 are trained again" in caplog.text

    save_step(again, tmp_path / "retry", 3)  # the re-run writes step 3: the abandoned step 4 is gone from the chain
    saved = json.loads((tmp_path / "runtime_state.json").read_text())
    assert saved["trainer_step"] == 3 and [p["trainer_step"] for p in saved["earlier"]] == [2]


def test_no_intact_trainer_checkpoint_is_an_error_naming_the_files(tmp_path):
    ck = Checkpointer(tmp_path, "plan")
    for step in (1, 2):
        save_step(ck, tmp_path, step)
    truncate(tmp_path / "trainer" / "step-00000002" / "model.safetensors")
    shutil.rmtree(tmp_path / "trainer" / "step-00000001")
    with pytest.raises(
        UserError,
        match=r"none of the trainer checkpoints it names is intact \(step 2: .*step-00000002"
        r"/model.safetensors is 100 bytes.*; step 1: .*step-00000001 is missing\)\. Restore them "
        r"from a backup, or delete .* to start the run afresh",
    ):
        Checkpointer(tmp_path, "plan").load()


def test_the_chain_of_positions_is_bounded(tmp_path):
    ck = Checkpointer(tmp_path, "plan")
    for step in range(1, KEEP_POSITIONS + 3):
        save_step(ck, tmp_path, step)
    saved = json.loads((tmp_path / "runtime_state.json").read_text())
    newest = KEEP_POSITIONS + 2
    assert [p["trainer_step"] for p in saved["earlier"]] == list(range(newest - 1, newest - KEEP_POSITIONS, -1))
    state, reason = Checkpointer(tmp_path, "plan").load()  # a position without trainer checkpoint is fine too
    assert reason == "resumed" and state["trainer_step"] == newest
