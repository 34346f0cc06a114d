"""Final-answer extraction and comparison for DeepScaleR-style math data (answers like ``"\\frac{3}{4}"``).

`extract_final_answer` takes the content of the last ``\\boxed{...}`` (balanced braces; also ``\\fbox``)
and otherwise the last stated answer (``"the answer is 12"``, ``"Answer: 12"``, ``"#### 12"``).
`normalize_answer` removes LaTeX decoration that does not change the value (``$``, ``\\left``,
``\\text{..}``, ``\\dfrac``, spaces, ``^\\circ``, a trailing period, thousands separators, ``x =`` ...).
`answers_match` compares normalized strings and, when both sides are numbers (integers, decimals,
``a/b``, ``\\frac{a}{b}``, percentages dropped), their values.

Run the tests with ``python -m pytest tests/rl -q``.
"""

from __future__ import annotations

import math
import re

_STATED = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.+?)\s*$", re.MULTILINE)
_FRAC = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), or ``\\boxed 5``; else None.

    Example: ``"so \\boxed{\\frac{1}{2}}."`` -> ``"\\frac{1}{2}"``.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if i < len(text) and text[i] == " ":
        m = re.match(r"\s*([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def extract_final_answer(response: str) -> str | None:
    """The last boxed answer, else the last stated one (``answer is X`` / ``Answer: X`` / ``#### X``), else None."""
    if not isinstance(response, str):
        return None
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    found = _HASHES.findall(response) or _STATED.findall(response)
    if not found:
        return None
    return re.split(r"(?<=\S)\.\s", found[-1].strip())[0].strip()  # up to the end of the sentence


def normalize_answer(answer: str) -> str:
    """Canonical string form of an answer (see the module docstring).

    Examples: ``"$\\dfrac{1}{2}$."`` -> ``"\\frac{1}{2}"``; ``"x = 1,000"`` -> ``"1000"``;
    ``"90^\\circ"`` -> ``"90"``; ``"\\text{(B)}"`` -> ``"b"``.
    """
    s = str(answer).strip()
    s = _TEXT.sub(r"\1", s)
    for old, new in (
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\ ", ""),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
        ("\\%", ""),
        ("%", ""),
        ("$", ""),
        ("\\displaystyle", ""),
    ):
        s = s.replace(old, new)
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"^[a-zA-Z]\w*=(?=.)", "", s)  # "x=5" -> "5"
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"\(?[A-Ea-e]\)?", s):  # multiple choice "(B)"
        s = s.strip("()")
    if re.fullmatch(r"[+-]?\d+", s):
        s = str(int(s))
    return s.lower() if re.fullmatch(r"[A-Za-z]+", s) else s


def to_number(s: str) -> float | None:
    """Value of a normalized answer that is a plain number, ``a/b`` or ``\\frac{a}{b}``; else None.

    Examples: ``"0.5"`` -> 0.5; ``"-\\frac{3}{4}"`` -> -0.75; ``"3/4"`` -> 0.75; ``"\\sqrt{2}"`` -> None.
    """
    sign = -1.0 if s.startswith("-") else 1.0
    body = s[1:] if s[:1] in "+-" else s
    m = _FRAC.fullmatch(body) or re.fullmatch(r"(\d+(?:\.\d*)?)/(\d+(?:\.\d*)?)", body)
    if m:
        num, den = _plain(m.group(1)), _plain(m.group(2))
        return sign * num / den if num is not None and den not in (None, 0.0) else None
    value = _plain(body)
    return None if value is None else sign * value


def _plain(s: str) -> float | None:
    return float(s) if _NUMBER.fullmatch(s.strip()) else None


def answers_match(predicted: str | None, reference: str) -> bool:
    """True when the normalized strings are equal or both are numbers within 1e-6 (relative) of each other."""
    if predicted is None or not str(predicted).strip():
        return False
    a, b = normalize_answer(predicted), normalize_answer(reference)
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def math_reward(response: str, answer: str) -> float:
    """1.0 when the response's final answer matches `answer` (see `answers_match`), else 0.0."""
    return 1.0 if answers_match(extract_final_answer(response), answer) else 0.0
