"""serve --model-dir seeds its active GNN checkpoint whole or not at all (a full disk)."""

from __future__ import annotations

import pytest

from hulk.errors import StoreError
from planner.gnn import checkpoint as ckpt
from planner.gnn.online import seed_active_checkpoint
from tests.helpers.mounts import tmpfs_mounts


def test_the_active_checkpoint_is_the_shipped_one_byte_for_byte(tmp_path):
    active = seed_active_checkpoint(tmp_path / "models" / "active.pt")
    assert active.read_bytes() == ckpt.default_path().read_bytes()


@pytest.mark.process   # mount, umount
@pytest.mark.root
def test_a_full_disk_leaves_no_cut_checkpoint_and_is_one_line(tmp_path):
    size = ckpt.default_path().stat().st_size
    with tmpfs_mounts(tmp_path) as mounts:
        where = mounts.mount(f"{max(4096, size // 2)}")      # room for half of it
        active = where / "active.pt"
        with pytest.raises(StoreError) as caught:
            seed_active_checkpoint(active)
        assert "\n" not in str(caught.value) and str(active) in str(caught.value)
        assert not active.exists()                       # the next start seeds it again
        assert [p.name for p in where.iterdir()] == []   # no temporary file left
