"""A pause of Python's cyclic garbage collector while many long-lived, acyclic objects are made.

Reading a fleet makes hundreds of thousands of small objects (link dicts, Link records) that
form no reference cycles; the collector would walk them again and again as they are made.
Reference counting still frees everything as usual. Not for the search: it does make cyclic
garbage, and pausing the collector there made it a third slower.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block, back as it was after (even on an error)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
