"""The house points one way: no import cycle between specfold's rooms (subpackages and top-level
modules), function-level imports included, read from the source's AST.

The layer order is documented in docs/DESIGN.md ("Layers"); this test checks that the import graph
between rooms is acyclic and that no room imports one above it in that order.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import MappingProxyType

import pytest

PKG = Path(__file__).resolve().parents[1] / "specfold"
# lowest first; a room may import only rooms before it (and itself)
ORDER = ["errors", "outputs", "params", "text", "extras", "interrupts", "models", "kernels", "decoding", "engine", "executor",
         "api", "args", "tiny", "serve", "eval", "ray", "calibrate_cli", "widen_cli", "cli", "__main__", "__init__"]


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "specfold" and len(parts) > 1 else None


def edges() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG.parent).with_suffix("")
        here = room(".".join(rel.parts)) or "__init__"
        if here == "__init__" and rel.parts[-1] == "__init__" and len(rel.parts) == 2:
            here = "__init__"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "specfold"]
            for n in names:
                there = room(n)
                if there and there != here:
                    out.setdefault((here, there), []).append(f"{rel}:{node.lineno}")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2
    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


@pytest.fixture(scope="module")
def import_edges():
    """`edges()` read once for the module's checks (every source file parsed once), read-only."""
    return MappingProxyType({k: tuple(v) for k, v in edges().items()})


def test_no_import_cycle_between_rooms(import_edges):
    graph: dict[str, set[str]] = {}
    for a, b in import_edges:
        graph.setdefault(a, set()).add(b)
    assert cycles(graph) == []


def test_every_import_points_down(import_edges):
    rooms = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file()))}
    assert rooms <= set(ORDER), f"rooms missing from the layer order: {sorted(rooms - set(ORDER))}"
    up = {k: v for k, v in import_edges.items() if ORDER.index(k[1]) > ORDER.index(k[0])}
    assert up == {}


def test_the_check_has_teeth():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
