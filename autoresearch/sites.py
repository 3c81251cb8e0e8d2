"""Sites: places of a Python source (train.py) found by their syntax tree, read back and rewritten.

A site is one statement, definition, default argument or constant, found by its place (class, method, the names
it assigns), never by its exact text, so rewriting it also repairs a site someone else rewrote: it is set to a
canonical variant whatever it held. Its current variant is read back by comparing syntax trees (comments and
spacing do not count); a site that matches no variant reads as None ("unknown"). This module knows nothing of
what the sites are: the catalog of ideas (ideas.py) names them and writes their variants.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
import textwrap
from dataclasses import dataclass
from typing import Callable


class EditError(ValueError):
    """train.py cannot be read or rewritten as asked."""


NOT_A_VALUE = object()


def literal(text_or_node):
    """ast.literal_eval that never raises: NOT_A_VALUE for whatever is not a plain literal. Its input is an agent's
    text (a description, a train.py), and `{[]}` raised TypeError, which ended every later proposal of the tag."""
    try:
        return ast.literal_eval(text_or_node)
    except Exception:  # noqa: BLE001 - ValueError, SyntaxError, TypeError, RecursionError, MemoryError: not a value
        return NOT_A_VALUE


class NotApplicable(EditError):
    """The site is not in this train.py (it was renamed or removed)."""


# --- finding sites ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def tree(source: str) -> ast.Module:
    """train.py parsed (cached: a proposal reads every site of one source; nothing may modify the tree)."""
    return ast.parse(source)


def find_def(module: ast.Module, dotted: str):
    """The class or function `A.b` at module level (one level of nesting), or None."""
    nodes = module.body
    found = None
    for part in dotted.split("."):
        found = next((n for n in nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part), None)
        if found is None:
            return None
        nodes = found.body
    return found


def statement(module, dotted: str, match: Callable[[ast.stmt], bool]):
    """The first statement (at any depth) of definition `dotted` that `match` accepts."""
    owner = find_def(module, dotted)
    if owner is None:
        return None
    for node in ast.walk(owner):
        if isinstance(node, ast.stmt) and node is not owner and match(node):
            return node
    return None


def names(node) -> set[str]:
    """Every name and attribute a node mentions."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def assigns(*targets: str):
    """A matcher for an assignment whose targets are exactly these names (`a, b = ...` or `a = b = ...`)."""
    def match(node):
        if not isinstance(node, ast.Assign):
            return False
        got = []
        for t in node.targets:
            got += [e for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        found = [ast.unparse(e) for e in got]
        return found == list(targets)
    return match


def is_call_to(node, attr: str) -> bool:
    """Whether the node calls a function or method named `attr` anywhere."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))
               and getattr(n.func, "attr", getattr(n.func, "id", None)) == attr for n in ast.walk(node))


def _shape(code: str) -> str | None:
    """A snippet's syntax tree as text: two snippets with the same shape are the same code, comments, spacing and
    line breaks aside."""
    try:
        return ast.dump(ast.parse(textwrap.dedent(code)))
    except SyntaxError:
        return None


def _lines_of(source: str, node) -> tuple[int, int]:
    """The line span [start, end) of a statement or definition, decorators excluded."""
    return node.lineno - 1, node.end_lineno


# --- sites ------------------------------------------------------------------------------------------------------

@dataclass
class Site:
    """One place of train.py and how each combination of its parameters is written there.
    locate(tree) -> the node or None; render(params) -> the code (unindented); grid: each parameter's values;
    defaults: what the shipped train.py holds. Statements and definitions are replaced as whole lines."""
    name: str
    locate: Callable
    render: Callable[[dict], str]
    grid: dict[str, list]
    defaults: dict

    def node(self, source: str):
        return self.locate(tree(source))

    def read(self, source: str) -> dict | None:
        """The site's current parameters, None when it holds something no variant writes; NotApplicable when
        train.py has no such site."""
        node = self.node(source)
        if node is None:
            raise NotApplicable(f"train.py has no {self.name} site")
        lines = source.splitlines(keepends=True)
        start, end = _lines_of(source, node)
        shape = _shape("".join(lines[start:end]))
        return next((params for params, rendered in self._shapes() if rendered == shape), None)

    def _shapes(self) -> list[tuple[dict, str]]:
        if not hasattr(self, "_rendered"):
            keys = list(self.grid)
            combos = [dict(zip(keys, values)) for values in itertools.product(*(self.grid[k] for k in keys))]
            self._rendered = [(params, _shape(self.render(params))) for params in combos]
        return self._rendered

    def write(self, source: str, params: dict) -> str:
        node = self.node(source)
        if node is None:
            raise NotApplicable(f"train.py has no {self.name} site")
        lines = source.splitlines(keepends=True)
        start, end = _lines_of(source, node)
        indent = " " * node.col_offset
        body = "".join(indent + line if line.strip() else line
                       for line in self.render(params).strip("\n").splitlines(keepends=True))
        return "".join(lines[:start]) + body + "\n" + "".join(lines[end:])


class DefaultArgSite(Site):
    """A default argument of a function (orthogonalize's steps=5): only the literal is rewritten."""

    def __init__(self, name, function, arg, grid, defaults):
        super().__init__(name, lambda t: find_def(t, function), None, grid, defaults)
        self.arg = arg

    def _literal(self, source):
        fn = self.node(source)  # the cached tree: read, never modified
        if fn is None:
            raise NotApplicable(f"train.py has no {self.name} site")
        args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):]
        for a, d in zip(args, fn.args.defaults):
            if a.arg == self.arg and isinstance(d, ast.Constant):
                return d
        raise NotApplicable(f"{self.name}: no literal default for {self.arg}")

    def read(self, source):
        value = self._literal(source).value
        return {self.arg: value} if value in self.grid[self.arg] else None

    def write(self, source, params):
        d = self._literal(source)
        start = char_offset(source, d.lineno, d.col_offset)
        end = char_offset(source, d.end_lineno, d.end_col_offset)
        return source[:start] + repr(params[self.arg]) + source[end:]


class ConstantSite(Site):
    """A hyperparameter constant whose value is an idea of its own (a soft cap, head size), per profile."""

    def __init__(self, name, constant, grids: dict[str, list], profile: str = "cpu", valid=None):
        super().__init__(name, None, None, {constant: grids[profile]}, {})
        self.constant, self.grids, self.profile = constant, grids, profile
        self.valid = valid  # valid(constants) -> whether train.py's own checks hold with the new value

    def for_profile(self, profile):
        return ConstantSite(self.name, self.constant, self.grids, profile, self.valid)

    def read(self, source):
        values = read_constants(source, self.profile)
        if self.constant not in values:
            raise NotApplicable(f"train.py has no constant {self.constant}")
        v = values[self.constant]
        return {self.constant: v} if v in self.grid[self.constant] else None

    def write(self, source, params):
        new = set_constants(source, {self.constant: params[self.constant]}, self.profile)
        if self.valid is not None and not self.valid(read_constants(new, self.profile)):
            raise EditError(f"{self.constant}={params[self.constant]!r} does not fit this train.py's other constants")
        return new


def math_import(source: str) -> str:
    """`import math` where a variant uses math (the cosine warmdown) and train.py does not import it yet, after
    the last top-level import; removed again (that line alone) when nothing uses math any more."""
    uses = re.search(r"\bmath\.", source) is not None
    line = re.search(r"^import math\n", source, re.M)
    if uses and line is None:
        imports = [n for n in tree(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        if not imports:
            raise EditError("train.py has no top-level import to put `import math` after")
        lines = source.splitlines(keepends=True)
        end = max(n.end_lineno for n in imports if isinstance(n, ast.Import)) if any(
            isinstance(n, ast.Import) for n in imports) else imports[-1].end_lineno
        source = "".join(lines[:end]) + "import math\n" + "".join(lines[end:])
    elif not uses and line is not None:
        source = source[:line.start()] + source[line.end():]
    return source


# --- rewriting constants ------------------------------------------------------------------------------------------
# Read and rewrite the hyperparameter constants of train.py without touching anything else.
#
# A constant is a module-level assignment `NAME = literal` or `NAME = a if CPU else b` (one value per profile).
# Rewriting replaces only the literal of the active profile; every other byte of the file stays as it was.

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
        value = literal(_value_node(node, profile))
        if value is not NOT_A_VALUE:
            out[name] = value
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
