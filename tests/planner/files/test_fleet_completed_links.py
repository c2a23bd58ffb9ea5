"""The fields `fleet complete` writes on site links (source, rtt_hi_ms, bandwidth_lo_gbps):
read and written back, checked against their bounds, and absent from files without them."""

from __future__ import annotations

import json

import pytest

from hulk.errors import InputError
from planner.core.fleet import Fleet, Node, Site, SiteLink
from planner.files import fleet_links
from planner.files.fleet import fleet_to_json, load_fleet, save_fleet_json

NODES = [{"id": "a1", "site": "a", "gpus": 8, "gpu_name": "A100", "memory_gb": 640},
         {"id": "b1", "site": "b", "gpus": 8, "gpu_name": "A100", "memory_gb": 640},
         {"id": "c1", "site": "c", "gpus": 8, "gpu_name": "A100", "memory_gb": 640}]
SITES = [{"id": "a"}, {"id": "b"}, {"id": "c"}]


def _write(tmp_path, site_links) -> str:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"name": "f", "nodes": NODES, "sites": SITES,
                                "site_links": site_links}, indent=1))
    return str(path)


def test_completed_site_links_round_trip(tmp_path):
    links = (SiteLink("a", "b", 10.0, 5.0, samples=3),
             SiteLink("a", "c", 20.0, 4.0, source="predicted", rtt_hi_ms=26.5,
                      bandwidth_lo_gbps=1.25),
             SiteLink("b", "c", 30.0, None, source="formula", rtt_hi_ms=30.0))
    fleet = Fleet(tuple(Node(n["id"], gpus=8, gpu_name="A100", memory_gb=640, site=n["site"])
                        for n in NODES), (), name="f", sites=tuple(Site(s["id"]) for s in SITES),
                  site_links=links)
    path = tmp_path / "out.json"
    save_fleet_json(fleet, path)
    assert load_fleet(path).site_links == links
    written = json.loads(path.read_text())["site_links"]
    assert written[0]["source"] == "measured" and "rtt_hi_ms" not in written[0]   # named
    assert written[1]["source"] == "predicted" and written[1]["bandwidth_lo_gbps"] == 1.25
    assert "bandwidth_lo_gbps" not in written[2]


def test_a_file_without_the_fields_reads_as_before_on_the_column_path(tmp_path, monkeypatch):
    def careful(*args, **kwargs):
        raise AssertionError("plain site links should not need the per-link reader")

    monkeypatch.setattr(fleet_links, "_careful_links", careful)
    path = _write(tmp_path, [{"src": "a", "dst": "b", "rtt_ms": 10.0, "bandwidth_gbps": 2.0}])
    (link,) = load_fleet(path).site_links
    assert link == SiteLink("a", "b", 10.0, 2.0)
    assert (link.source, link.rtt_hi_ms, link.bandwidth_lo_gbps) == ("measured", None, None)
    assert fleet_to_json(load_fleet(path))["site_links"] == [
        {"src": "a", "dst": "b", "rtt_ms": 10.0, "bandwidth_gbps": 2.0, "loss": 0.0,
         "samples": 0, "source": "measured"}]


@pytest.mark.parametrize("extra, field, expected", [
    ({"source": "guessed"}, "source", "one of measured, predicted, formula"),
    ({"rtt_source": "guessed"}, "rtt_source", "one of measured, predicted, formula"),
    ({"source": 3}, "source", "one of measured, predicted, formula"),
    ({"source": "predicted", "rtt_hi_ms": 5.0}, "rtt_hi_ms", "at least rtt_ms (10)"),
    ({"source": "predicted", "rtt_hi_ms": -1}, "rtt_hi_ms", "milliseconds of RTT"),
    ({"source": "predicted", "rtt_hi_ms": "far"}, "rtt_hi_ms", "milliseconds of RTT"),
    ({"source": "predicted", "bandwidth_lo_gbps": 3.0}, "bandwidth_lo_gbps",
     "at most bandwidth_gbps (2)"),
    ({"source": "predicted", "bandwidth_gbps": None, "bandwidth_lo_gbps": 1.0},
     "bandwidth_lo_gbps", "none given"),
    ({"source": "predicted", "bandwidth_lo_gbps": 0}, "bandwidth_lo_gbps", "Gbit/s"),
])
def test_bad_completion_fields_are_one_line_errors_naming_the_field(tmp_path, extra, field,
                                                                      expected):
    link = {"src": "a", "dst": "b", "rtt_ms": 10.0, "bandwidth_gbps": 2.0, **extra}
    path = _write(tmp_path, [{"src": "a", "dst": "c", "rtt_ms": 1.0}, link])
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    message = str(caught.value)
    assert "\n" not in message
    assert f"site_links[1].{field}" in message and expected in message
    assert path in message


def test_duplicate_completed_links_keep_the_conservative_figures(tmp_path):
    path = _write(tmp_path, [
        {"src": "a", "dst": "b", "rtt_ms": 10.0, "bandwidth_gbps": 4.0, "source": "predicted",
         "rtt_hi_ms": 12.0, "bandwidth_lo_gbps": 3.0},
        {"src": "a", "dst": "b", "rtt_ms": 20.0, "bandwidth_gbps": 2.0, "source": "predicted",
         "rtt_hi_ms": 25.0, "bandwidth_lo_gbps": 1.0}])
    (link,) = load_fleet(path).site_links
    assert (link.rtt_ms, link.bandwidth_gbps) == (15.0, 3.0)
    assert (link.rtt_hi_ms, link.bandwidth_lo_gbps) == (25.0, 1.0)
    assert link.source == "predicted"


def test_a_measured_site_link_is_written_with_its_source_named():
    from planner.core.fleet import SiteLink
    from planner.files.fleet import _site_link_json
    item = _site_link_json(SiteLink("tokyo", "osaka", rtt_ms=8.0, bandwidth_gbps=1.5, samples=12))
    assert item["source"] == "measured" and item["samples"] == 12


def test_a_measured_throughput_with_a_completed_rtt_round_trips(tmp_path):
    """`rtt_source` names where the RTT of a measured throughput came from; absent, as source."""
    links = (SiteLink("a", "b", 421.0, 0.19, rtt_source="formula"),
             SiteLink("a", "c", 20.0, 4.0, samples=3, rtt_source="predicted", rtt_hi_ms=26.0))
    fleet = Fleet(tuple(Node(n["id"], gpus=8, gpu_name="A100", memory_gb=640, site=n["site"])
                        for n in NODES), (), name="f", sites=tuple(Site(s["id"]) for s in SITES),
                  site_links=links)
    path = tmp_path / "out.json"
    save_fleet_json(fleet, path)
    again = load_fleet(path).site_links
    assert again == links
    assert [k.rtt_measured for k in again] == [False, False]
    assert again[1].planned_rtt_ms == 26.0 and again[1].planned_bandwidth_gbps == 4.0
    assert "rtt_source" not in json.dumps(fleet_to_json(
        Fleet(fleet.nodes, (), sites=fleet.sites, site_links=(SiteLink("a", "b", 1.0),))))
