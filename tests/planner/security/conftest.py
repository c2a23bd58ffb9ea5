"""Fixtures for the security tests: a private CA and a real planner in this process
(tests/helpers/threaded_planner.py)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from hulk.v1 import hulk_pb2_grpc
from planner.security.tls import init_pki
from tests.helpers.threaded_planner import ThreadedPlanner, channel


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> dict[str, Path]:
    return init_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1", "localhost"])


@pytest.fixture
def planner(tmp_path, pki):
    p = ThreadedPlanner(tmp_path / "planner.sqlite", pki)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def stub_for(planner, pki):
    channels: list[grpc.Channel] = []

    def make(target: str | None = None) -> hulk_pb2_grpc.PlannerStub:
        ch = channel(target or planner.target, pki)
        channels.append(ch)
        return hulk_pb2_grpc.PlannerStub(ch)

    yield make
    for ch in channels:
        ch.close()
