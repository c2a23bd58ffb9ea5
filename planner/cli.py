"""`hulk-planner`: one entry point, one module per subcommand under planner/commands/.

Each command module has ``register(subparsers, settings)`` which adds its parser (the HULK_*
settings are its flags' defaults) and sets ``func`` to a callable taking the parsed args and
returning an exit code. Errors from the hulk hierarchy, a bad HULK_* variable included, are
printed as one line; users never see a traceback for a known error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from hulk import __version__
from hulk.errors import HulkError
from planner.settings import LOG_LEVELS, PlannerSettings, load_settings

# The modules under planner/commands/, in the order `--help` lists their subcommands.
COMMANDS = ("serve", "fleet", "plan", "calibrate", "jobs", "train", "enroll")
MODULE_OF = {**{name: name for name in COMMANDS}, "revoke": "enroll"}   # subcommand -> module


def build_parser(settings: PlannerSettings, only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` that one (its module alone is imported:
    serve's gRPC, SQLite and metrics stacks cost `plan` a third of a second to import)."""
    parser = argparse.ArgumentParser(
        prog="hulk-planner",
        description="Plan large-model training jobs on a geo-distributed GPU fleet.")
    parser.add_argument("--version", action="version", version=f"hulk-planner {__version__}")
    parser.add_argument("--log-level", default=settings.log_level, choices=list(LOG_LEVELS))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (MODULE_OF[only],):
        importlib.import_module(f"planner.commands.{name}").register(sub, settings)
    _log_level_after(sub)
    return parser


def _log_level_after(sub: argparse._SubParsersAction) -> None:
    """--log-level also after the (sub)subcommand, where a user adds it to a command that
    failed; given there, it wins over the one before the subcommand."""
    for command in {id(p): p for p in sub.choices.values()}.values():
        command.add_argument("--log-level", default=argparse.SUPPRESS, choices=list(LOG_LEVELS),
                             help="DEBUG, INFO, WARNING or ERROR (HULK_LOG_LEVEL; default INFO)")
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _log_level_after(action)


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (after the global options), or None for none or unknown."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--log-level":
            i += 2
            continue
        if arg.startswith("-"):
            if arg.startswith("--log-level="):
                i += 1
                continue
            return None   # --help, --version or a mistake: the full parser answers
        return arg if arg in MODULE_OF else None
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings()
    except HulkError as exc:
        return _fail(exc)
    words = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(settings, chosen_command(words))
    except Exception as exc:   # e.g. an installed gRPC older than the generated stubs need
        return _internal(exc, settings.log_level == "DEBUG" or "DEBUG" in words)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except HulkError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error worth a traceback.
        sys.stderr.close()
        return 0
    except Exception as exc:   # a bug or a broken install: one line, the traceback at DEBUG
        return _internal(exc, args.log_level == "DEBUG")


def _internal(exc: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"hulk-planner: internal error: {type(exc).__name__}: {exc} "
          "(--log-level DEBUG shows the traceback)", file=sys.stderr)
    return 1


def _fail(exc: HulkError) -> int:
    print(f"hulk-planner: {exc}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
