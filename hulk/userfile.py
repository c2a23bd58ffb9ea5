"""Reading a file a user names (a fleet file, jobs.yaml, a plan): a regular file of bounded size.

A device such as ``/dev/zero`` would be read until memory runs out, and a FIFO would block the
command for ever; both are refused before a byte is read. The file is opened without blocking
and checked on the open descriptor, so nothing swapped in after a check gets through. The size
is checked before reading and again while reading (a file that grows).

A YAML file a person writes (jobs.yaml, agent.yaml) is read by :func:`load_yaml`: each mapping
remembers the line of each key, and a key written twice in one mapping is refused (naming the
key and both lines) instead of the last one silently winning.

The standard library, PyYAML and :mod:`hulk` only: the agent uses it too.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from hulk.errors import InputError
from hulk.validate import shown


def read_user_file(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them; otherwise a
    one-line InputError naming the file and ``what`` was expected ("a fleet file")."""
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"no such file (expected {what})", path=where) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=where) from None
    try:
        mode, size = (info := os.fstat(fd)).st_mode, info.st_size
        if stat.S_ISDIR(mode):
            raise InputError(f"is a directory; expected {what}", path=where)
        if not stat.S_ISREG(mode):
            raise InputError(f"not a regular file (a device, FIFO or socket); expected {what}",
                             path=where)
        if size > max_bytes:
            raise too_large(where, what, max_bytes, f"{size:,} bytes")
        chunks, total, want = [], 0, size + 1   # one read takes a regular file whole
        while total <= max_bytes:
            chunk = os.read(fd, min(want, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = 1 << 20
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=where) from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise too_large(where, what, max_bytes, "more (it grew while read)")
    return b"".join(chunks)


def too_large(where: str, what: str, max_bytes: int, size: str) -> InputError:
    mib = f" ({max_bytes >> 20:,} MiB)" if max_bytes >= 1 << 20 else ""
    return InputError(f"expected {what} of at most {max_bytes:,} bytes{mib}, got {size}",
                      path=where)


# ------------------------------------------------------------------------------------- YAML

class LineMapping(dict):
    """A YAML mapping that remembers its 1-based line and the line of each of its keys."""

    line: int | None = None
    key_lines: dict


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key written twice in one mapping; ``problem_mark`` is the second writing."""

    def __init__(self, key: Any, first_line: int, mark: yaml.Mark):
        super().__init__(None, None, f"duplicate key {shown(key, 80)} (first on line "
                         f"{first_line}; expected each key once)", mark)
        self.key, self.first_line = key, first_line


class LineLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with :class:`LineMapping` mappings and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):  # noqa: D401 - PyYAML hook
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML itself reports unhashable keys below
            if key in seen:
                raise DuplicateKeyError(key, seen[key], key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        mapping = LineMapping(super().construct_mapping(node, deep=deep))
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = seen
        return mapping


LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                           LineLoader.construct_mapping)


def line_of(mapping: Any, key: Any = None) -> int | None:
    """The line of ``key`` in a mapping :func:`load_yaml` made (of the mapping itself when
    ``key`` is None or not in it); None for anything else."""
    if isinstance(mapping, LineMapping):
        if key is not None and key in mapping.key_lines:
            return mapping.key_lines[key]
        return mapping.line
    return None


def load_yaml(text: str, path: str, what: str, *, kind: type[InputError] = InputError,
              lead: str = "not valid YAML") -> Any:
    """The document of ``text`` (mappings as :class:`LineMapping`), or one-line ``kind``
    naming ``path`` and the line: bad YAML and duplicate keys as ``lead: problem``, nesting
    too deep for the parser as "not ``what``" ("a jobs file")."""
    try:
        return yaml.load(text, Loader=LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise kind(f"{lead}: {problem}", path=path, line=line) from None
    except yaml.YAMLError as exc:
        raise kind(f"{lead}: {exc}".splitlines()[0], path=path) from None
    except RecursionError:
        raise kind(f"not {what}: YAML nested too deeply", path=path) from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise kind(f"{lead}: {exc}".split(";")[0], path=path) from None
