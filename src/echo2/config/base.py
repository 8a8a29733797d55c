"""Config plumbing shared by every schema: the frozen base model, TOML loading, `--set`
overrides and validation errors that name the field, the bad value and what is allowed."""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

M = TypeVar("M", bound=BaseModel)

DEVICE_FIELD = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
"""A torch device by name: "auto" (the first CUDA GPU when torch sees one, else the CPU), "cpu",
"cuda" or "cuda:N". Resolved where torch is imported (echo2.models.device)."""

# the largest sampling settings a run may have; wire messages cap the lists workers send with them
MAX_GROUP_SIZE = 1024
MAX_NEW_TOKENS = 32_768


class Frozen(BaseModel):
    """Immutable, strict config node: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value); the value is read as TOML when it parses, else a string."""
    if "=" not in item:
        raise ValueError(f"--set {item!r}: expected key=value, for example train.steps=50")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ValueError(f"--set {item!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words (paths, names) need no quotes on the command line
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b=value` applied (nested tables created as needed)."""
    out = _deep_copy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {item!r}: {part!r} is a value, not a table")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc


def validate(schema: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate `data` against `schema`, turning pydantic errors into one readable ValueError."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(schema, err) for err in exc.errors()]
        raise ValueError(f"invalid {source}:\n  " + "\n  ".join(lines)) from None


def _describe(schema: type[BaseModel], err: dict[str, Any]) -> str:
    loc, parent = _resolve(schema, [str(p) for p in err["loc"]])
    field = ".".join(loc) or "<root>"
    if err["type"] == "extra_forbidden":
        allowed = list(getattr(parent, "model_fields", {}))
        close = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{field}: unknown field{hint} (allowed: {', '.join(sorted(allowed))})"
    return f"{field}: {err['msg']} (got {err.get('input')!r})"


def _resolve(schema: type[BaseModel], loc: list[str]) -> tuple[list[str], Any]:
    """The location as the user wrote it, and the model that holds its last part. Through a
    discriminated union pydantic puts the member's tag in the location (`task.math.datset`);
    the user wrote `task.datset`, so tags are dropped and the member is the model."""
    shown: list[str] = []
    node: Any = schema
    parent: Any = None
    rest = list(loc)
    while rest:
        part = rest.pop(0)
        shown.append(part)
        parent = node
        field = getattr(node, "model_fields", {}).get(part)
        if field is None:
            return shown + rest, parent
        node = field.annotation
        members = _union_members(node)
        if members and rest and rest[0] in members:
            node = members[rest.pop(0)]
    return shown, parent


def _union_members(annotation: Any) -> dict[str, Any]:
    """{tag: member} of a union of models told apart by a Literal `name` field, else {}."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        args = typing.get_args(args[0])
    members = {}
    for arg in args:
        name = getattr(arg, "model_fields", {}).get("name")
        literal = typing.get_args(name.annotation) if name is not None else ()
        if len(literal) == 1:
            members[literal[0]] = arg
    return members
