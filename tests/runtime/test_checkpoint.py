"""Runtime checkpoint file: atomic JSON, resumed only for the same plan and an unfinished run."""

from __future__ import annotations

import pytest

from asp.errors import UserError
from asp.runtime import Checkpointer


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
