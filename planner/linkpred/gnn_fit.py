"""The link predictor's features, training, prediction and storage (planner/linkpred/gnn.py
says what it does; this module holds the torch side, imported only when a model is fitted or
loaded, so the model registry stays cheap to import).
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from planner.linkpred.controls_base import assemble, relay_rtt
from planner.linkpred.graph import (HIGH_QUANTILE, LOW_QUANTILE, PROVIDERS, LinkPrediction,
                                    SiteGraph, Source)
from planner.linkpred.gnn import GnnConfig
from planner.linkpred.gnn_layers import QuantileLinkGnn
from planner.linkpred.gnn_optim import Adam

QUANTILES = (LOW_QUANTILE, 0.5, HIGH_QUANTILE)
QUANTILE_LEVELS = torch.tensor(QUANTILES)
THROUGHPUT, RTT = 0, 1
PROVIDER_CLASSES = (*PROVIDERS, "")                     # "" is an unknown provider
PROVIDER_PAIRS = [(a, b) for k, a in enumerate(PROVIDER_CLASSES) for b in PROVIDER_CLASSES[k:]]
SITE_DIM = len(PROVIDER_CLASSES) + 3 + 1 + 1             # providers, unit vector, no place, GPUs
STATS_DIM = 4
PAIR_DIM = 3 + len(PROVIDER_PAIRS)                        # distance, no distance, same provider
EDGE_DIM = 4 + PAIR_DIM
DECODER_PAIR_DIM = PAIR_DIM + 2                           # + the pair's RTT where shown
MIN_TRAINING_PAIRS = 6      # fewer measured figures of a quantity than this: nothing to learn
EARTH_RADIUS_KM = 6371.0
PREDICT_CHUNK = 200_000     # pairs decoded at once (memory stays flat on large fleets)


# ------------------------------------------------------------------------------------ features

def site_features(graph: SiteGraph) -> np.ndarray:
    """(S, SITE_DIM): provider one-hot, the place as a unit vector (0 and a flag where
    unknown), log GPUs."""
    s = graph.n_sites
    out = np.zeros((s, SITE_DIM), dtype=np.float32)
    for k, provider in enumerate(graph.provider):
        name = provider if provider in PROVIDER_CLASSES else ""
        out[k, PROVIDER_CLASSES.index(name)] = 1.0
    lat, lon = np.radians(graph.latitude.astype(float)), np.radians(graph.longitude.astype(float))
    known = np.isfinite(lat) & np.isfinite(lon)
    p = len(PROVIDER_CLASSES)
    out[known, p] = np.sin(lat[known])
    out[known, p + 1] = np.cos(lat[known]) * np.sin(lon[known])
    out[known, p + 2] = np.cos(lat[known]) * np.cos(lon[known])
    out[~known, p + 3] = 1.0
    out[:, p + 4] = np.log1p(np.maximum(graph.gpus.astype(float), 0.0)) / 5.0
    return out


def great_circle_km(graph: SiteGraph, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Haversine distance of each pair (NaN where either place is unknown)."""
    lat, lon = np.radians(graph.latitude.astype(float)), np.radians(graph.longitude.astype(float))
    h = (np.sin((lat[b] - lat[a]) / 2) ** 2
         + np.cos(lat[a]) * np.cos(lat[b]) * np.sin((lon[b] - lon[a]) / 2) ** 2)
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.minimum(1.0, np.sqrt(h)))


def pair_features(graph: SiteGraph, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(P, PAIR_DIM), symmetric in a and b: log distance (0 and a flag where unknown), same
    provider, the unordered provider pair one-hot."""
    km = great_circle_km(graph, a, b)
    known = np.isfinite(km)
    out = np.zeros((len(a), PAIR_DIM), dtype=np.float32)
    out[known, 0] = (np.log1p(km[known] / 100.0) - 3.0) / 1.5
    out[~known, 1] = 1.0
    classes = np.array([PROVIDER_CLASSES.index(p if p in PROVIDER_CLASSES else "")
                        for p in graph.provider])
    ca, cb = classes[a], classes[b]
    out[:, 2] = ca == cb
    lo, hi = np.minimum(ca, cb), np.maximum(ca, cb)
    n = len(PROVIDER_CLASSES)
    pair_index = lo * n - lo * (lo - 1) // 2 + (hi - lo)   # row-major upper triangle
    out[np.arange(len(a)), 3 + pair_index] = 1.0
    return out


@dataclass(frozen=True)
class Scale:
    """Mean and spread of log throughput and log RTT over the training pairs."""

    log_gbps: tuple[float, float]
    log_rtt: tuple[float, float]

    @staticmethod
    def of(graph: SiteGraph, rows: np.ndarray) -> "Scale":
        def moments(values: np.ndarray) -> tuple[float, float]:
            logs = np.log(values[np.isfinite(values) & (values > 0)])
            if len(logs) == 0:
                return 0.0, 1.0
            return float(logs.mean()), float(max(logs.std(), 0.1))
        return Scale(moments(graph.gbps[rows]), moments(graph.rtt_ms[rows]))


def standardised(values: np.ndarray, moments: tuple[float, float]) -> np.ndarray:
    """(log v - mean) / spread, NaN where v is missing or not positive."""
    v = np.where(np.isfinite(values) & (values > 0), values, np.nan)
    return ((np.log(v) - moments[0]) / moments[1]).astype(np.float32)


class Inputs:
    """A graph's measured pairs as tensors, built once per fit or predict."""

    def __init__(self, graph: SiteGraph, scale: Scale) -> None:
        self.n_sites = graph.n_sites
        self.pairs_array = np.stack([graph.i, graph.j]).astype(np.int64)
        self.pairs = torch.as_tensor(self.pairs_array)
        self.pair_attr = torch.as_tensor(pair_features(graph, graph.i, graph.j))
        self.site_x = torch.as_tensor(site_features(graph))
        self.z = torch.as_tensor(np.stack([standardised(graph.gbps, scale.log_gbps),
                                           standardised(graph.rtt_ms, scale.log_rtt)], axis=1))
        self.known = torch.isfinite(self.z)
        # Per pair, what ``messages`` reads of it, built once: each step only picks rows.
        z, known = torch.nan_to_num(self.z), self.known.float()
        self.filled_z, self.known_flag = z, known
        self.edge_attr = torch.cat([torch.stack([z[:, 0], known[:, 0], z[:, 1], known[:, 1]], 1),
                                    self.pair_attr], dim=1)

    def messages(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Site features with statistics of the ``rows`` pairs, and those pairs as edges both
        ways with their figures: what the network may read."""
        pairs = self.pairs.index_select(1, rows)
        z, known = self.filled_z.index_select(0, rows), self.known_flag.index_select(0, rows)
        ends = torch.cat([pairs[0], pairs[1]])
        sums = torch.zeros(self.n_sites, 2).index_add_(0, ends, torch.cat([z, z]))
        counts = torch.zeros(self.n_sites, 2).index_add_(0, ends, torch.cat([known, known]))
        stats = torch.cat([sums / counts.clamp(min=1.0),
                           torch.log1p(counts) / float(np.log1p(self.n_sites))], dim=1)
        x = torch.cat([self.site_x, stats], dim=1)
        edge_index = torch.cat([pairs, pairs.flip(0)], dim=1)
        edge_attr = self.edge_attr.index_select(0, rows)
        return x, edge_index, torch.cat([edge_attr, edge_attr])

    def decoder_attr(self, rows: Tensor, rtt_shown: Tensor) -> Tensor:
        """Pair features of ``rows`` plus their measured RTT where ``rtt_shown``."""
        shown_z = torch.where(rtt_shown, self.filled_z.index_select(0, rows)[:, RTT], 0.0)
        return torch.cat([self.pair_attr.index_select(0, rows), shown_z[:, None],
                          rtt_shown[:, None].float()], 1)


# ------------------------------------------------------------------------------------ training

def pinball(predicted: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean pinball loss of (P, 3) quantile predictions over the masked rows."""
    rows = mask.nonzero().squeeze(1)     # found once for both sides (a mask indexes twice)
    if len(rows) == 0:
        return predicted.sum() * 0.0
    q = QUANTILE_LEVELS
    diff = target.index_select(0, rows)[:, None] - predicted.index_select(0, rows)
    return torch.maximum(q * diff, (q - 1.0) * diff).mean()


def split_step(inputs: Inputs, train: np.ndarray, config: GnnConfig,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One step's message pairs and target pairs out of the training pairs: a random share is
    hidden, and so is most of what a few random sites measured (so cold sites are learnt)."""
    hidden = rng.random(len(train)) < config.target_share
    cold = rng.random(inputs.n_sites) < config.cold_share
    pairs = inputs.pairs_array[:, train]
    at_cold = cold[pairs[0]] | cold[pairs[1]]
    hidden |= at_cold & (rng.random(len(train)) < config.cold_drop)
    return train[~hidden], train[hidden]


def train_step(net: QuantileLinkGnn, optimiser: Adam, inputs: Inputs,
               train: np.ndarray, config: GnnConfig, rng: np.random.Generator) -> float:
    net.train()
    message_rows, target_rows = split_step(inputs, train, config, rng)
    if len(target_rows) == 0 or len(message_rows) == 0:
        return 0.0
    rows = torch.as_tensor(target_rows)
    z, known = inputs.z.index_select(0, rows), inputs.known.index_select(0, rows)
    shown = known[:, RTT] & torch.as_tensor(rng.random(len(rows)) < config.rtt_shown)
    out = net(*inputs.messages(torch.as_tensor(message_rows)), inputs.pairs.index_select(1, rows),
              inputs.decoder_attr(rows, shown))
    loss = (pinball(out[:, THROUGHPUT], z[:, THROUGHPUT], known[:, THROUGHPUT])
            + pinball(out[:, RTT], z[:, RTT], known[:, RTT] & ~shown))
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    return float(loss.detach())


@torch.inference_mode()
def holdout_loss(net: QuantileLinkGnn, inputs: Inputs, messages: tuple[Tensor, Tensor, Tensor],
                 holdout: np.ndarray) -> float:
    """Pinball loss on held-out pairs, predicted from the training pairs' ``messages`` with
    both figures hidden (as an unmeasured pair is)."""
    net.eval()
    rows = torch.as_tensor(holdout)
    out = net(*messages, inputs.pairs.index_select(1, rows),
              inputs.decoder_attr(rows, torch.zeros(len(rows), dtype=torch.bool)))
    z, known = inputs.z.index_select(0, rows), inputs.known.index_select(0, rows)
    return float(pinball(out[:, THROUGHPUT], z[:, THROUGHPUT], known[:, THROUGHPUT])
                 + pinball(out[:, RTT], z[:, RTT], known[:, RTT]))


def learnable(graph: SiteGraph) -> tuple[bool, bool]:
    """Whether the graph measured enough throughputs / RTTs to learn them."""
    return (int(np.isfinite(graph.gbps).sum()) >= MIN_TRAINING_PAIRS,
            int(np.isfinite(graph.rtt_ms).sum()) >= MIN_TRAINING_PAIRS)


def fit(config: GnnConfig, name: str, graph: SiteGraph, seed: int) -> "FittedGnnLinkModel":
    """:meth:`planner.linkpred.gnn.GnnLinkModel.fit`'s work."""
    learns = learnable(graph)
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(graph.i))
    n_holdout = int(round(config.holdout_share * len(rows))) if len(rows) >= 20 else 0
    holdout, train = np.sort(rows[:n_holdout]), np.sort(rows[n_holdout:])
    scale = Scale.of(graph, train)
    if not any(learns):
        return FittedGnnLinkModel(name, config, scale, learns, None)
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # One thread: these small products gain nothing from more, and on a busy machine
        # threads waiting for each other made fits ten times slower; one thread also gives
        # the same sums on every machine. Every op here is on the CPU, where each is
        # deterministic: torch.use_deterministic_algorithms would add nothing but its import
        # of torch._inductor (two seconds).
        torch.set_num_threads(1)
        try:
            net = train_network(config, Inputs(graph, scale), train, holdout, rng)
        finally:
            torch.set_num_threads(threads)
    return FittedGnnLinkModel(name, config, scale, learns, net)


def train_network(c: GnnConfig, inputs: Inputs, train: np.ndarray, holdout: np.ndarray,
                  rng: np.random.Generator) -> QuantileLinkGnn:
    """A network trained on ``train`` pairs, kept at its best loss on ``holdout`` pairs."""
    net = QuantileLinkGnn(SITE_DIM + STATS_DIM, EDGE_DIM, DECODER_PAIR_DIM, c.hidden,
                          c.layers)
    optimiser = Adam(net.parameters(), lr=c.learning_rate, weight_decay=c.weight_decay)
    messages = inputs.messages(torch.as_tensor(train))
    best, best_state, best_epoch = float("inf"), None, 0
    for epoch in range(1, c.max_epochs + 1):
        train_step(net, optimiser, inputs, train, c, rng)
        if len(holdout) == 0 or epoch % c.check_every:
            continue
        loss = holdout_loss(net, inputs, messages, holdout)
        if loss < best - 1e-4:
            best, best_epoch = loss, epoch
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        elif epoch - best_epoch >= c.patience:
            break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    return net


# ---------------------------------------------------------------------------------- predicting

class FittedGnnLinkModel:
    """A trained network and the scale of the graph it learnt; ``net`` is None where the graph
    measured too little to learn either quantity (then every figure comes from the formula)."""

    def __init__(self, name: str, config: GnnConfig, scale: Scale, learns: tuple[bool, bool],
                 net: QuantileLinkGnn | None) -> None:
        self.name, self.config, self.scale, self.learns, self.net = name, config, scale, learns, net

    @torch.no_grad()
    def quantiles(self, graph: SiteGraph, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(P, 2, 3) quantiles of log throughput (Gbit/s) and log RTT (ms) of pairs (a, b),
        read from all of ``graph``'s measured pairs; a pair's own measured RTT is an input."""
        inputs = Inputs(graph, self.scale)
        x, edge_index, edge_attr = inputs.messages(torch.arange(len(graph.i)))
        h = self.net.embed(x, edge_index, edge_attr)
        rtt_z = np.full(len(a), np.nan, dtype=np.float32)
        if len(graph.i):
            measured = np.full((graph.n_sites, graph.n_sites), np.nan, dtype=np.float32)
            z = inputs.z[:, RTT].numpy()
            measured[graph.i, graph.j] = z
            measured[graph.j, graph.i] = z
            rtt_z = measured[a, b]
        out = np.empty((len(a), 2, 3), dtype=np.float64)
        for start in range(0, len(a), PREDICT_CHUNK):
            part = slice(start, start + PREDICT_CHUNK)
            shown = torch.as_tensor(np.isfinite(rtt_z[part]))
            attr = torch.cat([torch.as_tensor(pair_features(graph, a[part], b[part])),
                              torch.as_tensor(np.nan_to_num(rtt_z[part]))[:, None],
                              shown[:, None].float()], dim=1)
            pairs = torch.as_tensor(np.stack([a[part], b[part]]).astype(np.int64))
            out[part] = self.net.quantiles(h, pairs, attr).double().numpy()
        for quantity, (mean, spread) in ((THROUGHPUT, self.scale.log_gbps),
                                         (RTT, self.scale.log_rtt)):
            out[:, quantity] = out[:, quantity] * spread + mean
        return out

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        s = graph.n_sites
        a, b = np.triu_indices(s, k=1)
        learns_gbps, learns_rtt = self.learns
        q = np.full((len(a), 2, 3), np.nan)
        if self.net is not None and len(a):
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                q = self.quantiles(graph, a, b)
            finally:
                torch.set_num_threads(threads)
        rtt, rtt_hi, gbps, gbps_lo = (np.full((s, s), np.nan) for _ in range(4))
        if learns_rtt:
            rtt[a, b], rtt_hi[a, b] = np.exp(q[:, RTT, 1]), np.exp(q[:, RTT, 2])
        else:
            rtt = rtt_hi = relay_rtt(graph)
        if learns_gbps:
            gbps[a, b], gbps_lo[a, b] = np.exp(q[:, THROUGHPUT, 1]), np.exp(q[:, THROUGHPUT, 0])
        out = assemble(self.name, graph, symmetric(rtt), symmetric(rtt_hi), symmetric(gbps),
                       symmetric(gbps_lo))
        if not learns_rtt:
            out.rtt_source[out.rtt_source == Source.PREDICTED] = Source.FORMULA
        return out

    # -------------------------------------------------------------------------------- storing

    def to_bytes(self) -> bytes:
        """The fitted model as bytes (:meth:`from_bytes` reads them back)."""
        buffer = io.BytesIO()
        torch.save({"name": self.name, "config": asdict(self.config),
                    "scale": [*self.scale.log_gbps, *self.scale.log_rtt],
                    "learns": list(self.learns),
                    "state": None if self.net is None else self.net.state_dict()}, buffer)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "FittedGnnLinkModel":
        saved = torch.load(io.BytesIO(data), weights_only=True)
        config = GnnConfig(**saved["config"])
        g_mean, g_spread, r_mean, r_spread = saved["scale"]
        net = None
        if saved["state"] is not None:
            net = QuantileLinkGnn(SITE_DIM + STATS_DIM, EDGE_DIM, DECODER_PAIR_DIM,
                                  config.hidden, config.layers)
            net.load_state_dict(saved["state"])
            net.eval()
        return cls(saved["name"], config, Scale((g_mean, g_spread), (r_mean, r_spread)),
                   tuple(bool(x) for x in saved["learns"]), net)


def symmetric(upper: np.ndarray) -> np.ndarray:
    """The matrix with its strict upper triangle mirrored below the diagonal."""
    out = upper.copy()
    lower = np.tril_indices(len(upper), k=-1)
    out[lower] = upper.T[lower]
    return out
