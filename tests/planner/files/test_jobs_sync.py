"""jobs.yaml's sync fields (docs/JOBS.md): good values become a Sync; every bad one is one line
naming file, line, job and field, and `hulk-planner plan` exits 2 on it."""

from __future__ import annotations

import json

import pytest

from hulk.errors import InputError
from planner import cli
from planner.core.jobs import (DEFAULT_AUTO_INNER_STEPS, DEFAULT_DILOCO_INNER_STEPS, Sync,
                               parse_sync, sync_fields)
from planner.files.jobs import parse_jobs


def one(extra: str) -> str:
    return f"jobs:\n  - name: a\n    model: gpt2-xl\n{extra}"


@pytest.mark.parametrize("extra, expected", [
    ("", Sync()),
    ("    sync: step\n", Sync()),
    ("    sync: diloco\n", Sync("diloco", DEFAULT_DILOCO_INNER_STEPS, ("none",), 0)),
    ("    sync: diloco\n    inner_steps: 500\n    outer_compression: int8\n",
     Sync("diloco", 500, ("int8",), 0)),
    ("    sync: diloco\n    streaming_fragments: 48\n", Sync("diloco", 100, ("none",), 48)),
    ("    sync: auto\n", Sync("auto", DEFAULT_AUTO_INNER_STEPS, ("none", "bf16", "int8"), 0)),
    ("    sync: auto\n    inner_steps: 50\n    outer_compression: [int8, none]\n",
     Sync("auto", 50, ("none", "int8"), 0)),
    ("    sync: auto\n    outer_compression: bf16\n", Sync("auto", 500, ("bf16",), 0)),
])
def test_good_sync_fields(extra, expected):
    assert parse_jobs(one(extra))[0].sync == expected


@pytest.mark.parametrize("extra, field, message", [
    ("    sync: sometimes\n", "sync", "expected one of step, diloco, auto"),
    ("    sync: [diloco]\n", "sync", "expected one of step, diloco, auto"),
    ("    sync: 3\n", "sync", "expected one of step, diloco, auto"),
    ("    inner_steps: 10\n", "inner_steps", "only with sync: diloco or auto"),
    ("    sync: step\n    outer_compression: int8\n", "outer_compression", "only with sync"),
    ("    streaming_fragments: 2\n", "streaming_fragments", "only with sync"),
    ("    sync: diloco\n    inner_steps: 0\n", "inner_steps", "between 1 and 100,000"),
    ("    sync: diloco\n    inner_steps: 100001\n", "inner_steps", "between 1 and 100,000"),
    ("    sync: auto\n    inner_steps: 2.5\n", "inner_steps", "a whole number of steps"),
    ("    sync: diloco\n    inner_steps: true\n", "inner_steps", "a whole number"),
    ("    sync: diloco\n    outer_compression: fp8\n", "outer_compression",
     "expected one of none, bf16, int8"),
    ("    sync: diloco\n    outer_compression: [int8]\n", "outer_compression",
     "a list only with sync: auto"),
    ("    sync: auto\n    outer_compression: []\n", "outer_compression", "a non-empty list"),
    ("    sync: auto\n    outer_compression: [int8, fp4]\n", "outer_compression",
     "a non-empty list of none, bf16, int8"),
    ("    sync: auto\n    outer_compression: [int8, int8]\n", "outer_compression", "at most once"),
    ("    sync: diloco\n    streaming_fragments: -1\n", "streaming_fragments", "between 0"),
    ("    sync: diloco\n    streaming_fragments: 49\n", "streaming_fragments",
     "at most the job's 48 layers"),
])
def test_a_bad_sync_field_is_one_line_naming_it(extra, field, message):
    with pytest.raises(InputError) as err:
        parse_jobs(one(extra), "jobs.yaml")
    text = str(err.value)
    assert text.startswith("jobs.yaml:") and f" {field}: job 'a': " in text, text
    assert message in text and "\n" not in text, text


def test_the_cli_exits_2_on_a_bad_sync_field(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(one("    sync: diloco\n    outer_compression: zip\n"))
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"name": "f", "nodes": [{"id": "a", "gpus": 8}]}))
    code = cli.main(["plan", str(jobs), "--fleet", str(fleet), "--no-compare"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "outer_compression: job 'a'" in err[0], err


@pytest.mark.parametrize("sync", [Sync(), Sync("diloco", 7, ("bf16",), 3),
                                  Sync("auto", 500, ("none", "int8"), 0)])
def test_sync_fields_read_back(sync):
    fields = sync_fields(sync)
    assert parse_sync(fields.pop("sync", None), layers=48, **fields) == sync
