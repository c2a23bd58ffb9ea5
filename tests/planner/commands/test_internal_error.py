"""An unexpected failure inside a command (say, a grpcio older than the generated stubs need) is
one line on stderr and exit 1, never a traceback; --log-level DEBUG, before or after the
subcommand, shows the traceback too."""

from __future__ import annotations

import pytest

from planner import cli
from planner.commands import fleet
from planner.settings import PlannerSettings


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


def test_the_log_level_may_follow_the_subcommand(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(fleet, "cmd_show", _boom)
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "x.sqlite"),
                     "--log-level", "DEBUG"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.strip().splitlines()[-1].startswith("hulk-planner: internal error: RuntimeError")


@pytest.mark.parametrize("argv, level", [
    (["plan", "j.yaml", "--fleet", "f", "--log-level", "DEBUG"], "DEBUG"),
    (["plan", "j.yaml", "--log-level=WARNING", "--fleet", "f"], "WARNING"),
    (["--log-level", "ERROR", "plan", "j.yaml", "--fleet", "f"], "ERROR"),
    (["--log-level", "ERROR", "plan", "j.yaml", "--fleet", "f", "--log-level", "DEBUG"], "DEBUG"),
    (["plan", "j.yaml", "--fleet", "f"], "INFO"),
    (["jobs", "list", "--db", "x", "--log-level", "DEBUG"], "DEBUG"),
])
def test_the_log_level_before_or_after_the_subcommand(argv, level):
    assert cli.build_parser(PlannerSettings()).parse_args(argv).log_level == level
