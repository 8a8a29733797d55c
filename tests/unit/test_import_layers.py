"""Import layers that only point down, and no import cycles, read from the source (see
tools/import_graph.py for the rule). The checker's own tests feed it made-up edges and a
made-up source tree, so a rule that silently stopped catching anything would fail here too."""

from __future__ import annotations

from pathlib import Path

from tools.import_graph import (
    LAYER_OF,
    LAYER_ORDER,
    Import,
    check,
    collect_imports,
    module_names,
    package_of,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def test_echo2_imports_follow_the_layers_without_cycles():
    imports = collect_imports(SRC)
    assert len(imports) > 500  # the walk really read the package
    problems = check(imports)
    assert not problems, f"{len(problems)} import rule(s) broken:\n" + "\n".join(problems)


def test_every_package_has_a_layer():
    """Also a package that imports nothing and that nothing imports yet."""
    assert {package_of(name) for name in module_names(SRC)} - set(LAYER_OF) == set()


def test_an_upward_import_is_named_with_its_file_line_and_the_rule():
    upward = Import("echo2.config.run", "echo2.tasks.registry", "src/echo2/config/run.py", 31)
    downward = Import("echo2.cli.common", "echo2.config.run", "src/echo2/cli/common.py", 13)
    [problem] = check([upward, downward])
    assert problem.startswith("src/echo2/config/run.py:31: echo2.config.run imports echo2.tasks.registry")
    assert "upward import, config (layer 0) may not import tasks (layer 3)" in problem
    assert LAYER_ORDER in problem


def test_a_module_cycle_is_named_module_by_module():
    loop = [Import("echo2.planner.plan", "echo2.planner.diagnose", "src/echo2/planner/plan.py", 12),
            Import("echo2.planner.diagnose", "echo2.planner.cost", "src/echo2/planner/diagnose.py", 8),
            Import("echo2.planner.cost", "echo2.planner.plan", "src/echo2/planner/cost.py", 140)]
    [problem] = check(loop)
    assert problem.startswith("module cycle echo2.planner.cost -> echo2.planner.plan -> echo2.planner.diagnose "
                              "-> echo2.planner.cost: ")
    assert "src/echo2/planner/cost.py:140: echo2.planner.cost imports echo2.planner.plan" in problem


def test_a_package_cycle_within_one_layer_is_reported():
    both_ways = [Import("echo2.tasks.registry", "echo2.envs.task", "src/echo2/tasks/registry.py", 12),
                 Import("echo2.envs.transcript", "echo2.tasks.base", "src/echo2/envs/transcript.py", 19)]
    [problem] = check(both_ways)  # same layer, so only the loop is wrong
    assert problem.startswith("package cycle envs -> tasks -> envs: src/echo2/envs/transcript.py:19")


def test_a_package_without_a_layer_is_reported():
    [problem] = check([Import("echo2.extras.x", "echo2.config.base", "src/echo2/extras/x.py", 3)])
    assert "package 'extras' has no layer" in problem


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path):
    """A deliberately added upward import, in a function of a made-up source tree, is caught
    end to end: collected from the file, then reported by the checker."""
    package = tmp_path / "echo2"
    for folder in ("config", "cli"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cli" / "common.py").write_text("X = 1\n")
    (package / "config" / "base.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from echo2.cli.common import X\n"
        "def late():\n    from echo2.cli import common\n    from .. import cli\n    return common, cli\n")
    imports = collect_imports(tmp_path)
    assert sorted((e.target, e.line) for e in imports) == [("echo2.cli", 6), ("echo2.cli.common", 5)]
    problems = check(imports)
    assert len(problems) == 2 and all("upward import, config (layer 0) may not import cli" in p for p in problems)
    assert "echo2/config/base.py:5: echo2.config.base imports echo2.cli.common: " in problems[0]
