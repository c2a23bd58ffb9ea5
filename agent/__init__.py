"""hulk-agent: GPU inventory, RTT probing, a local spool and the gRPC reporter (no torch here)."""

from hulk import __version__

__all__ = ["__version__"]
