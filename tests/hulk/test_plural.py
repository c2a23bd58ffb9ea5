"""The one plural helper every count a person reads goes through ("1 restarts" and "1 site
pairs" were printed before it; tests/planner/service/test_lifecycle_restarts.py checks "gave up
after 1 restart")."""

from __future__ import annotations

from hulk.plural import count


def test_count_says_one_noun_for_one_and_the_plural_otherwise():
    assert [count(n, "restart") for n in (0, 1, 2)] == ["0 restarts", "1 restart", "2 restarts"]
    assert count(1, "site pair") == "1 site pair" and count(45, "site pair") == "45 site pairs"
    assert count(3, "replica", "replicas") == "3 replicas"
