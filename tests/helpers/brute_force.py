"""Enumerations for brute-force checks of the planner on tiny instances."""

from __future__ import annotations

from collections.abc import Iterator


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into non-empty blocks (each once): the ways to split jobs
    into phases."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part
