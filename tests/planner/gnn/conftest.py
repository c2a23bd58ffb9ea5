"""Fixtures of the GNN tests: small generated instances labelled by the real search planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.gnn import checkpoint as ckpt
from planner.gnn import data as gdata
from planner.gnn.train import TrainConfig, fit


# The test graphs are tiny: one intra-op thread is as fast and never spins against other work.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def small_examples(tmp_path_factory) -> list[gdata.Example]:
    """Eight generated fleets of 8-24 nodes, labelled by the best of the refined starts (cached
    in a temp dir)."""
    cache = tmp_path_factory.mktemp("labels")
    return gdata.load_examples(123, 8, cache=cache, workers=1, min_nodes=8, max_nodes=24,
                               budget_s=20.0)


@pytest.fixture(scope="session")
def tiny_checkpoint(small_examples, tmp_path_factory) -> Path:
    """A checkpoint trained for a few epochs on ``small_examples``."""
    model, stats, history, metrics = fit(small_examples, TrainConfig(epochs=3, seed=1, hidden=16))
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    ckpt.save(path, model, stats, metrics=metrics, meta={"history": history.to_dict()})
    return path


@pytest.fixture(scope="session")
def shipped_checkpoint() -> Path:
    if not ckpt.SHIPPED.is_file():
        pytest.fail(f"the shipped checkpoint {ckpt.SHIPPED} is missing; run `make model`")
    return ckpt.SHIPPED
