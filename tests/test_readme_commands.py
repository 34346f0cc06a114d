"""Every command line the README shows (the lines of its ```bash blocks that start with asp, make, dvc or python)
works as written, so documented commands and flags cannot drift from the code.

Each line is checked the cheap way: `--help` (`make -n -B` for make) must exit 0 and list every flag the line
uses; named stages and `-S key=value` params must exist. Lines that are quick and safe are also run as written
(in a copy of the repo's params and presets when they write files); the slow ones (schedule ablation / sweep /
build) run as written in tests marked slow. Servers, the GPU preset and the full pipeline are only checked
through their help. `asp` runs in-process through its console entry point, the others as sub-processes.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("asp", "make", "dvc", "python")


def readme_commands(readme: Path = ROOT / "README.md") -> list[str]:
    """The commands of the README's ```bash blocks that start with one of PROGRAMS (comments dropped; a line
    `a && b` gives each part that qualifies)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", readme.read_text(), flags=re.M | re.S)
    commands = []
    for line in "\n".join(blocks).splitlines():
        for part in re.sub(r"\s#.*$", "", line).split("&&"):
            if part.split()[:1] and part.split()[0] in PROGRAMS:
                commands.append(" ".join(part.split()))
    return list(dict.fromkeys(commands))


COMMANDS = readme_commands()


def _asp_command_path(args: list[str]) -> list[str]:
    """The leading words of `args` that name (sub)commands of `asp`, e.g. ['schedule', 'build']."""
    import typer

    from asp.cli import app

    command, path = typer.main.get_command(app), []
    for word in args:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            break
        command, path = sub, [*path, word]
    return path


def _flags(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("-") and a != "-"]


def _help(words: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Exit code and text of the help of the command a README line names (make: its dry run)."""
    program, args = words[0], words[1:]
    if program == "asp":
        capsys.readouterr()
        code = _asp_exit(*_asp_command_path(args), "--help")
        return code, capsys.readouterr().out
    if program == "make":
        cmd = ["make", "-n", "-B", *args]  # what it would run, without running it
    elif program == "dvc":
        cmd = [sys.executable, "-m", "dvc", *[a for a in args if not a.startswith("-")][:2], "--help"]
    else:  # python script.py ... | python -m module ...
        cmd = [sys.executable, *args[: 2 if args[0] == "-m" else 1], "--help"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def _asp_exit(*args: str) -> int:
    from asp.cli import main

    try:
        main(list(args))
    except SystemExit as exc:
        return exc.code
    raise AssertionError("asp.cli.main must end with SystemExit")


def test_the_readme_shows_commands() -> None:
    programs = {c.split()[0] for c in COMMANDS}
    assert programs == set(PROGRAMS) and len(COMMANDS) >= 15, COMMANDS


@pytest.mark.parametrize("line", COMMANDS)
def test_documented_command_and_flags_exist(
    line: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    words = shlex.split(line)
    code, text = _help(words, capsys)
    assert code == 0, f"{line}: help exited {code}\n{text[-3000:]}"
    for flag in _flags(words[1:]):
        if words[0] != "make":
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{line}: {flag} is not in its help"
    for word in words[1:]:
        if words[0] == "make" and "=" in word:  # make variables the Makefile uses: their values reach the recipe
            value = word.split("=", 1)[1]
            assert value in text, f"{line}: {word} does not reach make's recipe:\n{text}"
    if words[:3] == ["python", "-m", "flows.pipeline"]:  # the stages it names are the registered ones
        from asp.stage import stage_names

        named = [w for w in words[3:] if not w.startswith("-") and "=" not in w]
        assert set(named) <= set(stage_names()) and all(s in text for s in named)
    if words[:3] == ["dvc", "exp", "run"]:  # -S KEY=VALUE names a real parameter
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        for key in (words[i + 1].split("=")[0] for i, w in enumerate(words) if w == "-S"):
            section, name = key.split(".", 1)
            assert name in params[section], f"{line}: {key} is not in params.yaml"


QUICK = ["asp preset list", "asp params check --preset gpu-cluster", "asp preset apply gpu-cluster"]


@pytest.mark.parametrize("line", QUICK)
def test_quick_commands_run_as_written(
    line: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")  # apply writes params.yaml: a copy
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    assert _asp_exit(*shlex.split(line)[1:]) == 0
    out = capsys.readouterr().out
    assert {"asp preset list": "gpu-cluster", "asp params check --preset gpu-cluster": "OK"}.get(line, "") in out
    if line == "asp preset apply gpu-cluster":
        from asp.config import load_params

        assert load_params(tmp_path / "params.yaml").profile.engine.kind == "vllm"


SLOW = {  # the README's scheduler lines, run as written
    "asp schedule build lengths.parquet --b 32 --kappa 2 --k 6 --out schedule.parquet": "wrote schedule.parquet",
    "asp schedule ablation --synthetic 39000 --tau 0.64": "C4",
    "asp schedule sweep --synthetic 39000": "Table 10 analogue",
}


def test_lines_run_as_written_are_the_readmes() -> None:
    missing = [line for line in [*QUICK, *SLOW] if line not in COMMANDS]
    assert not missing, f"the README no longer shows {missing}; update QUICK / SLOW"


@pytest.mark.slow
@pytest.mark.parametrize("line", list(SLOW))
def test_schedule_commands_run_as_written(
    line: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    from asp.schedule import synthetic_lengths

    monkeypatch.chdir(tmp_path)
    lengths = synthetic_lengths(2000, 0)  # the user's file of predicted lengths
    pd.DataFrame({"prompt_id": [f"p{i}" for i in range(2000)], "predicted_length": lengths}).to_parquet(
        "lengths.parquet", index=False
    )
    code = _asp_exit(*shlex.split(line)[1:])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert SLOW[line] in captured.out
