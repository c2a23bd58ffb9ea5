"""Saving and loading GNN checkpoints: weights, feature statistics, config, versions, metrics."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hulk.atomic import atomic_file
from hulk.errors import InputError
from hulk.settings import env
from planner.gnn.features import FeatureStats
from planner.gnn.model import HulkGNN, ModelConfig

FORMAT = "hulk-gnn/2"   # 2: node-job pair scorer, RTT-embedded node features
SHIPPED = Path(__file__).resolve().parent / "hulk-gnn.pt"


class CheckpointError(InputError):
    """A checkpoint that is missing, unreadable or not a Hulk GNN checkpoint."""


@dataclass
class Checkpoint:
    model: HulkGNN
    stats: FeatureStats
    metrics: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    path: Path | None = None


def versions() -> dict:
    import torch_geometric

    from hulk import __version__
    # str(): torch.__version__ is a TorchVersion object, which weights_only loading refuses.
    return {"hulk": str(__version__), "torch": str(torch.__version__),
            "torch_geometric": str(torch_geometric.__version__)}


def default_path() -> Path:
    """HULK_MODEL if set, else the checkpoint shipped beside this module."""
    override = env("HULK_MODEL")
    return Path(override) if override else SHIPPED


def save(path: str | os.PathLike, model: HulkGNN, stats: FeatureStats, *, metrics: dict | None = None,
         meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": FORMAT,
        "config": model.config.to_dict(),
        # Half-size float16 copies would save space, but the file is already well under 5 MB.
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "stats": stats.to_dict(),
        "versions": versions(),
        "metrics": dict(metrics or {}),
        "meta": dict(meta or {}),
    }
    with atomic_file(path, binary=True) as handle:
        torch.save(blob, handle)
    return path


def load(path: str | os.PathLike | None = None) -> Checkpoint:
    """Load a checkpoint (default: :func:`default_path`); CheckpointError names what is wrong."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise CheckpointError(f"{path}: GNN checkpoint not found")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format: expected {FORMAT!r}")
    try:
        config = ModelConfig(**blob["config"])
        if config.to_dict() != {**ModelConfig().to_dict(), **{k: v for k, v in blob["config"].items()
                                                              if k in ("hidden", "gcn_layers", "dropout")}}:
            raise CheckpointError(f"{path}: config: feature sizes differ from this version's "
                                  f"({config.node_dim}/{config.job_dim}/{config.edge_dim}); retrain")
        model = HulkGNN(config)
        model.load_state_dict(blob["state_dict"])
        stats = FeatureStats.from_dict(blob["stats"])
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: damaged checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    model.eval()
    meta = dict(blob.get("meta", {}))
    meta["versions"] = blob.get("versions", {})
    return Checkpoint(model, stats, dict(blob.get("metrics", {})), meta, path)
