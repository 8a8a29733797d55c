"""The docs point at code and pages that exist: every file and function the life-of-a-rollout
table of docs/architecture.md names is defined there (found with `ast`, nothing imported), the
ten stages are all present and in order, every link between the README and docs/ resolves
(files and `#anchors`), and the README's map lists every page."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
STAGES = ["lease", "generate", "submit", "score", "admit", "batch", "step", "publish", "relay", "load"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks (a `# comment` in a code block is no heading)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _rollout_table() -> list[tuple[str, str, str]]:
    """(stage, file, function) of each row of the table under 'The life of a rollout'."""
    lines = _prose_lines(DOCS / "architecture.md")
    start = lines.index("## The life of a rollout")
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row of the life-of-a-rollout table has {len(cells)} cells, not 4: {line}"
        if cells[0] in ("stage", "---"):
            continue
        rows.append((cells[0], cells[2].strip("`"), cells[3].strip("`")))
    return rows


def _defines(tree: ast.Module, name: str) -> bool:
    """`name` is a top-level function or class, or `Class.method` a method of a top-level class."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    owner, _, member = name.rpartition(".")
    if not owner:
        return any(isinstance(node, (*functions, ast.ClassDef)) and node.name == name for node in tree.body)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner]
    return any(isinstance(node, functions) and node.name == member for cls in classes for node in cls.body)


def test_the_life_of_a_rollout_names_all_ten_stages_in_order():
    assert [stage for stage, _, _ in _rollout_table()] == STAGES


@pytest.mark.parametrize("stage, path, function", _rollout_table(), ids=lambda value: str(value))
def test_the_life_of_a_rollout_names_code_that_exists(stage, path, function):
    source = ROOT / path
    assert source.is_file(), f"stage {stage!r}: {path} does not exist"
    assert _defines(ast.parse(source.read_text()), function), f"stage {stage!r}: {path} defines no {function}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lstrip("#").strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    for line in _prose_lines(path):
        if re.match(r"#{1,6} ", line):
            slug = base = _slug(line)
            count = 0
            while slug in anchors:  # GitHub numbers repeated headings
                count += 1
                slug = f"{base}-{count}"
            anchors.add(slug)
    return anchors


def _links(path: Path) -> list[str]:
    return [target for line in _prose_lines(path) for target in LINK.findall(INLINE_CODE.sub("", line))]


def _broken(path: Path, target: str) -> str | None:
    """Why a relative link of `path` does not resolve (None: it does)."""
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    if not linked.exists():
        return f"{path.relative_to(ROOT)}: {target}: no such file"
    if anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
        return f"{path.relative_to(ROOT)}: {target}: no heading '#{anchor}' in {linked.relative_to(ROOT)}"
    return None


def _relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto: are not checked


def test_the_readme_links_to_docs_resolve():
    readme = ROOT / "README.md"
    targets = [t for t in _links(readme) if _relative(t)]
    assert any(t.startswith("docs/") for t in targets)
    broken = [why for t in targets if (why := _broken(readme, t))]
    assert not broken, "\n".join(broken)


def test_links_between_docs_pages_resolve():
    broken = [why for page in sorted(DOCS.glob("*.md")) for t in _links(page) if _relative(t)
              if (why := _broken(page, t))]
    assert not broken, "\n".join(broken)


def test_the_readme_maps_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(ROOT / "README.md") if t.startswith("docs/")}
    unmapped = [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not unmapped, f"pages the README's map of the docs does not list: {unmapped}"


def test_the_documented_environment_example_works():
    """The 'Writing an environment' example of docs/tasks-and-environments.md, as written there,
    is a working environment and task."""
    import random

    import echo2.config  # noqa: F401  the package order the registry imports them in

    doc = (DOCS / "tasks-and-environments.md").read_text()
    block = doc.split("# src/echo2/envs/coin.py: call three coin flips in a row\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(block, "tasks-and-environments.md", "exec", dont_inherit=True), namespace)  # noqa: S102  our own docs
    env = namespace["CoinTask"](namespace["CoinConfig"](), 0).make_env()
    assert env.reset(7) == "Heads or tails? (h/t)"
    assert env.step("x").illegal
    env.reset(7)
    while not (result := env.step(env.demo_action(random.Random(0)))).done:
        assert result.reward == 0.0
    assert 0.0 <= result.reward <= 1.0
