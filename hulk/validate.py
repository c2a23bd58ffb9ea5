"""One kit of located checks for every input: settings, flags and files, agent and planner alike.

A parser takes a raw value (a string from a variable or a flag, or what YAML or JSON gave) and
returns the typed value, or raises :class:`Invalid` saying what was expected. The caller knows
where the value came from (file and line, variable, flag, field path such as ``jobs[2].params``)
and turns the complaint into the project's one error tree (:mod:`hulk.errors`) with
:meth:`Invalid.error` or :func:`located`, so a user reads one line naming the place and what was
expected; the command exits with code 2.

This module imports nothing beyond the standard library and :mod:`hulk.errors`: the agent uses it
and may not import numpy, torch or the planner.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hulk.errors import InputError

BOOLEAN_WORDS = {"1": True, "true": True, "yes": True, "on": True,
                 "0": False, "false": False, "no": False, "off": False}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_EXPECTED = "1-128 letters, digits, '.', '_' or '-' starting with a letter or digit"
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
# What no name, path, address or token may hold (NUL, newline, escape, DEL): the planner's
# admission refuses the same characters in Register's texts.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class Invalid(ValueError):
    """A value that is not what was expected: the expectation, and where the value was."""

    def __init__(self, expected: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        super().__init__(expected)
        self.expected, self.path, self.line, self.field = expected, path, line, field

    def error(self, kind: type[InputError] = InputError, *, path: str | None = None,
              line: int | None = None, field: str | None = None) -> InputError:
        """The project's error for this complaint; the location given here fills in what the
        complaint itself does not know."""
        return kind(self.expected, path=self.path or path, line=self.line or line,
                    field=self.field or field)


@contextmanager
def located(kind: type[InputError] = InputError, *, path: str | None = None,
            line: int | None = None, field: str | None = None) -> Iterator[None]:
    """Turn an :class:`Invalid` raised inside into ``kind`` (InputError, ConfigError) there."""
    try:
        yield
    except Invalid as bad:
        raise bad.error(kind, path=path, line=line, field=field) from None


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (a long text; an integer of thousands of
    digits is named by its length)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** limit:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------------- numbers

@dataclass(frozen=True)
class Bound:
    """The sensible range of one numeric input, with its unit: what ``check`` accepts."""

    low: float
    high: float
    unit: str                 # "seconds", "parameters": names the number in the message
    integer: bool = False

    @property
    def expected(self) -> str:
        if self.integer:
            return f"a whole number of {self.unit} between {self.low:,} and {self.high:,}"
        return f"{self.unit} between {self.low:g} and {self.high:g}"

    def check(self, value: Any) -> int | float:
        """The number ``value`` gives (a number, or its text), inside the bounds; NaN, infinity,
        booleans and integers of a thousand digits are refused like any other stray value."""
        number = self._number(value)
        if number is None or not self.low <= number <= self.high:   # NaN fails both
            raise Invalid(f"expected {self.expected}, got {shown(value)}")
        return number

    __call__ = check

    def _number(self, value: Any) -> int | float | None:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return None
        if isinstance(value, str):   # a variable, a flag, or YAML 1.1's 175e9 (no dot)
            text = value.strip()
            if self.integer:
                return int(text) if _INTEGER_TEXT.fullmatch(text) and len(text) < 400 else None
            try:
                value = float(text)
            except ValueError:
                return None
        if self.integer:
            if isinstance(value, float):
                return int(value) if math.isfinite(value) and value.is_integer() else None
            return value
        try:
            return float(value)
        except OverflowError:   # an integer beyond any float
            return None


# ----------------------------------------------------------------------------------- text

def single(value: Any) -> str:
    """One value as stripped text (a list or mapping where one value belongs is refused)."""
    if isinstance(value, (dict, list)):
        raise Invalid("expected a single value")
    return str(value).strip()


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = BOOLEAN_WORDS.get(single(value).lower())
    if word is None:
        raise Invalid(f"expected true/false (1/0, yes/no, on/off), got {shown(value)}")
    return word


def choice(value: Any, options: Sequence[str], fold: Callable[[str], str] = str.upper) -> str:
    """One of ``options``, compared after ``fold`` (log levels are upper case)."""
    text = fold(single(value))
    if text not in options:
        raise Invalid(f"expected one of {', '.join(options)}, got {shown(value)}")
    return text


def host_port(value: Any, example: str, *, port_zero: bool = False) -> str:
    """HOST:PORT (an IPv6 host in brackets); ``port_zero``: port 0 (any free port) is allowed."""
    text = single(value)
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    low = 0 if port_zero else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) <= 65535:
        raise Invalid(f"expected HOST:PORT (e.g. {example}), got {text!r}")
    return text


def is_name(value: Any) -> bool:
    """The one rule for node ids and fleet names (``NAME_RE``, the whole text): they become MQTT
    topic levels, file names and table cells, so no '/', '+', '#', spaces or escapes."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def node_id(value: Any) -> str:
    """A node id as every path takes it (registration, topics, fleet files, the store); not
    stripped: an id with spaces around it is not the id without them."""
    if not is_name(value):
        raise Invalid(f"expected a node id of {NAME_EXPECTED}, got {shown(value)}")
    return value


def name(value: Any, pattern: re.Pattern[str] = NAME_RE, expected: str = NAME_EXPECTED) -> str:
    text = single(value)
    if not pattern.match(text):
        raise Invalid(f"expected {expected}, got {shown(text)}")
    return text


def ip_address(value: Any) -> str:
    """An IP address, or "" (none given)."""
    text = single(value)
    if text:
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise Invalid(f"expected an IP address, got {shown(text)}") from None
    return text


def terminal_safe(text: str) -> str:
    """``text`` with control characters shown as '?' (tabs kept): a log's escape sequences
    (colours, a cleared screen, a window title) must not act on an operator's terminal or page."""
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in text)


def printable(value: Any, max_chars: int, what: str) -> str:
    text = single(value)
    if len(text) > max_chars:
        raise Invalid(f"expected {what} of at most {max_chars} characters, got {len(text)}")
    if not text.isprintable():
        raise Invalid(f"expected {what} of printable characters, got {shown(text)}")
    return text


def bounded_text(value: Any, max_chars: int, what: str) -> str:
    """One value as stripped text of at most ``max_chars`` characters and no control
    characters; the complaint names ``what`` ("a city name") and the bound."""
    text = single(value)
    if len(text) > max_chars:
        raise Invalid(f"expected {what} of at most {max_chars:,} characters, got {len(text):,}")
    if CONTROL_RE.search(text):
        raise Invalid(f"expected {what} without control characters (NUL, newline, escape), "
                      f"got {shown(text)}")
    return text


def identifiers(value: Any, separator: str = ",") -> tuple[str, ...]:
    """Variable names: a list, or one text with ``separator`` between them."""
    items = value.split(separator) if isinstance(value, str) else value
    if not isinstance(items, list):
        raise Invalid("expected a list of variable names")
    names = tuple(str(n).strip() for n in items if str(n).strip())
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
    if bad:
        raise Invalid(f"expected variable names, got {shown(bad[0])}")
    return names


def from_error(parse: Callable[[str], Any]) -> Callable[[Any], str]:
    """A parser from a check that raises a located error of its own (broker URL, signing key):
    its message becomes the complaint, located again by the caller."""
    def parser(value: Any) -> str:
        text = single(value)
        if text:
            try:
                parse(text)
            except InputError as exc:
                raise Invalid(str(exc)) from None
        return text
    return parser
