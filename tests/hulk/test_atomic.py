"""The one atomic writer: whole content, the mode kept or set, fsyncs of the file and its folder,
no temporary file left on failure; a command's output file in place for devices and one-line
errors otherwise."""

import os
import stat

import pytest

from hulk import atomic
from hulk.atomic import atomic_file, write_atomic, write_output
from hulk.errors import InputError


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_text_and_bytes_replace_the_file_whole_and_leave_no_temporary(tmp_path):
    out = tmp_path / "sub" / "placement.json"
    write_atomic(out, "one\n")
    write_atomic(out, b"two\xff\n")
    assert out.read_bytes() == b"two\xff\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["placement.json"]


def test_a_new_file_gets_the_umask_default_and_an_old_one_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "new", "x")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "new") == 0o644
    (tmp_path / "kept").write_text("x")
    os.chmod(tmp_path / "kept", 0o604)
    write_atomic(tmp_path / "kept", "y")
    assert mode_of(tmp_path / "kept") == 0o604 and (tmp_path / "kept").read_text() == "y"


def test_a_given_mode_is_set_before_anything_is_written(tmp_path, monkeypatch):
    seen = []
    real_fchmod = os.fchmod

    def fchmod(fd, mode):
        seen.append((os.fstat(fd).st_size, mode))
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", fchmod)
    write_atomic(tmp_path / "acl", "secret", mode=0o640)
    assert seen == [(0, 0o640)] and mode_of(tmp_path / "acl") == 0o640


def test_the_file_and_its_folder_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "f", "x")
    assert synced == [False, True]     # the file's data first, then the folder's rename


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "model.pt"
    out.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(out) as handle:
            handle.write("half of the new")
            raise RuntimeError("the writer failed")
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_a_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(OSError):
        write_atomic(tmp_path / "f", "x")
    assert list(tmp_path.iterdir()) == []


def test_an_output_file_is_replaced_whole(tmp_path):
    out = tmp_path / "sub" / "fleet.json"
    write_output(out, "one\n", "fleet JSON")
    write_output(out, "two\n", "fleet JSON")
    assert out.read_text() == "two\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["fleet.json"]


def test_a_device_is_written_in_place_not_renamed_over(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # a reader, so the writer's open succeeds
    try:
        write_output(fifo, "through the pipe\n", "plan")
        assert os.read(reader, 100) == b"through the pipe\n"
    finally:
        os.close(reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]   # still the FIFO, no .tmp


def test_an_unwritable_place_is_one_input_error_naming_the_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError) as err:
        write_output(blocker / "plan.json", "{}", "plan")   # a file where a folder should be
    assert "cannot write plan" in str(err.value) and str(blocker / "plan.json") in str(err.value)
    assert "\n" not in str(err.value)
