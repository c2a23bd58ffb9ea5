"""Output files: atomic for regular files, in place for devices, one-line errors otherwise."""

import os

import pytest

from hulk.errors import InputError
from planner.files.atomic import write_text_atomic


def test_a_regular_file_is_replaced_whole_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "sub" / "fleet.json"
    write_text_atomic(out, "one\n", "fleet JSON")
    write_text_atomic(out, "two\n", "fleet JSON")
    assert out.read_text() == "two\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["fleet.json"]


def test_a_device_is_written_in_place_not_renamed_over(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # a reader, so the writer's open succeeds
    try:
        write_text_atomic(fifo, "through the pipe\n", "plan")
        assert os.read(reader, 100) == b"through the pipe\n"
    finally:
        os.close(reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]   # still the FIFO, no .tmp


def test_an_unwritable_place_is_one_input_error_naming_the_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError) as err:
        write_text_atomic(blocker / "plan.json", "{}", "plan")   # a file where a folder should be
    assert "cannot write plan" in str(err.value) and str(blocker / "plan.json") in str(err.value)
