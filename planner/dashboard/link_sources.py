"""Where each site pair's figures on the dashboard come from: measured, predicted or formula.

Pure: a :class:`LinkSummary` (the measured links between sites) and serve's link prediction
(``planner.service.link_model``; None before it is fitted) in, a summary out whose every link
says its ``source`` (of the RTT) and ``bandwidth_source``, measured links first and then the
site pairs only the prediction covers, each with its conservative bound where predicted
(``rtt_hi_ms``, ``bandwidth_lo_gbps``: the figures the planner uses for it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from planner.dashboard.view import LinkSummary, number, rtt_colour
from planner.linkpred.graph import LinkPrediction, Source

MEASURED = Source.MEASURED.label


def _figures(prediction: LinkPrediction, a: int, b: int, *, rtt: bool) -> dict[str, Any]:
    """The prediction's figures for sites ``a``, ``b``: bandwidth always, RTT with ``rtt``."""
    out: dict[str, Any] = {}
    if rtt:
        source = Source(int(prediction.rtt_source[a, b]))
        out.update(source=source.label, rtt_ms=number(prediction.rtt_ms[a, b]),
                   rtt_hi_ms=number(prediction.rtt_hi_ms[a, b])
                   if source == Source.PREDICTED else None)
    source = Source(int(prediction.gbps_source[a, b]))
    out.update(bandwidth_source=source.label, bandwidth_gbps=number(prediction.gbps[a, b]),
               bandwidth_lo_gbps=number(prediction.gbps_lo[a, b])
               if source == Source.PREDICTED else None)
    return out


def marked_links(summary: LinkSummary, prediction: LinkPrediction | None) -> LinkSummary:
    """``summary`` with every link's source; with a prediction, the site pairs no node link
    measured added after the measured ones (their colour from the predicted RTT)."""
    index = {} if prediction is None else {site: k for k, site in enumerate(prediction.sites)}
    out, shown = [], set()
    for link in summary.between:
        marked = {**link, "source": MEASURED, "rtt_hi_ms": None, "bandwidth_lo_gbps": None,
                  "bandwidth_source": MEASURED if link.get("bandwidth_gbps") is not None else None}
        a, b = index.get(link["a"]), index.get(link["b"])
        if marked["bandwidth_source"] is None and a is not None and b is not None:
            marked.update(_figures(prediction, a, b, rtt=False))
        out.append(marked)
        shown.add(frozenset((link["a"], link["b"])))
    if prediction is not None:
        sites = prediction.sites
        upper_i, upper_j = np.triu_indices(len(sites), k=1)
        added = []
        for a, b in zip(upper_i.tolist(), upper_j.tolist()):
            if frozenset((sites[a], sites[b])) in shown:
                continue
            figures = _figures(prediction, a, b, rtt=True)
            if figures["rtt_ms"] is None:
                continue      # no route: nothing to draw
            first, second = sorted((sites[a], sites[b]))
            added.append({"a": first, "b": second, "colour": rtt_colour(figures["rtt_ms"]),
                          "min_ms": None, "max_ms": None, "loss": None, "pairs": 0,
                          "samples": 0, "model": prediction.model, **figures})
        added.sort(key=lambda l: (l["rtt_ms"], l["a"], l["b"]))
        out.extend(added)
    return replace(summary, between=tuple(out))
