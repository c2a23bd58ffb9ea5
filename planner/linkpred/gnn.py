"""Link prediction by a graph network over a fleet's measured site pairs (transductive: fitted
on one fleet's measured pairs, it predicts every pair of that fleet's sites).

Each site starts from what is known of it (provider, place on the globe, GPUs) and from the
pairs measured at it (mean standardised log throughput and log RTT, how many); two
:class:`~planner.linkpred.gnn_layers.MeasuredPairConv` layers pass messages along measured
pairs; a decoder reads a pair's two sites and its own features (distance, providers, its RTT
where measured) and gives the 0.2/0.5/0.8 quantiles of log throughput and log RTT (pinball
loss). Training hides part of the measured pairs from the messages at every step and learns
them back, so the network learns to predict a pair from the rest of the graph, never to copy
it; a seeded share is held out for early stopping. Measured figures stay as measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.linkpred.graph import SiteGraph

if TYPE_CHECKING:
    from planner.linkpred.gnn_fit import FittedGnnLinkModel


@dataclass(frozen=True)
class GnnConfig:
    """The network's size and how it is trained (defaults measured on the link-prediction
    benchmark's fleets, bench/linkpred_bench.py)."""

    hidden: int = 32
    layers: int = 2
    max_epochs: int = 300
    patience: int = 40          # epochs without a better held-out loss before stopping
    check_every: int = 4        # epochs between held-out checks
    learning_rate: float = 0.02
    weight_decay: float = 1e-4
    holdout_share: float = 0.15  # measured pairs kept for early stopping
    target_share: float = 0.25   # training pairs hidden from the messages at each step
    cold_share: float = 0.1      # sites that lose most of their pairs at a step (cold start)
    cold_drop: float = 0.85
    rtt_shown: float = 0.3       # share of target pairs whose measured RTT the decoder sees


@dataclass(frozen=True)
class GnnLinkModel:
    """The link predictor: :meth:`fit` trains on one graph's measured pairs."""

    config: GnnConfig = GnnConfig()
    name: str = "gnn"

    def fit(self, graph: SiteGraph, seed: int = 0) -> "FittedGnnLinkModel":
        # torch and PyG take seconds to import: only a fit pays for them, not the registry.
        from planner.linkpred.gnn_fit import fit

        return fit(self.config, self.name, graph, seed)


def load_fitted(data: bytes) -> "FittedGnnLinkModel":
    """A fitted model from :meth:`FittedGnnLinkModel.to_bytes`'s bytes."""
    from planner.linkpred.gnn_fit import FittedGnnLinkModel

    return FittedGnnLinkModel.from_bytes(data)
