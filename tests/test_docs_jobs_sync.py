"""docs/JOBS.md's `sync` section as an operator reads it: every jobs.yaml block in it is valid,
the one with a command is accepted by `jobs submit`, and the `plan` it tells the operator to run
first prints the islands lines it describes."""

from __future__ import annotations

import re

import pytest

from planner import cli
from planner.files.jobs import parse_jobs
from tests.helpers.paths import REPO

JOBS_MD = REPO / "docs" / "JOBS.md"
FLEET = REPO / "examples" / "fleets" / "world-48.json"


def sync_section() -> str:
    text = JOBS_MD.read_text()
    start = text.index("## Low-communication training: `sync`")
    return text[start:text.index("\n## ", start + 1)]


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", sync_section(), re.S)


def test_every_jobs_yaml_of_the_sync_section_is_valid():
    blocks = yaml_blocks()
    assert len(blocks) == 2
    modes = [{job.sync.mode for job in parse_jobs(block, "JOBS.md")} for block in blocks]
    assert modes == [{"diloco", "auto"}, {"diloco"}]


@pytest.mark.process            # plan's portfolio starts worker processes
def test_the_walk_through_submits_and_plans_as_written(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml_blocks()[1])
    commands = re.findall(r"^hulk-planner (\S+ \S+)", sync_section(), re.M)
    assert commands == ["plan jobs.yaml", "jobs submit", "jobs logs"]
    db = str(tmp_path / "planner.sqlite")
    assert cli.main(["jobs", "submit", str(jobs), "--db", db]) == 0
    assert "queued 1 job: gpt-two-continents" in capsys.readouterr().out
    # The doc's plan command on a fleet file instead of a live store.
    assert cli.main(["plan", str(jobs), "--fleet", str(FLEET), "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert "sync: diloco, every 100 inner steps an outer all-reduce at int8" in out
    assert re.search(r"\n  \d+ islands? of [\d/]+ replicas \(replicas .*\); outer group stage 0: ",
                     out), out
