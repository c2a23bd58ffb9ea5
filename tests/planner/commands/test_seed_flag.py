"""`--seed` outside numpy's seed range is a usage error (exit 2), not an internal error."""

from __future__ import annotations

import pytest

from planner import cli
from tests.helpers.paths import REPO

FLEET = REPO / "examples" / "fleets" / "lab-5.json"
JOBS = REPO / "examples" / "jobs.yaml"


@pytest.mark.parametrize("seed", ["-1", "4294967296", "x"])
@pytest.mark.parametrize("command", [
    ["fleet", "complete", str(FLEET), "--out", "unused.json"],
    ["plan", str(JOBS), "--fleet", str(FLEET), "--no-compare"],
])
def test_seed_out_of_range_exits_2_naming_the_flag(command, seed, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main([*command, "--seed", seed])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed: expected a whole number from 0 to 4294967295" in err
    assert not (tmp_path / "unused.json").exists()


def test_largest_seed_is_accepted(tmp_path, capsys):
    out = tmp_path / "completed.json"
    assert cli.main(["fleet", "complete", str(FLEET), "--out", str(out),
                     "--seed", "4294967295"]) == 0
    assert out.exists()
