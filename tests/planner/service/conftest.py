"""Fixtures for the planner's server side: a real `hulk-planner serve` process on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.processes import start_planner


@pytest.fixture
def planner(tmp_path: Path):
    p = start_planner(tmp_path / "planner.db")
    yield p
    p.stop()
