import logging

import pytest
import torch

from planner.core.costmodel import problems
from planner.core.generate import generate_jobs, generate_network
from planner.gnn import checkpoint as ckpt
from planner.gnn import features as F
from planner.gnn.infer import plan_gnn


@pytest.mark.slow   # trains on fleets labelled by full planning runs
def test_round_trip_gives_the_same_outputs(small_examples, tiny_checkpoint, tmp_path):
    loaded = ckpt.load(tiny_checkpoint)
    again_path = ckpt.save(tmp_path / "again.pt", loaded.model, loaded.stats,
                           metrics=loaded.metrics)
    again = ckpt.load(again_path)
    ex = small_examples[0]
    with torch.no_grad():
        a = loaded.model.forward_data(F.to_data(ex.feats, loaded.stats))
        b = again.model.forward_data(F.to_data(ex.feats, again.stats))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert again.meta["versions"]["torch"] == torch.__version__
    assert "val_acc" in again.metrics


def test_missing_and_corrupt_checkpoints_raise_clear_errors(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="not found"):
        ckpt.load(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ckpt.CheckpointError, match="bad.pt"):
        ckpt.load(bad)
    wrong = tmp_path / "wrong.pt"
    torch.save({"format": "something-else"}, wrong)
    with pytest.raises(ckpt.CheckpointError, match="format"):
        ckpt.load(wrong)


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_unusable_checkpoint_falls_back_to_search(kind, tmp_path, caplog):
    path = tmp_path / "model.pt"
    if kind == "corrupt":
        path.write_bytes(b"\x00garbage" * 10)
    net = generate_network(20, seed=5)
    jobs = generate_jobs(3, seed=6, max_params=net.mem.sum() / 48)
    with caplog.at_level(logging.WARNING, logger="planner.gnn.infer"):
        plan = plan_gnn(jobs, net, checkpoint=path)
    assert plan.method == "search"
    assert any("GNN checkpoint unavailable" in n for n in plan.notes)
    assert any("planning with search instead" in r.getMessage() for r in caplog.records)
    assert {p.job.name for p in plan.placements} == {j.name for j in jobs}
    for p in plan.placements:
        assert problems(p, net) == []


def test_hulk_model_env_selects_the_checkpoint(tmp_path, monkeypatch):
    chosen = tmp_path / "model.pt"   # only the path is read: no checkpoint need be trained
    monkeypatch.setenv("HULK_MODEL", str(chosen))
    assert ckpt.default_path() == chosen
    monkeypatch.delenv("HULK_MODEL")
    assert ckpt.default_path() == ckpt.SHIPPED
