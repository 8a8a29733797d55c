"""The counts docs/architecture.md quotes (modules, lines, import levels, cycles) are the code's,
measured by tools/architecture.py; the coordinator stays within its bounds (at most 7 import
levels, no file over 300 lines); and the measure of levels sees a deeper chain."""

from __future__ import annotations

from tools.architecture import counts, levels, main
from tools.import_graph import Import

COORDINATOR_MAX_LEVELS = 7


def test_the_docs_quote_the_measured_counts(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().err


def test_the_coordinator_stays_shallow_and_its_files_short():
    measured = counts()
    assert measured["echo2.coordinator"]["import_levels"] <= COORDINATOR_MAX_LEVELS, measured
    assert measured["echo2.coordinator"]["largest_file_lines"] <= 300, measured
    assert measured["echo2"]["cycles"] == 0


def test_levels_count_the_longest_chain_of_runtime_imports():
    edges = [Import("a", "b", "a.py", 1), Import("b", "c", "b.py", 1), Import("a", "c", "a.py", 2),
             Import("d", "x", "d.py", 1)]  # x is outside the scope: not counted
    assert levels(["a", "b", "c", "d"], edges) == {"a": 3, "b": 2, "c": 1, "d": 1}
