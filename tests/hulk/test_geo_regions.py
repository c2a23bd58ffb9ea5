"""Cloud regions in the gazetteer: names resolve, coordinates are plausible, physics applies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hulk import cloud_regions, geo
from hulk.wire.records import (NodeLocation, ProbeKind, ProbeSample, RegisterRequest,
                               ReportRequest)
from planner.core.fleet import Fleet, Node
from planner.core.generate import generate_fleet
from planner.service.ingest import IngestService
from planner.service.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, near, km", [
    ("aws:us-east-1", "Ashburn", 100),
    ("gcp:us-east4", "Ashburn", 100),
    ("aws:eu-central-1", "Frankfurt", 50),
    ("gcp:europe-west3", "Frankfurt", 50),
    ("azure:germanywestcentral", "Frankfurt", 50),
    ("aws:ap-southeast-2", "Sydney", 50),
    ("azure:westeurope", "Amsterdam", 100),
    ("aws:eu-west-1", "Dublin", 50),
    ("gcp:asia-northeast1", "Tokyo", 50),
    ("azure:southafricanorth", "Johannesburg", 50),
    ("aws:sa-east-1", "Sao Paulo", 50),
])
def test_known_regions_sit_at_their_metro(name, near, km):
    assert geo.great_circle_km(geo.coordinates(name), geo.coordinates(near)) < km


def test_a_region_label_names_the_code_and_the_place_a_city_has_none():
    assert geo.region_label(" US-East-1") == "aws:us-east-1 (N. Virginia, Ashburn)"
    assert geo.region_label("azure:westeurope") == "azure:westeurope (Netherlands, Amsterdam)"
    assert geo.region_label("Frankfurt") is None and geo.region_label("Neimeng") is None


def test_eemshaven_is_in_the_north_of_the_netherlands():
    lat, lon = geo.coordinates("gcp:europe-west4")
    assert 53.0 < lat < 53.7 and 6.5 < lon < 7.2
    assert geo.place("gcp:europe-west4")[2] == "NL"


@pytest.mark.parametrize("written, canonical", [
    ("aws:us-east-1", "aws:us-east-1"),
    ("  AWS:US-EAST-1 ", "aws:us-east-1"),
    ("us-east-1", "aws:us-east-1"),
    ("gcp:us-central1", "gcp:us-central1"),
    ("europe-west4", "gcp:europe-west4"),
    ("azure:eastus", "azure:eastus"),
    ("eastus", "azure:eastus"),
    ("azure:East US 2", "azure:eastus2"),
    ("Frankfurt", "Frankfurt"),          # cities first, unchanged
    ("Neimeng ", "Hohhot"),
])
def test_the_forms_a_user_writes(written, canonical):
    assert geo.canonical_city(written) == canonical


@pytest.mark.parametrize("unknown", ["aws:us-east-9", "gcp:eastus", "azure:us-east-1",
                                     "oracle:us-ashburn-1", "us-east-9", "aws:", ":us-east-1",
                                     "", None, "Atlantis"])
def test_unknown_names_are_none(unknown):
    assert geo.canonical_city(unknown) is None
    assert geo.coordinates(unknown) is None
    assert geo.place(unknown) is None and geo.region_label(unknown) is None


def test_the_table_is_well_formed():
    regions = cloud_regions.REGIONS
    counts = {p: sum(1 for k in regions if k.startswith(p + ":")) for p in cloud_regions.PROVIDERS}
    assert counts["aws"] >= 30 and counts["gcp"] >= 40 and counts["azure"] >= 60
    for name, (lat, lon, country, label) in regions.items():
        provider, _, code = name.partition(":")
        assert provider in cloud_regions.PROVIDERS and code == code.strip().lower() and code
        assert -90 <= lat <= 90 and -180 <= lon <= 180
        assert len(country) == 2 and country.isupper() and label
        assert geo.canonical_city(name) == name          # every region resolves to itself
    # A region code never shadows a city: cities are looked up first.
    city_keys = {c.casefold() for c in geo.CITIES} | set(geo.ALIASES)
    assert not city_keys & set(cloud_regions.BARE_CODES)
    assert not city_keys & set(regions)


def test_no_duplicate_keys_in_the_source():
    """A dict literal silently keeps the last of two equal keys: read the source to catch it."""
    for path, table in [(ROOT / "hulk/cloud_regions.py", "REGIONS"),
                        (ROOT / "hulk/geo.py", "CITIES")]:
        tree = ast.parse(path.read_text())
        literal = next(node.value for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
                       and getattr(node.target, "id", None) == table)
        keys = [k.value for k in literal.keys]
        assert len(keys) == len(set(keys)), path


def test_light_speed_flags_an_impossible_rtt_between_regions():
    virginia, sydney = geo.coordinates("aws:us-east-1"), geo.coordinates("aws:ap-southeast-2")
    bound = geo.min_rtt_ms(virginia, sydney)
    assert 150 < bound < 170          # about 15,700 km of fibre at 100 km per ms of RTT
    assert geo.min_rtt_ms(geo.coordinates("aws:us-east-1"), geo.coordinates("gcp:us-east4")) == 0


def test_the_ingest_check_rejects_a_too_fast_sample_between_regions(tmp_path):
    now = 1_790_000_000_000
    store = Store(tmp_path / "planner.sqlite", clock=lambda: now)
    service = IngestService(store, clock=lambda: now)
    for node_id, city in [("va", "aws:us-east-1"), ("syd", "ap-southeast-2")]:
        service.register(RegisterRequest(node_id, hostname=node_id, address="127.0.0.1",
                                         location=NodeLocation(city)))
    samples = tuple(ProbeSample(peer_id="syd", sent_at_ms=now - 1000, kind=int(ProbeKind.ICMP),
                                payload_bytes=56, lost=False, rtt_ms=rtt, timeout_ms=2000.0)
                    for rtt in (40.0, 200.0))
    result = service.report(ReportRequest("va", "b1", samples))
    assert (result.accepted, result.rejected) == (1, 1)
    assert [row["rtt_ms"] for row in store.raw_samples()] == [200.0]   # 40 ms is faster than light
    store.close()


def test_a_fleet_in_regions_has_coordinates_and_generates():
    node = Node(id="n1", city="aws:eu-central-1", gpus=1, gpu_name="A100", memory_gb=80)
    assert node.coordinates == geo.coordinates("Frankfurt")
    assert node.city_key == "aws:eu-central-1"
    fleet = generate_fleet(6, seed=1, cities=["aws:us-east-1", "gcp:europe-west4", "eastus"])
    assert isinstance(fleet, Fleet) and len(fleet.nodes) == 6
    assert {n.city for n in fleet.nodes} == {"aws:us-east-1", "gcp:europe-west4", "azure:eastus"}
    by_id = {n.id: n for n in fleet.nodes}
    for link in fleet.links:
        a, b = by_id[link.src], by_id[link.dst]
        assert link.rtt_ms >= geo.min_rtt_ms(a.coordinates, b.coordinates)
