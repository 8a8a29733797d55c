"""Does a class match a `typing.Protocol`, signature by signature? `isinstance` against a
`runtime_checkable` Protocol only asks whether the names exist: a fake whose `fetch_batch`
renamed `wait_s` to `wait`, lost a default or turned a keyword-only parameter positional
passes it, and then passes tests the real link would fail (or fails tests it should pass).

`mismatches(protocol, cls)` compares every member the Protocol declares: a method must exist,
be the class's own (not the Protocol's stub a declaring subclass inherits), be async exactly
where the Protocol's is, and have the same parameters in the same order with the same kinds,
defaults and annotations (spelled alike, module prefixes aside); an attribute must be declared
on the class or set on `self` in an `__init__`, with the same annotation where it has one.
Strict by design: a seam's signatures are exact, so a drift in either the fake or the real link
fails a test instead of waiting for a run to find it.

`declared_implementations(root, bases)` finds with `ast` every class under `root` that names
one of `bases` as a base class, directly or through another class it found."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EMPTY = inspect.Parameter.empty


def mismatches(protocol: type, cls: type) -> list[str]:
    """One line per way `cls` departs from `protocol`; empty when it conforms."""
    methods, attributes = protocol_members(protocol)
    found = []
    for name, expected in methods.items():
        found += [f"{cls.__qualname__}.{name}: {p}" for p in _method_problems(cls, name, expected)]
    declared = declared_attributes(cls)
    for name, annotation in attributes.items():
        if name not in declared:
            found.append(f"{cls.__qualname__}.{name}: missing attribute (declare it on the class or set it in "
                         f"__init__, as {protocol.__name__} says: {annotation})")
        elif declared[name] is not None:
            found += [f"{cls.__qualname__}.{name}: {p}" for p in _annotation_problems("attribute", annotation,
                                                                                       declared[name])]
    return found


def protocol_members(protocol: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """(methods, attribute annotations) by name, from the Protocol and its Protocol bases."""
    methods: dict[str, Any] = {}
    attributes: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if not _is_protocol(klass) or klass.__module__ == "typing":  # typing.Protocol, Generic
            continue
        attributes.update(vars(klass).get("__annotations__", {}))
        methods.update({name: value for name, value in vars(klass).items()
                        if not name.startswith("_") and callable(value)})
    return methods, attributes


def declared_attributes(cls: type) -> dict[str, Any]:
    """Attributes `cls` declares (class-level, or `self.X = ...` in an `__init__` of its own or
    a base's): name -> annotation, None where unannotated. Protocol classes do not count."""
    declared: dict[str, Any] = {}
    for klass in cls.__mro__:
        if _is_protocol(klass) or klass is object:
            continue
        found = dict(vars(klass).get("__annotations__", {}))
        found.update({name: None for name, value in vars(klass).items()
                      if not name.startswith("_") and not callable(value) and name not in found})
        if "__init__" in vars(klass):
            found.update({name: ann for name, ann in _self_assignments(vars(klass)["__init__"]).items()
                          if ann is not None or name not in found})
        for name, annotation in found.items():
            if declared.get(name) is None:  # a subclass's declaration first, an annotated one over a bare one
                declared[name] = annotation
    return declared


def declared_implementations(root: Path, bases: Iterable[str]) -> list[tuple[Path, str]]:
    """(file, class name) for every class under `root` that names one of `bases` (or a class
    found so) as a base, in file order."""
    classes = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                classes.append((path, node.name, {_last_name(base) for base in node.bases}))
    wanted, found = set(bases), []
    grew = True
    while grew:
        grew = False
        for path, name, base_names in classes:
            if base_names & wanted and (path, name) not in found:
                found.append((path, name))
                wanted.add(name)
                grew = True
    return sorted(found, key=lambda item: (str(item[0]), item[1]))


def _method_problems(cls: type, name: str, expected: Any) -> list[str]:
    try:
        actual = inspect.getattr_static(cls, name)
    except AttributeError:
        return ["missing method"]
    if _function(actual) is _function(expected):
        return ["not implemented: only the Protocol's stub (a declared Protocol lends its stubs; override it)"]
    if not callable(actual):
        return [f"a {type(actual).__name__}, not a method"]
    problems = []
    want_async, is_async = (inspect.iscoroutinefunction(_function(m)) for m in (expected, actual))
    if want_async != is_async:
        problems.append(f"{'async def' if is_async else 'def'} where the Protocol has "
                        f"{'async def' if want_async else 'def'}")
    return problems + _signature_problems(_parameters(expected), _parameters(actual))


def _signature_problems(expected: inspect.Signature, actual: inspect.Signature) -> list[str]:
    if [p.name for p in expected.parameters.values()] != [p.name for p in actual.parameters.values()]:
        return [f"parameters {_shape(actual)} where the Protocol has {_shape(expected)}"]
    problems = []
    for want, got in zip(expected.parameters.values(), actual.parameters.values(), strict=True):
        if want.kind != got.kind:
            problems.append(f"parameter {want.name!r} is {got.kind.description} where the Protocol has it "
                            f"{want.kind.description}")
        if not (want.default is got.default or want.default == got.default):
            problems.append(f"parameter {want.name!r} defaults to {_default(got)} where the Protocol's default "
                            f"is {_default(want)}")
        problems += _annotation_problems(f"parameter {want.name!r}", want.annotation, got.annotation)
    return problems + _annotation_problems("return", expected.return_annotation, actual.return_annotation)


def _annotation_problems(what: str, expected: Any, actual: Any) -> list[str]:
    if expected is EMPTY:
        return []
    if actual is EMPTY:
        return [f"{what} not annotated (the Protocol says `{_spelled(expected)}`)"]
    if _spelled(expected) != _spelled(actual):
        return [f"{what} annotated `{_spelled(actual)}` where the Protocol says `{_spelled(expected)}`"]
    return []


def _spelled(annotation: Any) -> str:
    """An annotation as comparable text: no spaces, no module prefixes (`mmap.mmap` is `mmap`)."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", re.sub(r"\s+", "", text))


def _parameters(member: Any) -> inspect.Signature:
    """The signature as a caller of an instance sees it (`self`/`cls` left out)."""
    signature = inspect.signature(_function(member))
    if isinstance(member, staticmethod):
        return signature
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _function(member: Any) -> Any:
    return member.__func__ if isinstance(member, staticmethod | classmethod) else member


def _shape(signature: inspect.Signature) -> str:
    """The parameters with kinds and defaults, without annotations: `(step, *, wait_s)`."""
    return str(signature.replace(parameters=[p.replace(annotation=EMPTY) for p in signature.parameters.values()],
                                 return_annotation=EMPTY))


def _default(parameter: inspect.Parameter) -> str:
    return "nothing" if parameter.default is EMPTY else repr(parameter.default)


def _self_assignments(init: Any) -> dict[str, str | None]:
    """`self.X` names an `__init__` assigns, with their annotations where it gives one."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError):  # no source (a C slot wrapper, a generated function)
        return {}
    found: dict[str, str | None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            targets, annotation = [node.target], ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets, annotation = (node.targets if isinstance(node, ast.Assign) else [node.target]), None
        else:
            continue
        for target in (sub for t in targets for sub in ast.walk(t)):
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found[target.attr] = annotation or found.get(target.attr)
    return found


def _last_name(node: ast.expr) -> str:
    """`LearnerLink`, `links.LearnerLink` and `Base[T]` name their last (or subscripted) name."""
    if isinstance(node, ast.Subscript):
        return _last_name(node.value)
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_protocol(klass: type) -> bool:
    # typing sets _is_protocol on each class: True for a Protocol, False for a class declaring one
    return bool(getattr(klass, "_is_protocol", False))
