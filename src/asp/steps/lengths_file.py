"""The lengths file of ``profile.source: file``, checked up front: present, and committed where a run needs it.

A run with ``--set`` or a preset (`asp repro --set ...`, a Prefect run with overrides) is a DVC experiment that runs in
a temporary copy of the repository (``.dvc/tmp/exps``), which holds the committed files only: a lengths file that is
not tracked by git (or by DVC: a ``.dvc`` pointer beside it or above it) is missing there, and DVC's own message
names only the temporary folder. So `check_lengths_file` refuses a missing ``profile.lengths.path`` always and an
uncommitted one for such a run, and returns a note for a plain run (which reads the work tree). `asp params check`
and `asp.orchestration.request.check_request` (every door of a pipeline run) call it.

    note = check_lengths_file(params, root=".", experiment=bool(preset or overrides))   # UserError, or a note / None
"""

from __future__ import annotations

from pathlib import Path

from asp.config import Params
from asp.errors import UserError
from asp.io.lengths import rollout_files
from asp.vcs import git


def check_lengths_file(params: Params, root: str | Path = ".", experiment: bool = False) -> str | None:
    """Check ``profile.lengths.path`` when ``profile.source`` is ``file`` (see the module docstring).

    Args:
        params: the run's params.
        root: the repository root (``profile.lengths.path`` is relative to it).
        experiment: the run is a DVC experiment (``--set`` / a preset), which reads committed files only.

    Returns:
        A note for a plain run about files it reads that are not committed, else None.

    Raises:
        UserError: the path is missing or holds no rollout files; or, for an experiment, a file is not committed.
    """
    if params.profile.source != "file":
        return None
    spec = params.profile.lengths.path
    path = Path(root) / spec
    if not path.exists():
        raise UserError(
            f"profile.lengths.path = {spec!r}: not found (profile.source: file reads the rollouts there). Put the "
            "file (or a folder of them) in the repository, commit it (`git add`, or `dvc add` for a large file, then "
            "commit the .dvc file), or set profile.source: generate."
        )

    files = rollout_files(path)  # UserError: an empty folder, an unsupported type
    loose = uncommitted(files, Path(root))
    if not loose:
        return None
    named = ", ".join(str(f.relative_to(root)) for f in loose[:3]) + (", ..." if len(loose) > 3 else "")
    why = (
        f"profile.lengths.path = {spec!r}: {named} {'is' if len(loose) == 1 else 'are'} not committed, and a run "
        "with --set or a preset (a DVC experiment in a temporary copy of the repository) reads committed files "
        f"only. Commit {'it' if len(loose) == 1 else 'them'}: `git add {spec} && git commit`, or for large files "
        f"`dvc add {spec}` and commit {spec}.dvc."
    )
    if experiment:
        raise UserError(why)
    return f"note: {why} (A plain `dvc repro` / `asp repro` reads the work tree and is fine.)"


def uncommitted(files: list[Path], root: Path) -> list[Path]:
    """The `files` that neither git tracks nor a DVC pointer (``X.dvc`` for the file or a folder above it) covers;
    [] outside a git repository (nothing to compare with)."""
    if not git("rev-parse", "--is-inside-work-tree", cwd=root):
        return []
    rel = [str(f.relative_to(root)) for f in files]
    tracked = set(git("ls-files", "--", *rel, cwd=root).splitlines())
    return [f for f, r in zip(files, rel, strict=True) if r not in tracked and not _dvc_pointer(f, root)]


def _dvc_pointer(path: Path, root: Path) -> bool:
    """Whether ``<path or a folder above it, inside root>.dvc`` exists (the file is tracked by `dvc add`)."""
    root = root.resolve()
    current = path.resolve()
    while current != root and root in current.parents:
        if current.with_name(current.name + ".dvc").is_file():
            return True
        current = current.parent
    return False
