import pytest

from planner.cli import main
from planner.gnn import checkpoint as ckpt


@pytest.mark.slow   # labels fleets and trains the GNN
def test_train_command_writes_checkpoint_and_plot(tmp_path, capsys):
    out = tmp_path / "model.pt"
    rc = main(["train", "--fleets", "4", "--epochs", "2", "--seed", "3", "--max-nodes", "16",
               "--workers", "1", "--cache", str(tmp_path / "cache"), "--out", str(out)])
    assert rc == 0
    loaded = ckpt.load(out)
    assert loaded.meta["fleets"] == 4 and len(loaded.meta["history"]["train_loss"]) == 2
    assert (tmp_path / "model.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((tmp_path / "cache").rglob("*.pt"))          # labels cached for the next run
    assert "validation accuracy" in capsys.readouterr().out


def test_train_command_rejects_bad_arguments(tmp_path, capsys):
    assert main(["train", "--fleets", "1", "--out", str(tmp_path / "m.pt")]) == 2
    assert "--fleets" in capsys.readouterr().err
