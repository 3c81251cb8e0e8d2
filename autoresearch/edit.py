"""Read and rewrite the hyperparameter constants of train.py without touching anything else.

A constant is a module-level assignment `NAME = literal` or `NAME = a if CPU else b` (one value per profile).
Rewriting replaces only the literal of the active profile; every other byte of the file stays as it was.
"""

from __future__ import annotations

import ast


class EditError(ValueError):
    pass


def _constant_nodes(source: str) -> dict[str, ast.Assign]:
    tree = ast.parse(source)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                out[name] = node
    return out


def _value_node(node: ast.Assign, profile: str) -> ast.expr:
    """The expression holding the active profile's value."""
    value = node.value
    if isinstance(value, ast.IfExp) and isinstance(value.test, ast.Name) and value.test.id == "CPU":
        return value.body if profile == "cpu" else value.orelse
    return value


def read_constants(source: str, profile: str = "cpu") -> dict[str, object]:
    """The literal constants of train.py for a profile (expressions that are not literals are skipped)."""
    out = {}
    for name, node in _constant_nodes(source).items():
        try:
            out[name] = ast.literal_eval(_value_node(node, profile))
        except ValueError:
            continue
    return out


def char_offset(source: str, lineno: int, col_bytes: int) -> int:
    lines = source.splitlines(keepends=True)
    line = lines[lineno - 1]
    return sum(len(x) for x in lines[: lineno - 1]) + len(line.encode("utf-8")[:col_bytes].decode("utf-8"))


def set_constants(source: str, changes: dict[str, object], profile: str = "cpu") -> str:
    """Return source with each NAME's active-profile literal replaced by repr(value). The result must parse and
    read back the new values; otherwise EditError."""
    nodes = _constant_nodes(source)
    spans = []
    for name, value in changes.items():
        if name not in nodes:
            raise EditError(f"train.py has no constant {name}")
        target = _value_node(nodes[name], profile)
        start = char_offset(source, target.lineno, target.col_offset)
        end = char_offset(source, target.end_lineno, target.end_col_offset)
        spans.append((start, end, repr(value)))
    for start, end, text in sorted(spans, reverse=True):
        source = source[:start] + text + source[end:]
    try:
        check = read_constants(source, profile)
    except SyntaxError as e:
        raise EditError(f"the edit would not parse: {e}") from None
    for name, value in changes.items():
        if check.get(name) != value:
            raise EditError(f"{name} did not read back as {value!r}")
    return source
