r"""Training the Hulk GNN against the best of several refined starts, with a loss that does not
depend on how jobs or equal nodes are numbered.

Per graph, with :math:`P \in [0,1]^{n \times J}` the node-job probabilities, :math:`p^{idle}`
the idle probabilities, :math:`g` the label groups (-1 idle), :math:`t` the label throughput
shares and :math:`\theta` the nodes' throughputs:

.. math::
    \mathcal{L} = \underbrace{\sum_{i \ne j} w_{ij}\,\mathrm{BCE}\big((PP^\top)_{ij},
        [g_i = g_j \ge 0]\big)}_{\text{same group}}
      + \underbrace{\tfrac1n \sum_i \mathrm{BCE}\big(p^{idle}_i, [g_i < 0]\big)}_{\text{idle}}
      + \underbrace{\sum_k \big|\tfrac{\theta^\top P_{\cdot k}}{\sum \theta} - t_k\big|}_{\text{shares}}

with :math:`w` weighting same-group and other pairs half each. :math:`(PP^\top)_{ij}` is the
probability that nodes i and j land in the same job; renaming the groups of the label, or
reordering the nodes (with the same permutation applied to :math:`P`), leaves every term
unchanged, and the shares of identical jobs are averaged in the label (planner.gnn.data).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor
from torch_geometric.loader import DataLoader

from planner.gnn import checkpoint as ckpt
from planner.gnn import features as F
from planner.gnn.data import Example
from planner.gnn.model import HulkGNN, ModelConfig

log = logging.getLogger(__name__)
MAX_PAIR_NODES = 400      # larger graphs: the same-group term on a fixed sample of nodes
EPS = 1e-6


@dataclass
class TrainConfig:
    epochs: int = 40
    lr: float = 3e-3
    weight_decay: float = 1e-4
    batch_size: int = 8
    val_fraction: float = 0.15
    seed: int = 7
    hidden: int = 32
    gcn_layers: int = 3
    dropout: float = 0.0


@dataclass
class History:
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: list(v) for k, v in self.__dict__.items()}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def split(examples: list[Example], val_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """A seeded train/validation split (at least one validation example when there are two)."""
    order = np.random.default_rng(seed).permutation(len(examples))
    n_val = max(1 if len(examples) > 1 else 0, int(round(val_fraction * len(examples))))
    val = [examples[i] for i in sorted(order[:n_val])]
    train = [examples[i] for i in sorted(order[n_val:])]
    return train, val


def assignment_loss(probs: Tensor, idle: Tensor, groups: Tensor, shares: Tensor,
                    thr: Tensor) -> Tensor:
    """The loss of one graph (module docstring). ``probs`` (n, J), ``idle`` (n,), ``groups``
    (n,) int, ``shares`` (J,), ``thr`` (n,)."""
    n = probs.size(0)
    if n > MAX_PAIR_NODES:   # a fixed, order-independent sample: the nodes of highest throughput
        keep = torch.argsort(thr, descending=True, stable=True)[:MAX_PAIR_NODES]
        p_s, g_s = probs[keep], groups[keep]
    else:
        p_s, g_s = probs, groups
    same = (p_s @ p_s.t()).clamp(EPS, 1 - EPS)
    target = ((g_s[:, None] == g_s[None, :]) & (g_s[:, None] >= 0)).float()
    off = ~torch.eye(p_s.size(0), dtype=torch.bool, device=probs.device)
    pos, neg = (target > 0) & off, (target == 0) & off
    bce = -(target * same.log() + (1 - target) * (1 - same).log())
    pair = torch.zeros((), device=probs.device)
    for mask in (pos, neg):
        if mask.any():
            pair = pair + 0.5 * bce[mask].mean()
    idle_t = (groups < 0).float()
    idle_c = idle.clamp(EPS, 1 - EPS)
    idle_loss = -(idle_t * idle_c.log() + (1 - idle_t) * (1 - idle_c).log()).mean()
    pred_share = thr @ probs / thr.sum().clamp_min(EPS)
    share_loss = (pred_share - shares).abs().sum()
    return pair + idle_loss + share_loss


def per_graph(batch, pair_p: Tensor, idle_p: Tensor):
    """Yield (probs (n, J), idle (n,), graph index, node slice) for every graph of a batch."""
    num_graphs = int(batch.num_graphs) if hasattr(batch, "num_graphs") else 1
    node_ptr = batch.ptr if hasattr(batch, "ptr") else torch.tensor([0, batch.num_nodes])
    job_counts = torch.bincount(batch.job_batch, minlength=num_graphs)
    job_ptr = torch.cat([job_counts.new_zeros(1), job_counts.cumsum(0)])
    node, job = batch.pair_index
    for g in range(num_graphs):
        lo, hi = int(node_ptr[g]), int(node_ptr[g + 1])
        jlo, jhi = int(job_ptr[g]), int(job_ptr[g + 1])
        n, j = hi - lo, jhi - jlo
        mask = (node >= lo) & (node < hi)
        probs = torch.zeros(n, j, device=pair_p.device)
        probs = probs.index_put((node[mask] - lo, job[mask] - jlo), pair_p[mask])
        yield probs, idle_p[lo:hi], g, slice(lo, hi), slice(jlo, jhi)


def pair_accuracy(probs: np.ndarray, idle: np.ndarray, groups: np.ndarray) -> float:
    """Balanced accuracy of "same group?" over node pairs (mean of the hit rates on same-group
    and on other pairs), with each node in its arg-max class; always-idle scores exactly 0.5."""
    choice = np.where(idle >= probs.max(axis=1, initial=0.0), -1,
                      probs.argmax(axis=1) if probs.shape[1] else -1)
    pred = (choice[:, None] == choice[None, :]) & (choice[:, None] >= 0)
    true = (groups[:, None] == groups[None, :]) & (groups[:, None] >= 0)
    off = ~np.eye(len(groups), dtype=bool)
    rates = [float((pred == true)[m & off].mean()) for m in (true, ~true) if (m & off).any()]
    return float(np.mean(rates)) if rates else 1.0


def _run(model: HulkGNN, loader, optimiser=None) -> tuple[float, float]:
    total_loss, total_acc, count = 0.0, 0.0, 0
    for batch in loader:
        if optimiser is not None:
            optimiser.zero_grad()
        pair_p, idle_p = model.forward_data(batch)
        losses = []
        for probs, idle, g, nodes, jobs in per_graph(batch, pair_p, idle_p):
            losses.append(assignment_loss(probs, idle, batch.group[nodes], batch.share[jobs],
                                          batch.thr[nodes]))
            total_acc += pair_accuracy(probs.detach().numpy(), idle.detach().numpy(),
                                       batch.group[nodes].numpy())
        loss = torch.stack(losses).mean()
        if optimiser is not None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimiser.step()
        total_loss += float(loss.detach()) * len(losses)
        count += len(losses)
    return total_loss / max(count, 1), total_acc / max(count, 1)


def train_epoch(model: HulkGNN, loader, optimiser: torch.optim.Optimizer) -> tuple[float, float]:
    """One pass over ``loader``; mean graph loss and mean balanced pair accuracy."""
    model.train()
    return _run(model, loader, optimiser)


@torch.no_grad()
def evaluate(model: HulkGNN, loader) -> tuple[float, float]:
    """Mean graph loss and mean balanced pair accuracy against the labels, without gradients."""
    model.eval()
    return _run(model, loader)


def to_data(example: Example, stats: F.FeatureStats):
    return F.to_data(example.feats, stats, example.groups, example.shares)


def fit(examples: list[Example], config: TrainConfig = TrainConfig(), *,
        on_epoch: Callable[[int, History], None] | None = None,
        init: ckpt.Checkpoint | None = None) -> tuple[HulkGNN, F.FeatureStats, History, dict]:
    """Train on ``examples`` (seeded split); returns the best-validation model (least loss), the
    feature stats, the per-epoch history and final metrics. ``init`` fine-tunes an existing
    checkpoint (its feature statistics are kept so old and new models read features alike)."""
    seed_everything(config.seed)
    train, val = split(examples, config.val_fraction, config.seed)
    if not train:
        raise ValueError("no training examples")
    stats = init.stats if init is not None else F.FeatureStats.fit([e.feats for e in train])
    train_data = [to_data(e, stats) for e in train]
    val_data = [to_data(e, stats) for e in val]
    generator = torch.Generator().manual_seed(config.seed)
    train_loader = DataLoader(train_data, batch_size=config.batch_size, shuffle=True,
                              generator=generator)
    val_loader = DataLoader(val_data, batch_size=config.batch_size) if val_data else None

    if init is not None:
        model = HulkGNN(init.model.config)
        model.load_state_dict(init.model.state_dict())
    else:
        model = HulkGNN(ModelConfig(hidden=config.hidden, gcn_layers=config.gcn_layers,
                                    dropout=config.dropout))
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=max(config.epochs, 1))
    history = History()
    best_state, best_key = None, None
    started = time.monotonic()
    for epoch in range(config.epochs):
        tl, ta = train_epoch(model, train_loader, optimiser)
        scheduler.step()
        vl, va = evaluate(model, val_loader) if val_loader else (tl, ta)
        for name, value in (("train_loss", tl), ("train_acc", ta), ("val_loss", vl), ("val_acc", va)):
            getattr(history, name).append(value)
        key = (-vl, va)
        if best_key is None or key > best_key:
            best_key = key
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if on_epoch:
            on_epoch(epoch, history)
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    metrics = {
        "val_loss": -best_key[0] if best_key else None,
        "val_acc": best_key[1] if best_key else None,
        "val_acc_always_idle": 0.5,
        "train_examples": len(train), "val_examples": len(val),
        "train_nodes": int(sum(d.num_nodes for d in train_data)),
        "epochs": config.epochs, "train_seconds": round(time.monotonic() - started, 1),
    }
    return model, stats, history, metrics


def plot_history(history: History, path: str | Path) -> Path:
    """Loss and accuracy per epoch, training and validation (the paper's figure 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    epochs = np.arange(1, len(history.train_loss) + 1)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, history.train_loss, label="training")
    ax_loss.plot(epochs, history.val_loss, label="validation")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("same-group + idle + share loss")
    ax_loss.set_title("Loss")
    ax_loss.legend()
    ax_acc.plot(epochs, history.train_acc, label="training")
    ax_acc.plot(epochs, history.val_acc, label="validation")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("balanced pair accuracy (always-idle: 0.5)")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title("Accuracy")
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
