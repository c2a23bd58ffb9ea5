"""bench/diloco_loss_sweep.py's step baseline and --corpus, without training anything."""

from __future__ import annotations

import pytest

import bench.diloco_loss_sweep as S


class Done:
    ok = True

    def mean_loss(self):
        return [3.0] * 18 + [2.0, 1.0]


def test_step_is_the_four_replicas_synchronised_every_step_on_the_asked_corpus(monkeypatch):
    calls = []
    monkeypatch.setattr(S, "run_placement", lambda *a, **kw: calls.append(kw) or Done())
    assert S.Setting.parse("step").step_sync
    assert S.final_loss(S.Setting.parse("step"), 20, "markov") == 1.5   # the last tenth's mean
    S.final_loss(S.Setting.parse("20,1.0,0.0"), 20)
    step, diloco = calls
    assert step["env_for"] is None and step["steps"] == 20
    assert step["args"][step["args"].index("--corpus") + 1] == "markov"
    assert diloco["env_for"](0, 3)["HULK_SYNC"] == "diloco"
    assert diloco["args"][diloco["args"].index("--corpus") + 1] == "builtin"


def test_an_unknown_corpus_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        S.main(["--corpus", "shakespeare", "step"])
    assert exit_.value.code == 2
    assert "--corpus: invalid choice: 'shakespeare'" in capsys.readouterr().err
