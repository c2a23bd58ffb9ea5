"""bench/diloco_loss_sweep.py's settings: the same tokens whether islands split the batch or not."""

from __future__ import annotations

import pytest

import bench.diloco_loss_sweep as S


def test_a_setting_reads_h_lr_mu_and_full():
    assert S.Setting.parse("20,1.0,0.0") == S.Setting(20, 1.0, 0.0, False)
    assert S.Setting.parse("10,0.7,0.9,full").full_batch
    with pytest.raises(ValueError, match="H,LR,MU"):
        S.Setting.parse("10,0.7")


def test_full_batch_islands_take_the_same_tokens_in_half_the_steps():
    split, full = S.Setting(10, 1.0, 0.0), S.Setting(10, 1.0, 0.0, True)
    for s in (split, full):
        n, m = s.steps_and_micro_batches(200)
        assert n * m * len(S.HOSTS) == 200 * S.GLOBAL_BATCH     # one sample per micro-batch
    assert full.steps_and_micro_batches(200) == (100, 8)
    assert [split.env(0, r)["HULK_ISLAND"] for r in range(4)] == ["0", "0", "1", "1"]


def test_a_bad_setting_is_a_one_line_error(capsys):
    assert S.main(["10,x,0.0"]) == 2
    assert "setting '10,x,0.0': expected H,LR,MU" in capsys.readouterr().err
