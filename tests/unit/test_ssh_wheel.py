"""The wheel the `ssh` provider ships is this source tree's echo2: built once per content, reused
while the sources stay the same, and named apart from another tree of the same version."""

from __future__ import annotations

import zipfile

from echo2.launch.wheel import coordinator_release, source_digest, source_root


def test_the_shipped_wheel_is_this_tree_built_once(tmp_path):
    first = coordinator_release(tmp_path)
    built_at = first.wheel.stat().st_mtime_ns
    again = coordinator_release(tmp_path)
    assert again == first and again.wheel.stat().st_mtime_ns == built_at  # reused, not rebuilt
    assert first.version.endswith(source_digest(source_root()))
    with zipfile.ZipFile(first.wheel) as wheel:
        shipped = wheel.read("echo2/launch/wheel.py")
    assert shipped == (source_root() / "src/echo2/launch/wheel.py").read_bytes()
