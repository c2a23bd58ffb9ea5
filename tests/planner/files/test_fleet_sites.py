"""Fleet JSON with sites and site links, the column-by-column link reader, and hostile site input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hulk.errors import InputError
from planner.core.fleet import LinkTable, complete
from planner.core.generate import generate_fleet, generate_regional_fleet
from planner.files.fleet import load_fleet, load_fleet_with_report, save_fleet_json

NODE = {"gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB", "memory_gb": 320}


def doc(**extra) -> dict:
    base = {"nodes": [dict(NODE, id="a1", city="Paris", site="par-1"),
                      dict(NODE, id="a2", city="Paris", site="par-1"),
                      dict(NODE, id="t1", city="Tokyo")],
            "sites": [{"id": "par-1", "lat": 48.85, "lon": 2.35}],
            "site_links": [{"src": "par-1", "dst": "Tokyo", "rtt_ms": 220.0, "samples": 30},
                           {"src": "par-1", "dst": "par-1", "rtt_ms": 0.3}]}
    base.update(extra)
    return base


def write(tmp_path: Path, document: dict | str) -> Path:
    path = tmp_path / "fleet.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document, indent=1))
    return path


def test_sites_and_site_links_read_and_complete(tmp_path):
    fleet, issues = load_fleet_with_report(write(tmp_path, doc()))
    assert issues == [] and [s.id for s in fleet.sites] == ["par-1"]
    assert fleet.nodes[0].site == "par-1" and fleet.nodes[2].site_key == "Tokyo"
    net = complete(fleet)
    assert net.rtt_ms[0, 2] == 220.0 and net.rtt_ms[0, 1] == 0.3


def test_regional_fleet_round_trips(tmp_path):
    fleet = generate_regional_fleet(120, 6, seed=1)
    path = tmp_path / "regional.json"
    save_fleet_json(fleet, path)
    again = load_fleet(path)
    assert again.nodes == fleet.nodes and again.sites == fleet.sites
    assert again.site_links == fleet.site_links and not again.links
    assert np.array_equal(complete(again).rtt_ms, complete(fleet).rtt_ms)


def test_old_full_mesh_reads_into_columns_with_the_same_completion(tmp_path):
    fleet = generate_fleet(50, seed=2, missing_fraction=0.2)
    path = tmp_path / "mesh.json"
    save_fleet_json(fleet, path)
    text = path.read_text()
    assert '"site' not in text      # a fleet without sites has no site keys
    again = load_fleet(path)
    assert isinstance(again.links, LinkTable) and again.links == fleet.links
    a, b = complete(fleet), complete(again)
    assert np.array_equal(a.rtt_ms, b.rtt_ms) and np.array_equal(a.bw, b.bw)


def test_a_flaw_deep_in_a_large_file_is_named_by_the_careful_reader(tmp_path):
    fleet = generate_fleet(30, seed=3, missing_fraction=0.0)
    path = tmp_path / "mesh.json"
    save_fleet_json(fleet, path)
    document = json.loads(path.read_text())
    document["links"][400]["rtt_ms"] = -1
    with pytest.raises(InputError) as caught:
        load_fleet(write(tmp_path, document))
    assert caught.value.field == "links[400].rtt_ms" and caught.value.line is not None
    document["links"][400]["rtt_ms"] = 5.0
    document["links"].append(dict(document["links"][7]))
    fleet2, issues = load_fleet_with_report(write(tmp_path, document))
    assert len(fleet2.links) == 435 and len(issues) == 1 and "duplicate" in issues[0].message


@pytest.mark.parametrize("change, field, fragment", [
    (lambda d: d["nodes"][1].update(site="nowhere"), "nodes[1].site", "unknown site 'nowhere'"),
    (lambda d: d["site_links"][0].update(dst="Atlantis"), "site_links[0].dst",
     "unknown site 'Atlantis'"),
    (lambda d: d["sites"].append({"id": "par-1"}), "sites[1].id", "used twice"),
    (lambda d: d["sites"][0].update(lat=123), "sites[0].lat", "<= 90"),
    (lambda d: d["sites"][0].pop("lon"), "sites[0].lon", "both lat and lon"),
    (lambda d: d["site_links"][1].update(rtt_ms="fast"), "site_links[1].rtt_ms", "milliseconds of RTT"),
    (lambda d: d["site_links"][0].update(loss=2), "site_links[0].loss", "a loss fraction between 0 and 1"),
    (lambda d: d.update(site_links={"src": "x"}), "site_links", "an array of site link"),
    (lambda d: d.update(sites=[7]), "sites[0]", "an object"),
])
def test_hostile_site_input_is_one_line(tmp_path, change, field, fragment):
    document = doc()
    change(document)
    path = write(tmp_path, document)
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    message = str(caught.value)
    assert caught.value.field == field and fragment in message
    assert "\n" not in message and str(path) in message and caught.value.line


def test_duplicate_site_links_are_averaged_and_reported(tmp_path):
    document = doc()
    document["site_links"].append({"src": "par-1", "dst": "Tokyo", "rtt_ms": 240.0})
    document["sites"][0]["colour"] = "blue"
    fleet, issues = load_fleet_with_report(write(tmp_path, document))
    messages = [i.message for i in issues]
    assert any("conflicting duplicate of the site link par-1 -> Tokyo" in m for m in messages)
    assert any("unknown field sites[].colour ignored" in m for m in messages)
    assert complete(fleet).rtt_ms[0, 2] == 230.0


def _dict_path(monkeypatch):
    """Turn the msgspec decode off, so the file is read the orjson/dict way."""
    import planner.files.fleet as fleet_files

    monkeypatch.setattr(fleet_files, "_typed_loads", lambda data: None)


def test_typed_link_records_read_exactly_as_the_dict_path(tmp_path, monkeypatch):
    fleet = generate_fleet(40, seed=4, missing_fraction=0.1)
    path = tmp_path / "mesh.json"
    save_fleet_json(fleet, path)
    document = json.loads(path.read_text())
    links = document["links"]
    links[0]["rtt_ms"] = 7                          # an integer RTT
    links[1]["bandwidth_gbps"] = 2.5                # a measured bandwidth among nulls
    del links[2]["loss"], links[2]["samples"]       # optional fields left out
    links[3]["loss"] = None
    write(tmp_path, document)
    typed, typed_issues = load_fleet_with_report(tmp_path / "fleet.json")
    _dict_path(monkeypatch)
    plain, plain_issues = load_fleet_with_report(tmp_path / "fleet.json")
    assert isinstance(typed.links, LinkTable) and typed.links == plain.links
    assert typed.nodes == plain.nodes and typed_issues == plain_issues == []
    assert typed.links.rtt_ms[0] == 7.0 and typed.links.bandwidth_gbps[1] == 2.5
    assert typed.links.loss[2] == 0.0 and typed.links.samples[2] == 0
    assert np.isnan(typed.links.bandwidth_gbps[0])


@pytest.mark.parametrize("flaw, expected", [
    (lambda links: links[5].update(imputed=True), "imputed link"),
    (lambda links: links[5].update(colour="red"), "unknown field links[].colour"),
    (lambda links: links.append(dict(links[5])), "duplicate of the link"),
])
def test_links_the_typed_path_refuses_are_reported_by_the_careful_reader(tmp_path, flaw,
                                                                        expected):
    fleet = generate_fleet(12, seed=5, missing_fraction=0.0)
    path = tmp_path / "mesh.json"
    save_fleet_json(fleet, path)
    document = json.loads(path.read_text())
    flaw(document["links"])
    _, issues = load_fleet_with_report(write(tmp_path, document))
    assert len(issues) == 1 and expected in issues[0].message and issues[0].line


@pytest.mark.parametrize("flaw, expected", [
    (lambda links: links[5].update(dst=links[5]["src"]), r"links\[5\]\.dst: a link from node"),
    (lambda links: links.append(dict(links[5], rtt_ms=links[5]["rtt_ms"] * 3)),
     r"conflicting duplicate of the link"),
])
def test_links_the_typed_path_refuses_and_no_repair_can_mend_are_errors(tmp_path, flaw,
                                                                         expected):
    fleet = generate_fleet(12, seed=5, missing_fraction=0.0)
    path = tmp_path / "mesh.json"
    save_fleet_json(fleet, path)
    document = json.loads(path.read_text())
    flaw(document["links"])
    with pytest.raises(InputError, match=expected):
        load_fleet_with_report(write(tmp_path, document))


@pytest.mark.parametrize("value, fragment", [
    ("true", "got true"), ("1e400", "got Infinity"), ('"7"', 'got "7"'), ("-3", "got -3"),
    ("1e300", "between 0 and 60000, got 1e+300")])
def test_bad_rtt_values_the_typed_path_refuses_are_named(tmp_path, value, fragment):
    fleet = generate_fleet(6, seed=6, missing_fraction=0.0)
    path = tmp_path / "mesh.json"
    save_fleet_json(fleet, path)
    text = path.read_text()
    first = text.index('"rtt_ms": ', text.index('"links"'))
    end = text.index(",", first)
    path.write_text(text[:first] + '"rtt_ms": ' + value + text[end:])
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
