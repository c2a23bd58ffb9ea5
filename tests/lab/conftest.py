"""Fixtures for the WAN lab: real namespaces, real TUN devices, a real switch process."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest

from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import LabFleet
from lab.netns import LabError, require_root
from lab.wan import WanLab
from tests.helpers.job_lab import JOB_LAB_CITIES, JOB_NODE_TIMEOUT_S

# Beijing, Neimeng, Tokyo and London from the default matrix: short, medium and long pairs.
SMALL_LAB_CITIES = ["Beijing", "Neimeng", "Tokyo", "London"]
SMALL_LAB_SCALE = 0.5


def _skip_reason() -> str | None:
    try:
        require_root()
    except LabError as err:
        return str(err)
    return None


@pytest.fixture(scope="session")
def lab_available() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def make_wan_lab(lab_available, tmp_path) -> Iterator[Callable[..., WanLab]]:
    """Build labs from a matrix; every lab built is torn down after the test."""
    built: list[WanLab] = []

    def build(matrix: lab_matrix.LatencyMatrix, **kwargs) -> WanLab:
        lab = WanLab(matrix, work_dir=tmp_path / f"lab{len(built)}", **kwargs)
        built.append(lab)
        return lab.start()

    yield build
    for lab in built:
        lab.stop()


@pytest.fixture
def wan_lab(make_wan_lab) -> WanLab:
    """A 4-host lab (Beijing, Neimeng, Tokyo, London at half their modelled RTTs) plus the hub."""
    return make_wan_lab(lab_matrix.from_cities(SMALL_LAB_CITIES).scaled(SMALL_LAB_SCALE))


@pytest.fixture(scope="session")
def ping_available() -> None:
    if shutil.which("ping") is None:
        pytest.skip("`ping` (iputils-ping) is not installed")


@pytest.fixture
def lab_fleet(make_wan_lab, tmp_path) -> Iterator[Callable[[lab_matrix.LatencyMatrix], LabFleet]]:
    """Build a lab (``lab_options``: WanLab's, such as ``rate_mbps``) and its services
    (lab/fleet.py); the services stop before the lab is torn down."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    started: list[LabFleet] = []

    def build(matrix: lab_matrix.LatencyMatrix, **lab_options) -> LabFleet:
        work = tmp_path / f"fleet{len(started)}"
        work.mkdir()
        fleet = LabFleet(make_wan_lab(matrix, **lab_options), work)
        started.append(fleet)
        return fleet

    yield build
    for fleet in started:
        fleet.services.stop()


@pytest.fixture
def job_fleet(lab_fleet) -> LabFleet:
    """A two-host lab fleet (JOB_LAB_CITIES) with serve owning jobs (``JOB_NODE_TIMEOUT_S``)."""
    fleet = lab_fleet(lab_matrix.from_cities(JOB_LAB_CITIES).scaled(0.25))
    job_scenarios.start(fleet, JOB_NODE_TIMEOUT_S)
    return fleet
