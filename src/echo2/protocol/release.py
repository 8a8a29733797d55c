"""The echo2 release, kept equal to pyproject.toml's version. A worker sends it when it registers
and a refused peer is named with it (protocol_mismatch); `echo2.__version__` is this string.
Here, in the protocol layer, because the wire carries it and the top-level package must not be
imported from below."""

from __future__ import annotations

RELEASE = "0.1.0"
