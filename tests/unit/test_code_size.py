"""House rules on size: no file under src/ over 400 lines, no function over 60 (a reader holds
one in view). The checks are functions over source text, so the test also shows they catch a
violation."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "echo2"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized_file(name: str, text: str) -> str | None:
    lines = len(text.splitlines())
    return f"{name}: {lines} lines (at most {MAX_FILE_LINES}): split it by owner" if lines > MAX_FILE_LINES else None


def oversized_functions(name: str, text: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {lines} lines (at most {MAX_FUNCTION_LINES}): "
                             "extract its steps into functions")
    return found


def test_no_file_or_function_under_src_is_oversized():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        text, name = path.read_text(), str(path.relative_to(SRC.parent))
        problems += [p for p in [oversized_file(name, text)] if p] + oversized_functions(name, text)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_an_oversized_file_and_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    long_function = f"def long():\n{body}\n"
    assert oversized_functions("fake.py", long_function) == [
        "fake.py:1 long: 62 lines (at most 60): extract its steps into functions"]
    assert oversized_functions("fake.py", "def short():\n    return 1\n") == []
    assert "401 lines" in oversized_file("fake.py", "x = 1\n" * 401)
    assert oversized_file("fake.py", "x = 1\n" * 400) is None
