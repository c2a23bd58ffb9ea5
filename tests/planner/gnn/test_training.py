import numpy as np
import pytest
import torch
from torch_geometric.loader import DataLoader

from planner.gnn import features as F
from planner.gnn.model import HulkGNN, ModelConfig
from planner.gnn.train import TrainConfig, evaluate, fit, seed_everything, to_data, train_epoch


@pytest.mark.slow   # trains on fleets labelled by full planning runs
def test_labels_follow_the_teacher(small_examples):
    assert len(small_examples) >= 6
    for ex in small_examples:
        n = ex.feats.x.shape[0]
        assert ex.groups.shape == (n,)
        used = set(np.unique(ex.groups).tolist()) - {-1}
        assert used, "the teacher placed at least one job"
        assert used <= set(range(ex.feats.num_jobs))
        assert ex.shares.shape == (ex.feats.num_jobs,)
        assert 0 < ex.shares.sum() <= ex.feats.num_jobs
        assert ex.teacher_makespan_s > 0


@pytest.mark.slow   # trains on fleets labelled by full planning runs
def test_a_few_training_steps_lower_the_loss(small_examples):
    seed_everything(0)
    stats = F.FeatureStats.fit([e.feats for e in small_examples])
    data = [to_data(e, stats) for e in small_examples]
    loader = DataLoader(data, batch_size=4)
    model = HulkGNN(ModelConfig(hidden=32, dropout=0.0))
    before, _ = evaluate(model, loader)
    optimiser = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(8):
        train_epoch(model, loader, optimiser)
    after, _ = evaluate(model, loader)
    assert after < before * 0.8


@pytest.mark.slow   # trains on fleets labelled by full planning runs
def test_fit_is_reproducible_from_a_seed(small_examples):
    cfg = TrainConfig(epochs=2, seed=3, hidden=16)
    m1, _, h1, _ = fit(small_examples, cfg)
    m2, _, h2, _ = fit(small_examples, cfg)
    assert h1.train_loss == h2.train_loss
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
