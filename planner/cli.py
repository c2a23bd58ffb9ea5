"""`hulk-planner`: one entry point, one module per subcommand under planner/commands/.

Each command module has ``register(subparsers)`` which adds its parser and sets ``func`` to a
callable taking the parsed args and returning an exit code. Errors from the hulk hierarchy are
printed as one line; users never see a traceback for a known error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from hulk import __version__
from hulk.errors import HulkError
from hulk.settings import env

COMMAND_MODULES = [
    "planner.commands.serve",
    "planner.commands.fleet",
    "planner.commands.plan",
    "planner.commands.train",
    "planner.commands.enroll",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hulk-planner",
        description="Plan large-model training jobs on a geo-distributed GPU fleet.")
    parser.add_argument("--version", action="version", version=f"hulk-planner {__version__}")
    parser.add_argument("--log-level", default=env("HULK_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command not built yet in this checkout
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except HulkError as exc:
        print(f"hulk-planner: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error worth a traceback.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
