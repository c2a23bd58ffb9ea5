"""An unexpected failure inside a command is one line on stderr and exit 1, never a traceback
(a GPU server whose grpcio was older than the generated stubs need gave serve a traceback)."""

from __future__ import annotations

from planner import cli
from planner.commands import fleet


def _boom(args):
    raise RuntimeError("The grpc package installed is at version 1.84.0, but ...")


def test_an_unexpected_error_is_one_line_and_exit_1(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(fleet, "cmd_show", _boom)
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "x.sqlite")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hulk-planner: internal error: RuntimeError: The grpc package installed is at "
                   "version 1.84.0, but ... (--log-level DEBUG shows the traceback)"]


def test_at_debug_level_the_traceback_comes_first(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(fleet, "cmd_show", _boom)
    assert cli.main(["--log-level", "DEBUG", "fleet", "show", "--db",
                     str(tmp_path / "x.sqlite")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.strip().splitlines()[-1].startswith("hulk-planner: internal error: RuntimeError")


def test_a_command_module_that_fails_to_import_is_one_line(monkeypatch, capsys):
    def broken(*a, **k):
        raise ImportError("cannot import name 'health_pb2_grpc'")

    monkeypatch.setattr(cli, "build_parser", broken)
    assert cli.main(["serve", "--db", "x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hulk-planner: internal error: ImportError: ")
