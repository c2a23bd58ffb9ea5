"""The `hulk-planner` subcommands: one module each, whose ``register(subparsers, settings)`` adds
its parser and the function it runs; the only place that knows argparse."""
