"""The link-prediction models by name, and the one completion uses.

``chosen_model`` is the model the product completes links with: the winner of the link
prediction benchmark (bench/linkpred_bench.py, docs/BENCHMARKS.md "Link prediction") on
held-out measured pairs; docs/COSTMODEL.md section 2 says which and why.
"""

from __future__ import annotations

from planner.linkpred.controls import (DistanceModel, FormulaModel, ProviderMedianModel,
                                       VivaldiModel)
from planner.linkpred.controls_learned import BoostedModel, MatrixModel
from planner.linkpred.gnn import GnnLinkModel
from planner.linkpred.graph import LinkModel

MODELS: dict[str, LinkModel] = {
    "formula": FormulaModel(),
    "provider median": ProviderMedianModel(),
    "distance": DistanceModel(),
    "vivaldi": VivaldiModel(),
    "matrix": MatrixModel(),
    "boosted": BoostedModel(),
    "gnn": GnnLinkModel(),
}

# The lowest p90 throughput error on held-out pairs (50% hidden, and a cold region with 3
# measured pairs) on all four networks of bench/linkpred_bench.py (docs/BENCHMARKS.md).
CHOSEN = "gnn"


def chosen_model() -> LinkModel:
    """The model completion uses (the benchmark's winner)."""
    return MODELS[CHOSEN]
