"""Training the Hulk GNN on teacher-labelled generated fleets (cross-entropy, node classification)."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch_geometric.loader import DataLoader

from planner.gnn import checkpoint as ckpt
from planner.gnn import features as F
from planner.gnn.data import Example
from planner.gnn.model import HulkGNN, ModelConfig

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    epochs: int = 30
    lr: float = 3e-3
    weight_decay: float = 1e-3
    batch_size: int = 8
    val_fraction: float = 0.15
    seed: int = 7
    hidden: int = 64
    gcn_layers: int = 3
    dropout: float = 0.2


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


def train_epoch(model: HulkGNN, loader, optimiser: torch.optim.Optimizer) -> tuple[float, float]:
    """One pass over ``loader``; mean node loss and node accuracy."""
    model.train()
    total_loss, correct, count = 0.0, 0, 0
    for batch in loader:
        optimiser.zero_grad()
        logits = model.forward_data(batch)
        loss = torch.nn.functional.cross_entropy(logits, batch.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimiser.step()
        total_loss += loss.item() * batch.num_nodes
        correct += int((logits.argmax(-1) == batch.y).sum())
        count += batch.num_nodes
    return total_loss / max(count, 1), correct / max(count, 1)


@torch.no_grad()
def evaluate(model: HulkGNN, loader) -> tuple[float, float]:
    """Mean node loss and node accuracy against the teacher's labels, without gradients."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for batch in loader:
        logits = model.forward_data(batch)
        total_loss += float(torch.nn.functional.cross_entropy(logits, batch.y, reduction="sum"))
        correct += int((logits.argmax(-1) == batch.y).sum())
        count += batch.num_nodes
    return total_loss / max(count, 1), correct / max(count, 1)


def fit(examples: list[Example], config: TrainConfig = TrainConfig(), *,
        on_epoch: Callable[[int, History], None] | None = None,
        init: ckpt.Checkpoint | None = None) -> tuple[HulkGNN, F.FeatureStats, History, dict]:
    """Train on ``examples`` (seeded split); returns the best-validation model, the feature stats,
    the per-epoch history and final metrics. ``init`` fine-tunes an existing checkpoint (its
    feature statistics are kept so old and new models read features alike)."""
    seed_everything(config.seed)
    train, val = split(examples, config.val_fraction, config.seed)
    if not train:
        raise ValueError("no training examples")
    stats = init.stats if init is not None else F.FeatureStats.fit([e.feats for e in train])
    train_data = [F.to_data(e.feats, stats, e.labels) for e in train]
    val_data = [F.to_data(e.feats, stats, e.labels) for e in val]
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
        key = (va, -vl)
        if best_key is None or key > best_key:
            best_key = key
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if on_epoch:
            on_epoch(epoch, history)
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    metrics = {
        "val_acc": best_key[0] if best_key else None,
        "val_loss": -best_key[1] if best_key else None,
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
    ax_loss.set_ylabel("cross-entropy loss")
    ax_loss.set_title("Loss")
    ax_loss.legend()
    ax_acc.plot(epochs, history.train_acc, label="training")
    ax_acc.plot(epochs, history.val_acc, label="validation")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("node accuracy vs teacher")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title("Accuracy")
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
