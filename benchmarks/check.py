"""Every result under benchmarks/results/ says how it was made: the commit and whether the tree
was dirty, the date, the machine (cores, torch and transformers versions), the load average and
the exact command. A result without all of them fails this check, unless its file is listed in
benchmarks/results/NO_PROVENANCE (results made before provenance was recorded, to be rerun);
a listed result that has its provenance fails too (take it off the list).

A number in README.md or docs/ may cite the result it comes from, with a comment right after it:
`0.91<!-- result: coordinator_load.json cases.3.learner.ratio_vs_reference -->` (dotted keys,
list indices as numbers; a trailing `x100` for a fraction quoted as a percentage). The check
fails when the result, or the value at that path, is gone, or when the value rounded to the
quoted number's decimals is not the number quoted.

A result is stale when the code it measures has changed since its commit: each benchmark names
that code in `MEASURES` (paths; `!` before one excludes it), read from its source, never run.
Changes are taken from the working tree (git diff against the result's commit; a new file counts
once it is added to git), so `--write` before a commit lists what the commit will have. A Python
file whose only changes are docstrings and comments has not changed (load/measured.py).
docs/benchmarks.md shows the stale results between STALE_BEGIN and STALE_END; the check fails
when that list is out of date, and `--write` writes it. A number quoting a stale result says so
where it is read, `(stale)` right after its citation, or fails the check (rerun the result, or
mark the quote); the mark fails on a fresh result. Run by `make lint`.

    python benchmarks/check.py [--write]
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from load.measured import changed_code  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"
STALE_BEGIN = "<!-- stale results: written by benchmarks/check.py --write -->"
STALE_END = "<!-- end of stale results -->"
CITATION = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)\**%?\s*<!--\s*result:\s*(\S+)\s+(\S+)(?:\s+x(\d+))?\s*-->")
LEGACY_LIST = "NO_PROVENANCE"
STALE_MARK = "(stale)"
"""What a quote of a stale result says right after its citation, where the reader sees it."""

FIELDS: dict[str, tuple[str, ...]] = {
    "commit": ("git_commit", "commit"),
    "dirty": ("git_dirty", "dirty"),
    "date": ("date", "date_utc"),
    "cores": ("cores", "machine.cores"),
    "torch": ("versions.torch", "machine.torch"),
    "transformers": ("versions.transformers", "machine.transformers"),
    "load_average": ("load_average_start", "load_average", "load_average_1_5_15_before"),
    "command": ("command",),
}
"""Each field the provenance must have, and the names the benchmarks' writers give it (the load
benchmark's `load/provenance.py`, env_learning's and fleet_ssh's `provenance`)."""


def _lookup(block: dict, dotted: str):
    value = block
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def missing_fields(result: dict) -> list[str]:
    """The provenance fields `result` lacks (its `provenance` block, or its top level)."""
    block = result.get("provenance") if isinstance(result.get("provenance"), dict) else result
    return [field for field, names in FIELDS.items() if all(_lookup(block, name) in (None, "") for name in names)]


def legacy_names(results: Path) -> dict[str, str]:
    """NO_PROVENANCE: `file.json  why` per line (# comments and blank lines skipped)."""
    path = results / LEGACY_LIST
    if not path.exists():
        return {}
    listed = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, why = line.partition(" ")
            listed[name] = why.strip()
    return listed


def check(results: Path) -> tuple[list[str], list[str]]:
    """(errors, the results listed in NO_PROVENANCE) for the JSON files under `results`."""
    errors, legacy = [], legacy_names(results)
    present = {path.name for path in results.glob("*.json")}
    errors += [f"{LEGACY_LIST}: {name} is listed but no such result exists" for name in sorted(set(legacy) - present)]
    for path in sorted(results.glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except ValueError as exc:
            errors.append(f"{path.name}: not JSON ({exc})")
            continue
        missing = missing_fields(result) if isinstance(result, dict) else list(FIELDS)
        if missing and path.name not in legacy:
            errors.append(f"{path.name}: no provenance {', '.join(missing)}: write it with the benchmark's "
                          f"provenance (see benchmarks/load/provenance.py), or list it in {LEGACY_LIST} to rerun")
        elif not missing and path.name in legacy:
            errors.append(f"{path.name}: has its provenance now: take it off {LEGACY_LIST}")
    return errors, sorted(name for name in legacy if name in present)


def docs_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def check_citations(results: Path, docs: list[Path], stale: frozenset[str] = frozenset()) -> tuple[list[str], int]:
    """(errors, citations checked) for the numbers in `docs` that cite a result. A quote of a
    result in `stale` says so to the reader, STALE_MARK right after its citation; a quote of a
    fresh one does not."""
    errors, checked, loaded = [], 0, {}
    for doc in docs:
        for line_no, line in enumerate(doc.read_text().splitlines(), 1):
            for match in CITATION.finditer(line):
                checked += 1
                quoted, name, path, scale = match.groups()
                where = f"{doc.name}:{line_no}: {quoted} cites {name} {path}"
                marked = line[match.end():].lstrip().startswith(STALE_MARK)
                if name in stale and not marked:
                    errors.append(f"{where}: {name} measured code that has changed since: rerun it, or write "
                                  f"{STALE_MARK} after the citation")
                elif marked and name not in stale:
                    errors.append(f"{where}: marked {STALE_MARK} but {name} measured the code as it is: drop the mark")
                if name not in loaded:
                    file = results / name
                    loaded[name] = json.loads(file.read_text()) if file.exists() else None
                value = None if loaded[name] is None else _at(loaded[name], path)
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    found = "no such result" if loaded[name] is None else repr(value)
                    errors.append(f"{where}: no number there ({found})")
                    continue
                value *= int(scale or 1)
                decimals = len(quoted.partition(".")[2])
                if round(value, decimals) != float(quoted.replace(",", "")):
                    errors.append(f"{where}: the result says {value} ({round(value, decimals)} as quoted)")
    return errors, checked


def _at(result, dotted: str):
    value = result
    for part in dotted.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value


def measured_paths(benchmark: str) -> tuple[str, ...] | None:
    """The `MEASURES` of benchmarks/<benchmark>.py (None: it names none)."""
    source = ROOT / "benchmarks" / f"{benchmark}.py"
    if not source.exists():
        return None
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MEASURES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return None


def stale_results(results: Path) -> tuple[list[str], dict[str, str]]:
    """(errors, the results with provenance whose measured code changed since their commit: each
    name and its line for docs/benchmarks.md)."""
    errors, stale = [], {}
    for path in sorted(results.glob("*.json")):
        result = json.loads(path.read_text())
        if not isinstance(result, dict) or missing_fields(result):
            continue  # no provenance: listed in NO_PROVENANCE already
        block = result.get("provenance") if isinstance(result.get("provenance"), dict) else result
        commit = next(block[k] for k in FIELDS["commit"] if block.get(k))
        paths = measured_paths(str(result.get("benchmark", "")))
        if paths is None:
            errors.append(f"{path.name}: its benchmark ({result.get('benchmark')!r}) names no MEASURES")
            continue
        files = changed_code(ROOT, paths, commit)  # against the tree: CI's is HEAD's
        if files is None:
            stale[path.name] = f"- `{path.name}` (measured at {commit[:7]}, which this clone does not have)"
        elif files:
            shown = ", ".join(f"`{f}`" for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            stale[path.name] = f"- `{path.name}` (measured at {commit[:7]}): {shown} changed since"
    return errors, stale


def stale_section(stale: list[str]) -> str:
    body = "\n".join(stale) if stale else "None: every result with its provenance measured the code as it is."
    return f"{STALE_BEGIN}\n{body}\n{STALE_END}"


def check_stale_doc(stale: list[str], *, write: bool) -> list[str]:
    """docs/benchmarks.md's list of stale results against `stale` (rewritten with `write`)."""
    text = BENCHMARKS_DOC.read_text()
    start, end = text.find(STALE_BEGIN), text.find(STALE_END)
    if start < 0 or end < 0:
        return [f"docs/benchmarks.md: no stale-results section ({STALE_BEGIN} ... {STALE_END})"]
    current = text[start:end + len(STALE_END)]
    wanted = stale_section(stale)
    if current == wanted:
        return []
    if write:
        BENCHMARKS_DOC.write_text(text.replace(current, wanted))
        return []
    return ["docs/benchmarks.md: its list of stale results is out of date: run python benchmarks/check.py --write"]


def main(argv: list[str]) -> int:
    results, write = RESULTS, "--write" in argv
    errors, legacy = check(results)
    stale_errors, stale = stale_results(results)
    cited_errors, cited = check_citations(results, docs_files(), frozenset(stale))
    errors += cited_errors + stale_errors + check_stale_doc(list(stale.values()), write=write)
    total = len(list(results.glob("*.json")))
    print(f"benchmarks/check.py: {total} results; {len(legacy)} made before provenance was recorded, "
          f"listed in {LEGACY_LIST} to be rerun; {cited} numbers in the docs cite a result; {len(stale)} results "
          "measured code that has changed since (docs/benchmarks.md lists them)")
    for error in errors:
        print(f"  {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
