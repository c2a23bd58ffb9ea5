"""jobs.yaml's checkpoint_dir: absolute, or relative to the job's folder on each node."""

from __future__ import annotations

import pytest

from hulk.errors import InputError
from planner.files.jobs import parse_jobs


def one(extra: str) -> str:
    return f"jobs:\n  - name: a\n    model: gpt2-xl\n{extra}"


@pytest.mark.parametrize("value, expected", [
    ("/data/ckpt/a", "/data/ckpt/a"), ("ckpt", "ckpt"), ("runs/a/ckpt", "runs/a/ckpt"),
    ("/data/../ckpt", "/data/../ckpt"),            # absolute: the operator's own path
])
def test_checkpoint_dir_is_read(value, expected):
    assert parse_jobs(one(f"    checkpoint_dir: {value}\n"))[0].checkpoint_dir == expected


def test_without_it_there_is_none():
    assert parse_jobs(one(""))[0].checkpoint_dir is None


@pytest.mark.parametrize("value, message", [
    ('""', "must be a path"), ("5", "must be a path"), ("[a]", "must be a path"),
    ("../elsewhere", "stay inside the job's folder"), ("a/../../b", "stay inside the job's folder"),
    ('"' + "x" * 5000 + '"', "at most 4096"),
])
def test_a_bad_checkpoint_dir_is_one_line_naming_file_line_and_field(value, message):
    with pytest.raises(InputError) as err:
        parse_jobs(one(f"    checkpoint_dir: {value}\n"), "jobs.yaml")
    text = str(err.value)
    assert text.startswith("jobs.yaml:4: checkpoint_dir: job 'a': ") and message in text, text
    assert "\n" not in text
