"""House rules that review keeps missing, checked over the source with `ast`:

- a function with five or more parameters takes all but (at most) four of them by keyword, so a
  call site names what it passes and two swapped arguments of one type cannot go unnoticed;
- every attribute a class sets on `self` is set in `__init__` (or declared on the class), so
  reading an object's `__init__` tells what state it has, and no method reads a name that only
  exists after another method ran.

The checks are functions over source text, so the tests below also feed them small sources that
break each rule and assert the break is reported: a check that cannot fail is no check."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "echo2"

MAX_POSITIONAL = 4
KEYWORD_FROM = 5  # a function with this many parameters or more falls under the keyword rule

# Signatures another library fixes: the library calls them positionally, so they keep its shape.
# Keyed by "path relative to src/echo2:qualified name".
EXEMPT_SIGNATURES: dict[str, str] = {
    "learner/logprobs.py:_HeadLogprob.forward":
        "torch.autograd.Function.apply passes its inputs to forward positionally (no keywords)",
    "envs/verifiers_harness.py:Echo2Harness.launch":
        "verifiers' Harness contract: verifiers calls launch with its seven arguments positionally",
}


def _own_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> tuple[list[str], list[str]]:
    """(positional, keyword-only) parameter names, without `self`/`cls` and without *args/**kwargs."""
    positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if in_class and positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return positional, [a.arg for a in fn.args.kwonlyargs]


def _functions(tree: ast.AST):
    """Yield (qualified name, function node, defined directly in a class body)."""
    def walk(node: ast.AST, prefix: str, in_class: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child, in_class
                yield from walk(child, f"{name}.", False)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.", True)
            else:
                yield from walk(child, prefix, in_class)
    yield from walk(tree, "", False)


def positional_violations(source: str, filename: str, exempt: dict[str, str] | None = None) -> list[str]:
    """Functions with KEYWORD_FROM or more parameters that take more than MAX_POSITIONAL positionally."""
    exempt = EXEMPT_SIGNATURES if exempt is None else exempt
    found = []
    for name, fn, in_class in _functions(ast.parse(source, filename)):
        positional, keyword = _own_params(fn, in_class)
        if len(positional) + len(keyword) < KEYWORD_FROM or len(positional) <= MAX_POSITIONAL:
            continue
        if f"{filename}:{name}" in exempt:
            continue
        found.append(
            f"{filename}:{fn.lineno} {name}() takes {len(positional)} parameters positionally "
            f"(at most {MAX_POSITIONAL} when it has {KEYWORD_FROM} or more): put `*` after the first "
            f"few ({', '.join(positional[:MAX_POSITIONAL])}, ...) and pass the rest by keyword at "
            f"every call site"
        )
    return found


def _self_targets(node: ast.AST):
    """Yield (attribute name, line) for each `self.X` that an assignment in `node` binds."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign):
            targets = sub.targets
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        elif isinstance(sub, ast.For | ast.AsyncFor):
            targets = [sub.target]
        elif isinstance(sub, ast.With | ast.AsyncWith):
            targets = [item.optional_vars for item in sub.items if item.optional_vars is not None]
        else:
            continue
        for target in targets:
            for leaf in ast.walk(target):
                if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == "self" and isinstance(leaf.ctx, ast.Store)):
                    yield leaf.attr, leaf.lineno


def _class_level_names(cls: ast.ClassDef) -> set[str]:
    """Names the class body declares: annotations, assignments, methods (properties), __slots__."""
    names = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(stmt.name)
    return names


def attribute_violations(source: str, filename: str) -> list[str]:
    """Attributes a method sets on `self` that neither `__init__` nor the class body sets first."""
    found = []
    for cls in ast.walk(ast.parse(source, filename)):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = [s for s in cls.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
        init = next((m for m in methods if m.name == "__init__"), None)
        if init is None:
            continue  # a dataclass (or a class that inherits its __init__) declares its fields
        known = _class_level_names(cls) | {attr for attr, _ in _self_targets(init)}
        for method in methods:
            if method is init:
                continue
            for attr, line in _self_targets(method):
                if attr not in known:
                    known.add(attr)  # report each attribute once, where it is first set
                    found.append(
                        f"{filename}:{line} {cls.name}.{attr} (first set in {method.name}): "
                        f"initialise self.{attr} in {cls.name}.__init__ (an empty value of its type)"
                    )
    return found


def _sources():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), path.read_text()


def test_functions_with_five_or_more_parameters_take_the_rest_by_keyword():
    found = [v for name, text in _sources() for v in positional_violations(text, name)]
    assert not found, "\n".join(found)


def test_attributes_are_set_in_init():
    found = [v for name, text in _sources() for v in attribute_violations(text, name)]
    assert not found, "\n".join(found)


def test_every_exemption_names_a_function_that_exists_and_breaks_the_rule():
    """A stale exemption (renamed, removed or since fixed) would silently cover a new violation."""
    sources = dict(_sources())
    for key in EXEMPT_SIGNATURES:
        filename, name = key.split(":", 1)
        assert filename in sources, f"exemption {key}: no such file"
        found = positional_violations(sources[filename], filename, exempt={})
        assert any(f" {name}() " in v for v in found), f"exemption {key}: no such function, or it complies: drop it"


BAD_SIGNATURES = '''
def five(a, b, c, d, e): ...
class C:
    def method(self, a, b, c, d, e, *args, **kwargs): ...
    def __init__(self, a, b, c, d, e): ...
    async def handler(self, a, b, c, d, e=1): ...
def outer():
    def inner(a, b, c, d, e): ...
'''

GOOD_SIGNATURES = '''
def four(a, b, c, d): ...
def five(a, b, c, d, *, e): ...
def keywords(a, *, b, c, d, e, f): ...
def splat(a, b, c, d, *args, **kwargs): ...
class C:
    def method(self, a, b, c, d, *, e): ...
    @classmethod
    def make(cls, a, b, c, d): ...
'''


def test_the_keyword_check_reports_each_positional_signature():
    found = positional_violations(BAD_SIGNATURES, "fake.py", exempt={})
    names = [v.split()[1] for v in found]
    assert names == ["five()", "C.method()", "C.__init__()", "C.handler()", "outer.inner()"], found
    assert found[0].startswith("fake.py:2 five() takes 5 parameters positionally"), found[0]
    assert "put `*` after" in found[0]
    assert positional_violations(GOOD_SIGNATURES, "fake.py", exempt={}) == []


def test_an_exemption_covers_only_its_function():
    found = positional_violations(BAD_SIGNATURES, "fake.py", exempt={"fake.py:C.handler": "a library calls it"})
    assert [v.split()[1] for v in found] == ["five()", "C.method()", "C.__init__()", "outer.inner()"]


BAD_ATTRIBUTES = '''
class Env:
    limit: int = 3
    def __init__(self):
        self.seen = 0
    def reset(self, seed):
        self.secret = seed
        self.seen = 0
        self.limit = 4
        self.low, self.high = 0, 10
    def step(self):
        self.secret += 1
        self.tries: int = 1
        for self.cursor in range(3): ...
class Fields:
    count: int
    def bump(self):
        self.count += 1
        self.extra = 1
'''


def test_the_attribute_check_reports_each_late_attribute_once():
    found = attribute_violations(BAD_ATTRIBUTES, "fake.py")
    assert [v.split()[1] for v in found] == [
        "Env.secret", "Env.low", "Env.high", "Env.tries", "Env.cursor"], found
    assert found[0].startswith("fake.py:7 Env.secret (first set in reset): initialise self.secret"), found[0]
    assert "first set in step" in found[3]
