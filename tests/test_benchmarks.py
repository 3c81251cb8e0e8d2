"""The benchmarks are part of the product's claims (BENCHMARKS.md): each must at least import against today's
harness and name only what exists, so a function that moved or was renamed shows here, not the next time someone
measures (benchmarks/redteam.py named record.audit_due long after it was gone)."""

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def harness_names(tree: ast.AST) -> dict[str, str]:
    """name -> module, for every module of the harness (and the fixed half) the script imports."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("autoresearch", "autoresearch.evaluator"):
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            names.update({a.asname or a.name: a.name for a in node.names
                          if a.name.split(".")[0] in ("autoresearch", "prepare", "runtime")})
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_benchmark_imports_and_names_only_what_exists(path, monkeypatch):
    from pyflakes import checker, messages
    monkeypatch.setattr(sys, "argv", [str(path)])
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/x.py` runs it: its siblings importable
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # its work runs under __main__ only
    tree = ast.parse(path.read_text())
    undefined = [str(m) for m in checker.Checker(tree, str(path)).messages if isinstance(m, messages.UndefinedName)]
    modules = {name: importlib.import_module(module) for name, module in harness_names(tree).items()
               if importlib.util.find_spec(module) is not None}
    missing = [f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
               and not hasattr(modules[node.value.id], node.attr)]
    assert not undefined and not missing, undefined + missing
