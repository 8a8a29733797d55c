"""benchmarks/check.py (run by `make lint`): a result without its provenance fails unless it is
listed as made before provenance was recorded, a listed result that has it fails too, and the
results committed now pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from check import LEGACY_LIST, check, check_citations  # noqa: E402

PROVENANCE = {"git_commit": "abc123", "git_dirty": False, "date": "2026-12-05T12:00:00+0000", "cores": 2,
              "versions": {"torch": "2.13.0+cpu", "transformers": "5.25.0"}, "load_average_start": [0.3, 0.2, 0.1],
              "command": "python benchmarks/x.py"}


def test_a_result_must_say_how_it_was_made(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps({"provenance": PROVENANCE, "value": 1}))
    machine = {"cores": 2, "torch": "t", "transformers": "x"}
    top_level = {"commit": "abc", "dirty": True, "date": "d", "machine": machine, "load_average": [1, 1, 1],
                 "command": ["python", "b.py"]}  # env_learning's form
    (tmp_path / "top.json").write_text(json.dumps({**top_level, "value": 2}))
    (tmp_path / "bare.json").write_text(json.dumps({"value": 3}))
    (tmp_path / "partial.json").write_text(json.dumps({"provenance": {**PROVENANCE, "command": ""}}))
    errors, legacy = check(tmp_path)
    assert legacy == []
    assert [e.split(":")[0] for e in errors] == ["bare.json", "partial.json"]
    assert "no provenance command" in errors[1]


def test_the_list_of_older_results_excuses_them_until_they_have_it(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"value": 3}))
    (tmp_path / "rerun.json").write_text(json.dumps({"provenance": PROVENANCE}))
    (tmp_path / LEGACY_LIST).write_text("# older results\nold.json  lacks all\nrerun.json  lacks all\ngone.json\n")
    errors, legacy = check(tmp_path)
    assert legacy == ["old.json", "rerun.json"]
    assert errors == [f"{LEGACY_LIST}: gone.json is listed but no such result exists",
                      f"rerun.json: has its provenance now: take it off {LEGACY_LIST}"]


def test_the_committed_results_pass():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "check.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_a_number_in_the_docs_that_cites_a_result_must_be_what_the_result_says(tmp_path):
    (tmp_path / "load.json").write_text(json.dumps({"cases": [{"ratio": 0.914, "p99_ms": 364.09, "share": 0.626}]}))
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "pace **0.91**<!-- result: load.json cases.0.ratio --> and 364<!-- result: load.json cases.0.p99_ms --> ms",
        "saving 62.6%<!-- result: load.json cases.0.share x100 -->",
        "stale 0.95<!-- result: load.json cases.0.ratio -->",
        "gone 1<!-- result: load.json cases.1.ratio --> and 2<!-- result: other.json x -->",
    ]))
    errors, cited = check_citations(tmp_path, [doc])
    assert cited == 6
    assert errors == ["doc.md:3: 0.95 cites load.json cases.0.ratio: the result says 0.914 (0.91 as quoted)",
                      "doc.md:4: 1 cites load.json cases.1.ratio: no number there (None)",
                      "doc.md:4: 2 cites other.json x: no number there (no such result)"]


def test_a_quote_of_a_stale_result_says_so_where_it_is_read(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"ratio": 0.914}))
    (tmp_path / "new.json").write_text(json.dumps({"ratio": 0.5}))
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "old 0.91<!-- result: old.json ratio --> (stale) and new 0.5<!-- result: new.json ratio -->",
        "old 0.91<!-- result: old.json ratio --> unmarked",
        "new 0.5<!-- result: new.json ratio --> (stale)",
    ]))
    errors, cited = check_citations(tmp_path, [doc], frozenset({"old.json"}))
    assert cited == 4
    assert errors == ["doc.md:2: 0.91 cites old.json ratio: old.json measured code that has changed since: rerun it, "
                      "or write (stale) after the citation",
                      "doc.md:3: 0.5 cites new.json ratio: marked (stale) but new.json measured the code as it is: "
                      "drop the mark"]
    # once old.json is rerun, its mark goes
    assert check_citations(tmp_path, [doc])[0] == [
        "doc.md:1: 0.91 cites old.json ratio: marked (stale) but old.json measured the code as it is: drop the mark",
        errors[1]]


def test_a_result_whose_measured_code_changed_since_its_commit_is_listed_as_stale(tmp_path, monkeypatch):
    import check as checker

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "measured.py").write_text("x = 1\n")
    (tmp_path / "src" / "ignored.py").write_text("y = 1\n")
    (tmp_path / "benchmarks" / "bench.py").write_text('MEASURES = ("src", "!src/ignored.py")\n')
    (tmp_path / "benchmarks" / "unnamed.py").write_text("X = 1\n")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "empty")
    git("add", "-A")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "measured")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60).stdout.strip()
    results = tmp_path / "benchmarks" / "results"
    for name, benchmark in (("fresh.json", "bench"), ("unnamed.json", "unnamed")):
        provenance = {**PROVENANCE, "git_commit": commit}
        (results / name).write_text(json.dumps({"benchmark": benchmark, "provenance": provenance}))
    monkeypatch.setattr(checker, "ROOT", tmp_path)
    (tmp_path / "src" / "ignored.py").write_text("y = 2\n")  # excluded: still fresh
    errors, stale = checker.stale_results(results)
    assert errors == ["unnamed.json: its benchmark ('unnamed') names no MEASURES"] and stale == {}
    # docstrings, comments and layout say what the code does; they do not change what it measures
    (tmp_path / "src" / "measured.py").write_text('"""The measured value."""\n\nx = (\n    1  # one\n)\n"""x."""\n')
    assert checker.stale_results(results)[1] == {}
    (tmp_path / "src" / "measured.py").write_text('"""The measured value."""\nx = 2\n')
    _, stale = checker.stale_results(results)
    assert stale == {"fresh.json": f"- `fresh.json` (measured at {commit[:7]}): `src/measured.py` changed since"}
    (tmp_path / "src" / "measured.py").write_text("x = 1\n")
    (tmp_path / "src" / "added.py").write_text('"""Only a docstring, but new."""\n')
    git("add", "src/added.py")
    _, stale = checker.stale_results(results)
    assert stale == {"fresh.json": f"- `fresh.json` (measured at {commit[:7]}): `src/added.py` changed since"}


def test_a_benchmark_adds_runs_only_to_a_result_of_the_same_clean_commit():
    from load.provenance import same_code

    now = {"git_commit": "abc", "git_dirty": False}
    assert same_code({"git_commit": "abc", "git_dirty": False}, now)
    assert not same_code({"git_commit": "old", "git_dirty": False}, now)  # another commit: never merged
    assert not same_code({"git_commit": "abc", "git_dirty": True}, now)  # a dirty tree is not that commit
    assert not same_code({"git_commit": "abc", "git_dirty": False}, {**now, "git_dirty": True})
    assert not same_code(None, now) and not same_code({}, now)  # no provenance: made before it was recorded
