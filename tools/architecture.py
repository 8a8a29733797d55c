"""The architecture's counts, measured from the source: modules of the whole package and of the
coordinator, their import levels (runtime imports, as tools/import_graph.py reads
them: a module's level is one more than the highest level it imports, a module importing
nothing of echo2 is level 1) and import cycles. docs/architecture.md quotes them between the
markers below; `--check` fails when the quote differs from the code (tests/unit/
test_architecture_counts.py runs it), `--write` puts the measured block in.

    python tools/architecture.py            # print the block
    python tools/architecture.py --check    # exit 1 when docs/architecture.md is out of date
    python tools/architecture.py --write    # update docs/architecture.md
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.import_graph import Import, collect_imports, module_cycles, module_names, package_cycles  # noqa: E402

DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- architecture counts: begin -->", "<!-- architecture counts: end -->"
SCOPES = (("echo2", "the package"), ("echo2.coordinator", "`coordinator/`"))


def levels(modules: list[str], imports: list[Import]) -> dict[str, int]:
    """Each module's import level within `modules` (imports of modules outside them ignored)."""
    inside = set(modules)
    targets: dict[str, set[str]] = defaultdict(set)
    for edge in imports:
        if edge.importer in inside and edge.target in inside and edge.importer != edge.target:
            targets[edge.importer].add(edge.target)
    level: dict[str, int] = {}

    def of(module: str, path: tuple[str, ...]) -> int:
        if module not in level:
            if module in path:  # a cycle: counted by module_cycles, not here
                return 0
            level[module] = 1 + max((of(t, (*path, module)) for t in targets[module]), default=0)
        return level[module]

    for module in modules:
        of(module, ())
    return level


def counts(src: Path = ROOT / "src") -> dict[str, dict[str, int]]:
    names = module_names(src)
    imports = collect_imports(src)
    measured = {}
    for prefix, _ in SCOPES:
        scope = [m for m in names if m == prefix or m.startswith(prefix + ".")]
        files = [names[m] for m in scope]
        measured[prefix] = {
            "modules": len(scope),
            "lines": sum(len(path.read_text().splitlines()) for path in files),
            "largest_file_lines": max(len(path.read_text().splitlines()) for path in files),
            "import_levels": max(levels(scope, imports).values()),
        }
    measured["echo2"]["cycles"] = len(module_cycles(imports)) + len(package_cycles(imports))
    return measured


def block(measured: dict[str, dict[str, int]]) -> str:
    rows = [f"| {label} | {measured[p]['modules']} | {measured[p]['import_levels']} |" for p, label in SCOPES]
    return "\n".join([
        BEGIN,
        "| measured by `python tools/architecture.py` | modules | import levels |",
        "|---|---|---|",
        *rows,
        "",
        f"Import cycles between modules or packages: {measured['echo2']['cycles']}.",
        END,
    ])


def quoted(text: str) -> str | None:
    if BEGIN not in text or END not in text:
        return None
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail when docs/architecture.md quotes other counts")
    mode.add_argument("--write", action="store_true", help="write the measured counts into docs/architecture.md")
    args = parser.parse_args(argv)
    made = block(counts())
    text = DOC.read_text()
    if args.write:
        old = quoted(text)
        if old is None:
            print(f"{DOC}: no {BEGIN} ... {END} markers to write between", file=sys.stderr)
            return 1
        DOC.write_text(text.replace(old, made))
    elif args.check:
        if quoted(text) != made:
            print(f"{DOC} quotes counts the code no longer has; run `python tools/architecture.py --write`.\n"
                  f"measured:\n{made}", file=sys.stderr)
            return 1
    else:
        print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
