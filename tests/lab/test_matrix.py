"""The latency matrix: the default cities, scaling, and custom files (pure values)."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict

import pytest

from hulk import geo
from hulk.errors import InputError
from lab import matrix as lm


def test_table1_is_symmetric_and_respects_the_speed_of_light():
    m = lm.table1()
    assert m.n == 12
    assert [h.city for h in m.hosts] == list(lm.TABLE1_CITIES)
    for i in range(m.n):
        assert m.rtt(i, i) == 0
        for j in range(m.n):
            assert m.rtt(i, j) == m.rtt(j, i)
            if i != j:
                bound = geo.min_rtt_ms(geo.coordinates(m.hosts[i].city), geo.coordinates(m.hosts[j].city))
                assert m.rtt(i, j) >= bound


def test_more_hosts_than_cities_cycle_with_unique_names():
    m = lm.table1(14)
    assert m.names[0] == "beijing-1" and m.names[12] == "beijing-2"
    assert m.rtt(0, 12) == lm.BASE_MS  # same city
    assert len(set(m.names)) == 14


def test_scale_multiplies_every_rtt():
    m = lm.table1(4)
    s = m.scaled(0.25)
    assert all(abs(s.rtt(i, j) - 0.25 * m.rtt(i, j)) < 1e-12 for i in range(4) for j in range(4))
    with pytest.raises(InputError, match="--scale"):
        m.scaled(0)


def test_csv_and_yaml_round_trip(tmp_path):
    m = lm.table1(3)
    path = tmp_path / "m.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([""] + m.names)
        for name, row in zip(m.names, m.as_lists()):
            w.writerow([name] + row)
    assert lm.load(path).rtt_ms == m.rtt_ms
    y = tmp_path / "m.yaml"
    y.write_text("hosts:\n  - {name: a, city: Beijing}\n  - {name: b, city: Tokyo}\n"
                 "rtt_ms: [[0, 40], [40, 0]]\n")
    loaded = lm.load(y)
    assert loaded.names == ["a", "b"] and loaded.rtt(0, 1) == 40
    # Cities alone: the RTTs are derived.
    y.write_text("hosts:\n  - {name: a, city: Beijing}\n  - {name: b, city: Tokyo}\n")
    assert lm.load(y).rtt(0, 1) == pytest.approx(lm.city_rtt_ms("Beijing", "Tokyo"))


@pytest.mark.parametrize("text, suffix, message", [
    (",a,b\na,0,x\nb,5,0\n", ".csv", r"m\.csv:2: a->b: expected a number"),
    (",a,b\na,0,5\nb,6,0\n", ".csv", "symmetric"),
    (",a,b\na,0,5\n", ".csv", r"m\.csv:1: expected 2 rows"),
    ("hosts: [a, b]\nrtt_ms: [[0, 1]]\n", ".yaml", r"rtt_ms: expected a 2x2"),
    ("hosts: [{name: a, city: Atlantis}]\n", ".yaml", r"hosts\[0\]\.city: unknown city"),
    ("hosts: [a, b\n", ".yaml", r"m\.yaml:\d+: invalid YAML"),
])
def test_bad_files_name_the_file_and_the_field(tmp_path, text, suffix, message):
    path = tmp_path / f"m{suffix}"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        lm.load(path)


def test_modelled_rtts_rank_city_pairs_like_the_papers_measurements(paper_fleet_dir):
    """Our distance model is not the paper's data, but it must order city pairs the same way
    broadly (the paper's China-Europe routes are slower than distance says; see lab/README.md)."""
    from scipy.stats import spearmanr

    with (paper_fleet_dir / "node_feature.csv").open() as fh:
        city = {r["node"]: geo.canonical_city(r["City"]) for r in csv.DictReader(fh)}
    measured = defaultdict(list)
    for line in (paper_fleet_dir / "edge.txt").read_text().split("\n"):
        if line.strip():
            a, b, w = line.split()
            if city[a] != city[b]:
                measured[tuple(sorted((city[a], city[b])))].append(float(w))
    pairs = sorted(measured)
    paper = [statistics.median(measured[p]) for p in pairs]
    model = [lm.city_rtt_ms(*p) for p in pairs]
    rho = spearmanr(paper, model).statistic
    assert rho > 0.3, f"rank correlation with the paper's RTTs fell to {rho:.2f}"
