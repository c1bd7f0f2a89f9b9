"""No circle of modules in the product, counting every import: at module level, inside a function
and under ``TYPE_CHECKING``.

``lint-imports`` holds the same rule per package (pyproject's ``acyclic_siblings`` contract); this
test also sees a circle that crosses from ``meshctl`` into ``meshctl_plugins`` and back, and names
the modules of each circle.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

PRODUCT = ("meshctl", "meshctl_plugins")


def _edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    modules = set(graph.modules)
    return {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every group of two or more modules that import each other, each sorted (Tarjan's strongly
    connected components, iterative: the product's graph is deeper than the recursion limit
    would like)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return sorted(found)


def test_no_module_of_the_product_imports_itself_through_others():
    graph = grimp.build_graph(*PRODUCT, cache_dir=None)
    assert circles(_edges(graph)) == []


def test_a_circle_closed_by_an_import_inside_a_function_or_for_typing_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text(
        textwrap.dedent(
            """
            def late():
                from circled import a
            """
        )
    )
    (package / "c.py").write_text("from circled import b\n")
    (package / "d.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            from circled import c
            if TYPE_CHECKING:
                from circled import e
            """
        )
    )
    (package / "e.py").write_text("from circled import d\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circled", cache_dir=None)
    assert circles(_edges(graph)) == [["circled.a", "circled.b"], ["circled.d", "circled.e"]]


def test_circles_are_whole_groups_and_a_one_way_chain_is_none():
    chain = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert circles(chain) == []
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert circles(ring) == [["a", "b", "c"]]
