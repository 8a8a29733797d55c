"""Whether the code a result measures has changed: the files under a benchmark's `MEASURES`
that differ between the result's commit and another commit (or the working tree). A Python file
counts only when its code changed: docstrings and comments say what the code does, they do not
change what a benchmark measures, so a file whose syntax tree is the same once its string
statements are dropped has not changed. Any other file counts on any change. benchmarks/check.py
(which results are stale) and env_learning.py (which runs may be reported together) share it."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path


def git_specs(measures: tuple[str, ...]) -> list[str]:
    """MEASURES as git pathspecs: a leading `!` excludes a path."""
    return [f":(exclude){p[1:]}" if p.startswith("!") else p for p in measures]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)


class _NoDocs(ast.NodeTransformer):
    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        # a bare string statement: a docstring, or an attribute's documentation below it
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None
        return self.generic_visit(node)


def code_of(source: str) -> str | None:
    """The syntax tree of a Python source without its string statements (None: not Python)."""
    try:
        return ast.dump(_NoDocs().visit(ast.parse(source)))
    except (SyntaxError, ValueError):
        return None


def _same_code(root: Path, name: str, first: str, second: str | None) -> bool:
    """Whether a Python file's code is the same at `first` and at `second` (None: the tree)."""
    before = _git(root, "show", f"{first}:{name}")
    if second is None:
        path = root / name
        after_text = path.read_text() if path.exists() else None
    else:
        after = _git(root, "show", f"{second}:{name}")
        after_text = after.stdout if after.returncode == 0 else None
    if before.returncode != 0 or after_text is None:
        return False  # added or removed
    old, new = code_of(before.stdout), code_of(after_text)
    return old is not None and old == new


def changed_code(root: Path, measures: tuple[str, ...], first: str, second: str | None = None) -> list[str] | None:
    """The files in `measures` whose code differs between commit `first` and `second` (None: the
    working tree, where a new file counts once it is added to git). None: git could not compare
    them (a commit this clone does not have)."""
    diff = _git(root, "diff", "--name-only", first, *([second] if second else []), "--", *git_specs(measures))
    if diff.returncode != 0:
        return None
    return [name for name in diff.stdout.split()
            if not (name.endswith(".py") and _same_code(root, name, first, second))]
