"""The documented multi-machine recipe (docs/operations.md) is the one the netns test runs: every
`echo2` command of that block is a step of docs/multihost.sh, in the same order, with the
script's settings in the doc's placeholders (PORT 8470, LEARNER_HOST, ...)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the script's settings as the doc writes them
PLACEHOLDERS = {"CONFIG": "my.toml", "RUN_DIR": "runs/my-run", "PORT": "8470", "LEARNER_HOST": "LEARNER_HOST",
                "THIS_HOST": "THIS_HOST", "BANDWIDTH_BPS": "1e9", "PRICE_PER_HOUR": "0.34"}


def _documented_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("## Running the roles yourself"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("\n```")]
    commands = []
    for line in block.splitlines():
        line = line.split("  #")[0].strip().removesuffix("&").strip()
        if line.startswith("echo2 "):
            commands.append(shlex.split(line))
    return commands


def _script_commands() -> list[list[str]]:
    commands = []
    for line in (ROOT / "docs" / "multihost.sh").read_text().splitlines():
        match = re.match(r"\s*exec (echo2 .*?)\s*;;$", line)
        if match:
            filled = re.sub(r"\$(\w+)", lambda m: PLACEHOLDERS[m.group(1)], match.group(1))
            commands.append(shlex.split(filled))
    return commands


def test_the_docs_show_the_tested_recipe():
    script = _script_commands()
    assert len(script) == 6  # prepare, coordinator, learner, check, worker, worker behind NAT
    assert _documented_commands() == script
