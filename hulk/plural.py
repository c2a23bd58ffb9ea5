"""One plural helper for every count a person reads: ``count(1, "island")`` is "1 island",
``count(2, "replica")`` "2 replicas", ``count(2, "fragment", "fragments")`` likewise."""

from __future__ import annotations


def count(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun: ``one`` when ``n`` is 1, else ``many`` (default ``one`` + "s")."""
    return f"{n} {one if n == 1 else many or one + 's'}"
