"""The `hulk-planner` subcommands: one module each, whose ``register(subparsers, settings)`` adds
its parser and the function it runs; the only place that knows argparse."""

import argparse


def seed_number(text: str) -> int:
    """A ``--seed``: numpy's generators take only whole numbers from 0 to 2**32 - 1."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 0 to 4294967295, got {text!r}")
    return value
