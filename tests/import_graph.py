"""Import circles in a graph of modules (or folders): the architecture tests' one finder."""

from __future__ import annotations


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each once (from its smallest node)."""
    found = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                found.append(path)
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return found
