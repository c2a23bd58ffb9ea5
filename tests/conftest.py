"""Fixtures shared by every test area."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.paths import REPO, SHARED


@pytest.fixture(scope="session")
def repo_dir() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: the paper's data and job sets (never copied into the repo)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside this checkout")
    return SHARED


@pytest.fixture(scope="session")
def paper_fleet_dir(shared_dir: Path) -> Path:
    return shared_dir / "data" / "hulk-upstream"

from tests.helpers.broker import broker  # noqa: E402,F401  (a real mosquitto, tests/fixtures/broker.py)
