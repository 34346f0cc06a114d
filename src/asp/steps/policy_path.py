"""``policy.path`` (``policy.source: path``) checked up front: a directory on this machine with a ``config.json``.

The policy stage records the local checkpoint (its content hash) and refuses a path that is not one, but only once
DVC has started it. `check_policy_path` says the same before anything runs: `asp.orchestration.request.check_request`
(every door of a pipeline run) refuses it when the run includes the policy stage; `asp params check` prints it as a
note, since a preset's path (configs/gpu-cluster.yaml's placeholder) may name a checkpoint of another machine.

    note = check_policy_path(params, root=".", runs_policy=True)   # UserError, or a note / None
"""

from __future__ import annotations

from pathlib import Path

from asp.config import Params
from asp.errors import UserError


def check_policy_path(params: Params, root: str | Path = ".", runs_policy: bool = False) -> str | None:
    """Check ``policy.path`` when ``policy.source`` is ``path``.

    Args:
        params: the run's params.
        root: the repository root (a relative ``policy.path`` is relative to it, where the stages run).
        runs_policy: the run includes the policy stage, which reads the path.

    Returns:
        A note when the path is not a checkpoint here and the policy stage does not run, else None.

    Raises:
        UserError: the path is not a checkpoint directory here and the policy stage runs.
    """
    policy = params.policy
    if policy.source != "path" or not policy.path:
        return None
    path = Path(root) / Path(policy.path).expanduser()
    if not path.is_dir():
        problem = "no such directory on this machine"
    elif not (path / "config.json").is_file():
        problem = "no config.json there, so it is not a Hugging Face checkpoint directory"
    else:
        return None
    why = (
        f"policy.path = {policy.path!r}: {problem}. The policy stage records a local checkpoint (nothing is "
        "downloaded): set policy.path to your checkpoint's directory, or policy.source: build for the demo policy."
    )
    if runs_policy:
        raise UserError(why)
    return f"note: {why} (`asp repro` refuses it before the policy stage runs.)"
