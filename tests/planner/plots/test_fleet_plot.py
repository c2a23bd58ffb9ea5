"""The fleet plot: close cities' labels never overlap, and no city loses its label."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import pytest

from hulk import geo
from planner.core.fleet import Fleet, Link, Node
from planner.plots.fleet import (CITY_LABEL_GID, MAX_NAMES_PER_LABEL, draw_fleet, label_text,
                                 plot_fleet)


def _fleet(cities: list[tuple[str, int]], *, mainz: int = 0) -> Fleet:
    nodes = [Node(id=f"{city.replace(':', '-')}-{k}", city=city, gpus=2, gpu_name="A100",
                  memory_gb=160) for city, count in cities for k in range(count)]
    nodes += [Node(id=f"mainz-{k}", city="Mainz", gpus=1, gpu_name="A100", memory_gb=80,
                   latitude=49.99, longitude=8.25) for k in range(mainz)]
    links = [Link(a.id, b.id, 1.0 + geo.min_rtt_ms(a.coordinates, b.coordinates) * 1.5, samples=3)
             for a, b in itertools.combinations(nodes, 2)]
    return Fleet(tuple(nodes), tuple(links), name="close")


def _labels(fig):
    ax = fig.axes[0]
    fig.canvas.draw()                  # measure what is drawn
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_gid() == CITY_LABEL_GID]
    return labels, [t.get_window_extent(renderer) for t in labels]


CLOSE = [("Frankfurt", 2), ("aws:eu-central-1", 3), ("gcp:europe-west3", 1), ("Amsterdam", 1),
         ("gcp:europe-west4", 2), ("Brussels", 1), ("Paris", 1), ("London", 2),
         ("Tokyo", 2), ("Sydney", 1), ("aws:us-east-1", 2), ("gcp:us-east4", 1)]


@pytest.mark.parametrize("dpi", [72, 150])
def test_close_cities_labels_do_not_overlap_and_every_city_is_named(dpi):
    fleet = _fleet(CLOSE, mainz=2)
    fig = draw_fleet(fleet, dpi=dpi)
    try:
        labels, boxes = _labels(fig)
        assert len(labels) >= 3                    # far apart cities keep labels of their own
        for (a, box_a), (b, box_b) in itertools.combinations(zip(labels, boxes), 2):
            assert not box_a.overlaps(box_b), (a.get_text(), b.get_text())
        text = "\n".join(t.get_text() for t in labels)
        for city, count in CLOSE + [("Mainz", 2)]:
            assert text.count(f"{city} ({count})") == 1, city
        # Frankfurt and the two Frankfurt regions sit on one point: one label names them all.
        shared = [t.get_text() for t in labels if "aws:eu-central-1" in t.get_text()]
        assert len(shared) == 1 and "gcp:europe-west3" in shared[0] and "Frankfurt" in shared[0]
    finally:
        plt.close(fig)


def test_far_apart_cities_keep_one_label_each(tmp_path):
    fleet = _fleet([("Tokyo", 1), ("London", 2), ("aws:sa-east-1", 1)])
    fig = draw_fleet(fleet)
    try:
        labels, _ = _labels(fig)
        assert sorted(t.get_text() for t in labels) == ["London (2)", "Tokyo (1)",
                                                        "aws:sa-east-1 (1)"]
    finally:
        plt.close(fig)
    out = plot_fleet(fleet, tmp_path / "fleet.png", dpi=60)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_label_for_very_many_cities_names_the_biggest_and_counts_the_rest():
    members = [(f"c{k} ({k + 1})", float(k), 0.0, k + 1) for k in range(MAX_NAMES_PER_LABEL + 3)]
    text = label_text(members)
    assert text.endswith(f"and {len(members) - MAX_NAMES_PER_LABEL + 1} more cities")
    named = [m[0] for m in members if m[0] in text]
    assert named == [m[0] for m in members[-(MAX_NAMES_PER_LABEL - 1):]]   # the biggest ones
    assert len(text.splitlines()) <= MAX_NAMES_PER_LABEL // 2 + 1


def _segments(fig):
    from matplotlib.collections import LineCollection

    lines = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    return lines[0] if lines else None


def test_a_small_fleet_draws_every_measured_node_pair():
    fleet = _fleet([("Paris", 3), ("Tokyo", 2)])
    fig = draw_fleet(fleet)
    assert len(_segments(fig).get_segments()) == 10     # 5 nodes, every pair measured
    assert "10 of 10 pairs measured" in fig.axes[0].get_title()
    plt.close(fig)


def test_a_large_regional_fleet_draws_one_line_per_pair_of_sites():
    from planner.core.generate import generate_regional_fleet
    from planner.plots.fleet import MAX_NODE_LINKS

    fleet = generate_regional_fleet(240, 6, seed=3)      # 28,680 node pairs, site links only
    assert 240 * 239 // 2 > MAX_NODE_LINKS
    fig = draw_fleet(fleet)
    lines = _segments(fig)
    linked = {frozenset((k.src, k.dst)) for k in fleet.site_links if k.src != k.dst}
    assert len(lines.get_segments()) == len(linked) <= 15     # 6 sites: at most 15 pairs
    title = fig.axes[0].get_title()
    assert "one line per pair of the 6 sites" in title and f"{len(linked)} measured" in title
    assert "0 of 28,680 pairs measured" in title   # no node links: the sites carry the figures
    plt.close(fig)
