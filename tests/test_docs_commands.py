"""The commands README.md and docs/*.md show name things that exist, and their results tables say which command made
them (issue 36). Static and quick: nothing is run (tests/test_readme_commands.py runs the README's own commands).

Commands are the lines of fenced shell blocks (```bash / sh / shell / console: every line; an unlabeled block: the
lines that start with a program below or `$ `) and the inline code spans of the prose that start with one. In each:
`make X` names Makefile targets, `asp X [Y]` an `asp` command (and a subcommand of a group), `python path.py` /
`.venv/bin/python path.py` a file, `python -m module` an importable module, any benchmarks/ scripts/ stages/
configs/ flows/ tests/ src/ docs/ path a file or folder, and `--preset NAME` (or `asp preset apply NAME`) a
configs/NAME.yaml or a preset the same page writes with `asp init`. A results table (a markdown table with a
measured number in a data cell past the first column: a decimal, a number with a unit or percent, or "a / b") of
any page (README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md) has the command that produced it within a few lines
before or after it (or in it): a code span or block naming a benchmark, script, `asp`, `make`, `dvc` or `python`
command, or a `tests/...` file (a table of behaviours names the tests that check them). Two readings keep that
honest without repeating a command: a table printed inside a fenced console block (``$ asp plan memory ...``) has
the block's command, and a table that follows another with only blank lines between (one command prints both) has
the first one's.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("asp", "make", "python", "python3", ".venv/bin/python", ".venv/bin/asp", "dvc", "uv")
SHELL = ("bash", "sh", "shell", "console")
PATH = re.compile(r"^(?:\./)?((?:benchmarks|scripts|stages|configs|flows|tests|src|docs)/[\w./-]*\w)")
NEAR = 6  # lines before / after a table where its command may be
COMMAND = re.compile(r"`[^`\n]*(?:\basp |\bmake |\bpython3? |\bdvc |benchmarks/\w|scripts/\w|tests/\w)[^`\n]*`")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+|\s*(?:%|×|x\b|s\b|ms\b|min\b|h\b|GiB|MB|tok/s))|\b\d+ / \d+\b")


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{_rel(self.doc)}:{self.line}: {self.text}"


def _rel(doc: Path) -> Path:
    return doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc


def commands(doc: Path) -> list[Command]:
    """The shell commands of `doc` (see the module docstring), one per simple command (split at &&, ||, ;, |)."""
    lines = doc.read_text().splitlines()
    found: list[Command] = []
    fence: str | None = None
    pending = ""
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:].strip().lower()
            continue
        if fence is None:
            for span in re.findall(r"`([^`\n]+)`", line):
                if span.split()[0] in PROGRAMS and len(span.split()) > 1:
                    found += _split(doc, number, span)
            continue
        if fence not in SHELL and fence != "":
            continue
        text = pending + line.strip()
        pending = ""
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        text = re.sub(r"(^|\s)#.*$", "", text).strip()
        if text.startswith("$ "):
            text = text[2:]
        elif fence == "" and (not text.split() or text.split()[0] not in PROGRAMS):
            continue
        if text:
            found += _split(doc, number, text)
    return found


def _split(doc: Path, line: int, text: str) -> list[Command]:
    """`text` cut at &&, ||, ;, | and & outside quotes (a quoted `bash -c "a && b"` stays one command)."""
    lexer = shlex.shlex(text, posix=False, punctuation_chars="&|;")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote (prose in a code span): cut anywhere
        tokens = re.split(r"\s+|(&&|\|\||;|\|)", text)
    parts, words = [], []
    for token in [t for t in tokens if t]:
        if set(token) <= set("&|;"):
            parts.append(" ".join(words))
            words = []
        else:
            words.append(token)
    parts.append(" ".join(words))
    return [Command(doc, line, part.strip()) for part in parts if part.strip()]


def _words(text: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # FOO=bar cmd
        words = words[1:]
    return words


def _placeholder(word: str) -> bool:
    return any(mark in word for mark in ("<", ">", "…", "...", "*", "{", "$", "[")) or word == "-"


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for match in re.finditer(r"^([A-Za-z0-9_.%-]+(?:[ \t]+[A-Za-z0-9_.%-]+)*)[ \t]*:(?!=)", text, flags=re.M):
        targets.update(match.group(1).split())
    return frozenset(targets)


@cache
def asp_tree() -> dict[str, frozenset[str] | None]:
    """`asp`'s commands: a group -> its subcommands, a command -> None."""
    import typer

    from asp.cli import app

    root = typer.main.get_command(app)
    tree: dict[str, frozenset[str] | None] = {}
    for name, command in getattr(root, "commands", {}).items():
        subs = getattr(command, "commands", None)
        tree[name] = frozenset(subs) if subs else None
    return tree


def presets_made(doc: Path) -> set[str]:
    """The presets `doc`'s commands write with `asp init` (--name NAME, by default my-cluster)."""
    made = set()
    for command in commands(doc):
        words = _words(command.text)
        if words[:2] in (["asp", "init"], [".venv/bin/asp", "init"]):
            made.add(words[words.index("--name") + 1] if "--name" in words[:-1] else "my-cluster")
    return made


def _preset(name: str, made: set[str] | frozenset[str]) -> bool:
    return _placeholder(name) or name in made or (ROOT / "configs" / f"{name}.yaml").is_file()


def problems(command: Command, made: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """What `command` names that does not exist (empty: all of it does); `made`: presets the doc writes first."""
    words = _words(command.text)
    if not words:
        return []
    program, args = words[0], words[1:]
    out = []
    if program in ("asp", ".venv/bin/asp"):
        path = args[: 2 if args[1:2] and not args[1].startswith("-") else 1] if args[:1] != ["--help"] else []
        path = [a for a in path if not a.startswith("-")]
        tree = asp_tree()
        if path and not _placeholder(path[0]):
            if path[0] not in tree:
                out.append(f"`asp {path[0]}`: no such asp command (asp has {', '.join(sorted(tree))})")
            elif tree[path[0]] and len(path) > 1 and not _placeholder(path[1]) and path[1] not in tree[path[0]]:  # type: ignore[operator]
                subs = ", ".join(sorted(tree[path[0]] or []))
                out.append(f"`asp {path[0]} {path[1]}`: no such subcommand (asp {path[0]} has {subs})")
    elif program == "make":
        for target in args:
            named = not target.startswith("-") and "=" not in target and not _placeholder(target)
            if named and target not in make_targets():
                out.append(f"`make {target}`: no such Makefile target")
    elif program in ("python", "python3", ".venv/bin/python"):
        if args[:1] == ["-m"] and len(args) > 1:
            module = args[1]
            top = module if module.startswith("asp.") else module.split(".")[0]
            if not _placeholder(module) and importlib.util.find_spec(top) is None:
                out.append(f"`python -m {module}`: no such module")
        elif args and args[0].endswith(".py") and not _placeholder(args[0]) and not (ROOT / args[0]).exists():
            out.append(f"`{args[0]}`: no such file")
    for i, word in enumerate(words):
        if word.startswith("--preset"):
            name = word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
            if name and not _preset(name, made):
                out.append(f"`--preset {name}`: no configs/{name}.yaml")
        if (
            program in ("asp", ".venv/bin/asp")
            and words[1:3] == ["preset", "apply"]
            and i == 3
            and not _preset(word, made)
        ):
            out.append(f"`asp preset apply {word}`: no configs/{word}.yaml")
        found = PATH.match(word.split("::")[0].split("=")[-1])
        if found and not _placeholder(word) and not (ROOT / found.group(1)).exists():
            out.append(f"`{found.group(1)}`: no such file or folder")
    return out


ALL = [c for doc in DOCS for c in commands(doc)]


def test_the_docs_show_commands() -> None:
    """The parser finds the commands (a parser that finds none would pass everything)."""
    programs = {_words(c.text)[0] for c in ALL if _words(c.text)}
    assert len(ALL) > 150 and {"asp", "make", ".venv/bin/python"} <= programs, programs


SHOWN_FAILING = {("docs/reliability.md", "asp schedule frobnicate")}  # the docs show what such a command prints


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_command_names_what_exists(doc: Path) -> None:
    made = presets_made(doc)
    shown = [c for c in ALL if c.doc == doc and (str(_rel(doc)), c.text) not in SHOWN_FAILING]
    bad = [f"{c}\n    {p}" for c in shown for p in problems(c, made)]
    assert not bad, "\n".join(bad)


def results_tables(doc: Path) -> list[tuple[int, int]]:
    """(first, last) 0-based line numbers of `doc`'s markdown tables with a number in a data cell."""
    lines = doc.read_text().splitlines()
    tables, i = [], 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            cells = [
                re.sub(r"`[^`]*`", "", c) for row in lines[i + 2 : j] for c in row.strip().strip("|").split("|")[1:]
            ]
            if any(NUMBER.search(c) for c in cells):
                tables.append((i, j - 1))
            i = j
        else:
            i += 1
    return tables


def _has_command(lines: list[str]) -> bool:
    text = "\n".join(lines)
    if COMMAND.search(text):
        return True
    blocks = re.findall(r"^```[^\n]*\n(.*?)(?:^```|\Z)", text, flags=re.M | re.S)
    return any(_program(line) in PROGRAMS for b in blocks for line in b.splitlines())


def _program(line: str) -> str:
    """The program a block's line runs (a console prompt ``$ `` dropped), or ""."""
    words = line.split()
    if words[:1] == ["$"]:
        words = words[1:]
    return words[0] if words else ""


def _block_start(lines: list[str], line: int) -> int | None:
    """The 0-based line of the fence opening the block `line` is in, or None outside a fenced block."""
    fences = [i for i in range(line) if lines[i].lstrip().startswith("```")]
    return fences[-1] if len(fences) % 2 else None


def tables_without_command(doc: Path) -> list[str]:
    lines = doc.read_text().splitlines()
    out = []
    run_start, previous_end = -1, -2
    for first, last in results_tables(doc):
        if previous_end < 0 or any(line.strip() for line in lines[previous_end + 1 : first]):
            run_start = first  # not right after the previous table: a run of tables starts here
        previous_end = last
        start = min(run_start, first) - NEAR
        block = _block_start(lines, first)
        start = min(start, block) if block is not None else start
        if not _has_command(lines[max(0, start) : last + 1 + NEAR]):
            out.append(f"{_rel(doc)}:{first + 1}: {lines[first][:100]}")
    return out


def test_the_results_tables_are_found() -> None:
    assert len(results_tables(ROOT / "docs" / "benchmarks.md")) > 15


@pytest.mark.parametrize("doc", RESULTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_results_table_names_its_command(doc: Path) -> None:
    bad = tables_without_command(doc)
    assert not bad, "results tables without the command that produced them within a few lines:\n" + "\n".join(bad)


# -------------------------------------------------------------------------------------------- the checks fail


def test_a_broken_command_name_is_caught(tmp_path: Path) -> None:
    """A renamed make target, asp command or subcommand, benchmark, preset or module is reported, and a table whose
    command is too far away."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "```bash\nmake rn\nasp repro && asp shedule build x\nasp schedule bild outputs/x\n"
        ".venv/bin/python benchmarks/no_such.py --fast\nasp params check --preset gpu-clustr\n"
        "python -m asp.no_such_module\n```\n\nRun `make test` or `asp stag profile`; scripts/x.py (not a command).\n"
    )
    found = [p for c in commands(doc) for p in problems(c)]
    schedule = ", ".join(sorted(asp_tree()["schedule"] or []))
    assert found == [
        "`make rn`: no such Makefile target",
        f"`asp shedule`: no such asp command (asp has {', '.join(sorted(asp_tree()))})",
        f"`asp schedule bild`: no such subcommand (asp schedule has {schedule})",
        "`benchmarks/no_such.py`: no such file",
        "`benchmarks/no_such.py`: no such file or folder",
        "`--preset gpu-clustr`: no configs/gpu-clustr.yaml",
        "`python -m asp.no_such_module`: no such module",
        f"`asp stag`: no such asp command (asp has {', '.join(sorted(asp_tree()))})",
    ], found
    doc.write_text('```bash\nasp init --name mine\nasp repro --preset mine\nsh -c "asp repro && asp reprofile"\n```\n')
    assert presets_made(doc) == {"mine"} and not [p for c in commands(doc) for p in problems(c, {"mine"})]
    assert problems(commands(doc)[1]) == ["`--preset mine`: no configs/mine.yaml"]
    table = "| a | b |\n|---|---|\n| x | 1.5 |\n"
    filler = "text\n"
    doc.write_text(f"`asp repro`\n\n{filler * NEAR}{table}")
    assert tables_without_command(doc)
    doc.write_text(f"`asp repro`\n\n{filler * (NEAR - 2)}{table}")
    assert not tables_without_command(doc)
    # a table right after another shares its command; one after a paragraph does not
    doc.write_text(f"`asp repro`\n\n{table}\n{table.replace('1.5', '2.5') * 1}\n{filler * NEAR}\n{table}\n{table}")
    assert len(tables_without_command(doc)) == 2
    # a table inside a console block has the block's command; the same block without a command has none
    block = f"```\n$ asp plan memory\n{filler * NEAR}{table}```\n"
    doc.write_text(block)
    assert not tables_without_command(doc)
    doc.write_text(block.replace("$ asp plan memory", "$ echo hi"))
    assert tables_without_command(doc)
