"""Hulk: shared pieces of the agent and the planner (errors, settings, geography, wire contract)."""

__version__ = "0.1.0"
