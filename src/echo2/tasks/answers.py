"""Final answers out of free text, and whether two answers are the same mathematical object.

Pure functions over untrusted text (a worker's completion): nothing here evaluates what the
text says beyond parsing the answer, lengths are capped before any parsing, and
`math-verify` (which can be made to compute 9^(9^(9^9))) runs under its own timeouts.

Extraction, in order: the last `\\boxed{...}` (braces balanced), the text after GSM8K's last
`####`, the last number in the text.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

MAX_ANSWER_CHARS = 200
"""An extracted answer longer than this is wrong: no reference answer in GSM8K or MATH comes
close, and parsing cost grows with length."""
MAX_SCAN_CHARS = 100_000
"""Only the last this many characters of a completion are searched for its answer."""
VERIFY_TIMEOUT_S = 2
"""math-verify's parse and comparison timeouts (seconds, each)."""
MAX_EXPONENT = 9999
"""The largest number an exponent or a factorial's argument may hold (2^{2019} is a competition
answer; 9^{99999}, 99999! and 2^{10!} cost sympy seconds or more)."""
MAX_POWER_DIGITS = 100_000
"""A power estimated to have more digits than this (exponent times the answer's longest
number: comparing (10^150)^{9999} costs sympy over a second) is not computed."""

# ASCII digits only: an answer in fullwidth or other scripts' digits is not read as a number
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?", re.ASCII)
_SIMPLE = re.compile(r"^\s*-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*-?\d+(?:\.\d+)?)?\s*$", re.ASCII)
_POWER = re.compile(r"\^|\*\*")
_DIGITS = re.compile(r"\d+", re.ASCII)


def last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...} (or \\fbox{...}), nested braces included."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i].strip()
        i += 1
    return None  # unbalanced: no answer


def after_hashes(text: str) -> str | None:
    """GSM8K's convention: the answer follows the last `####` on its line."""
    at = text.rfind("####")
    if at < 0:
        return None
    rest = text[at + 4:].strip().splitlines()
    return rest[0].strip() if rest else None


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer, how it was found: "boxed", "hashes", "last_number" or "none")."""
    text = text[-MAX_SCAN_CHARS:]
    for how, finder in (("boxed", last_boxed), ("hashes", after_hashes), ("last_number", last_number)):
        answer = finder(text)
        if answer:
            return answer, how
    return None, "none"


def reference_answer(text: str) -> str:
    """A dataset's answer field as the answer itself: the boxed or `####` part of a worked
    solution, else the field as given."""
    return last_boxed(text) or after_hashes(text) or text.strip()


def _as_fraction(text: str) -> Fraction | None:
    if not _SIMPLE.match(text):
        return None
    cleaned = text.replace(",", "").replace(" ", "")
    try:
        if "/" in cleaned:
            num, den = cleaned.split("/")
            return Fraction(num) / Fraction(den)
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def equivalent(reference: str, answer: str | None) -> bool:
    """Whether `answer` is the same value as `reference`: exact rational comparison when both
    are plain numbers (1/2 = 0.5, 1,000 = 1000), else math-verify on the LaTeX of both
    (\\frac{1}{2} = 0.5, \\sqrt{2} = 2^{1/2})."""
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    ref_value, value = _as_fraction(reference), _as_fraction(answer)
    if ref_value is not None and value is not None:
        return ref_value == value
    if costly(answer):
        return False
    return _math_verify(reference, answer)


def costly(answer: str) -> bool:
    """Whether parsing `answer` could make sympy compute a huge number: a tower of powers (an
    exponent holding a power or a factorial, or a^b^c: 9^{9^{9}} costs seconds), an exponent with a
    number over MAX_EXPONENT, a power estimated at over MAX_POWER_DIGITS digits, or a factorial
    of a number over MAX_EXPONENT or of a group holding a power, a factorial or such a number
    ((9^{99})!). One pass over an answer of at most MAX_ANSWER_CHARS characters;
    legitimate answers are plain numbers and small expressions (x^2, 2^{1/2}, \\frac{10!}{3!})."""
    widest = max((len(run) for run in _DIGITS.findall(answer)), default=0)
    for op in _POWER.finditer(answer):
        start = _skip_spaces(answer, op.end())
        end = _operand_end(answer, start)
        exponent = answer[start:end]
        if _POWER.search(exponent) or "!" in exponent or _POWER.match(answer, _skip_spaces(answer, end)):
            return True
        runs = _DIGITS.findall(exponent)
        if _too_big(runs) or max(map(int, runs), default=0) * widest > MAX_POWER_DIGITS:
            return True
    for bang in re.finditer("!", answer):
        before = answer[:bang.start()].rstrip()
        if before.endswith((")", "}")):
            argument = _group_before(before)
        else:
            number = re.search(r"\d+$", before, re.ASCII)
            argument = number.group() if number else ""
        if _POWER.search(argument) or "!" in argument or _too_big(_DIGITS.findall(argument)):
            return True
    return False


def _too_big(numbers: list[str]) -> bool:
    return any(len(n) > len(str(MAX_EXPONENT)) or int(n) > MAX_EXPONENT for n in numbers)


def _group_before(text: str) -> str:
    """The (...) or {...} group `text` ends with, nesting included."""
    close = text[-1]
    opening, depth = "(" if close == ")" else "{", 0
    for j in range(len(text) - 1, -1, -1):
        depth += (text[j] == close) - (text[j] == opening)
        if depth == 0:
            return text[j:]
    return text


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _operand_end(text: str, i: int) -> int:
    """Where the operand starting at `i` ends: a {...} or (...) group (nesting included), a
    \\command with its {...} arguments, a run of digits, or one character."""
    if i >= len(text):
        return i
    first = text[i]
    if first in "{(":
        close, depth = "}" if first == "{" else ")", 0
        for j in range(i, len(text)):
            depth += (text[j] == first) - (text[j] == close)
            if depth == 0:
                return j + 1
        return len(text)
    j = i + 1
    if first == "\\":
        while j < len(text) and text[j].isalpha():
            j += 1
        while j < len(text) and text[j] == "{":
            j = _operand_end(text, j)
    elif first.isdigit():
        while j < len(text) and text[j].isdigit():
            j += 1
    return j


def _math_verify(reference: str, answer: str) -> bool:
    from math_verify import parse, verify

    # math-verify bounds its work with signal.alarm, which only the main thread may use; off it,
    # an answer that could make sympy compute a tower of powers is refused instead of parsed
    main = threading.current_thread() is threading.main_thread()
    if not main and ("^" in answer or "**" in answer):
        return False
    timeout = VERIFY_TIMEOUT_S if main else None
    try:
        gold = parse(f"${reference}$", parsing_timeout=timeout)
        pred = parse(f"${answer}$", parsing_timeout=timeout)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001  any failure to parse or compare untrusted text is "not equal"
        return False
