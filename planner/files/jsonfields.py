"""Typed, located access to the fields of a JSON document (fleet files).

The document is parsed with the C parser; the line an object starts on is found only when a
message needs it (a second, pure-Python parse of the text, paid only by a file with an error or a
flaw to report).
"""

from __future__ import annotations

import bisect
import json
import json.decoder
import json.scanner
import math
from collections.abc import Callable
from typing import Any

from hulk.errors import InputError
from hulk.validate import Bound

MAX_JSON_INT = 2 ** 53          # beyond this a JSON integer is no count, memory or RTT we can use


class _Located(dict):
    """A JSON object that remembers the line it starts on."""

    line: int = 0


def _locating_loads(text: str) -> Any:
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    decoder = json.JSONDecoder()

    def parse_object(s_and_end, *args, **kwargs):
        _, start = s_and_end
        obj, end = json.decoder.JSONObject(s_and_end, *args, **kwargs)
        located = _Located(obj)
        located.line = bisect.bisect_left(newlines, start) + 1
        return located, end

    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    return decoder.decode(text)


DUPLICATE_CHECK_BYTES = 4 * 2 ** 20   # files a person writes (the check costs 2-3x the read)


class _Duplicate(Exception):
    def __init__(self, key: str):
        self.key = key


def _refuse_duplicates(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        raise _Duplicate(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def duplicate_key(text: str) -> tuple[str, int] | None:
    """The first key written twice in one object of ``text`` and the line of its second
    writing; None when there is none (or the text is no JSON: the reader words that). The C
    parser looks; the line is sought only when it found one."""
    try:
        json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _Duplicate as dup:
        key = dup.key
    except (ValueError, RecursionError):
        return None
    else:
        return None
    where: list[int] = []
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    decoder = json.JSONDecoder()

    def parse_object(s_and_end, strict, scan_once, *args, **kwargs):
        s, start = s_and_end
        pairs, end = json.decoder.JSONObject(s_and_end, strict, scan_once, None, list, {})
        keys = [k for k, _ in pairs]
        if not where and keys.count(key) > 1:
            # The second writing: the key's text after the first one in this object.
            token = json.dumps(key)
            at = s.find(token, s.find(token, start) + len(token))
            where.append(bisect.bisect_left(newlines, at if at >= 0 else start) + 1)
        return dict(pairs), end

    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except (ValueError, RecursionError):
        pass
    return key, (where[0] if where else 1)


class LineFinder:
    """Line numbers of a JSON document's objects, found only when a message needs one.

    The document is read with the C parser; only a file with an error or a flaw to report pays
    for the second, pure-Python parse that records where each object starts.
    """

    def __init__(self, text: str | Callable[[], str]):
        self._text = text     # or a function that decodes it, called only if a line is asked for
        self._located: Any = None

    @property
    def text(self) -> str:
        if callable(self._text):
            self._text = self._text()
        return self._text

    def line(self, *keys: str | int) -> int | None:
        if self._located is None:
            try:
                self._located = _locating_loads(self.text)
            except (RecursionError, ValueError):
                return None
        node = self._located
        for key in keys:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                return None
        return getattr(node, "line", None)


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # "\ud800" is valid JSON but no text a terminal or file can hold
        return False
    return True


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object", _Located: "object"}.get(type(value), type(value).__name__)


class Fields:
    """Typed access to one JSON object's fields, with errors naming file, line and field."""

    def __init__(self, obj: dict[str, Any], path: str, where: str, line: Callable[[], int | None]):
        self.obj, self.path, self.where, self.line = obj, path, where, line

    def fail(self, key: str, expected: str) -> InputError:
        got = self.obj.get(key, None)
        shown = json.dumps(got)[:80] if key in self.obj else "nothing"
        return InputError(f"expected {expected}, got {shown}", path=self.path,
                          line=self.line(), field=f"{self.where}.{key}")

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self.obj.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.fail(key, "a non-empty string" if required else "a string or null")
        if not is_unicode(value):
            raise self.fail(key, "valid Unicode text (no lone surrogate escapes)")
        return value

    def text(self, key: str, max_chars: int, *, required: bool = False) -> str | None:
        """A string of at most ``max_chars`` printable characters (what reaches a terminal or
        the dashboard: no control or format characters, no escape sequences)."""
        value = self.string(key, required=required)
        if value is not None and (len(value) > max_chars or not value.isprintable()):
            raise self.fail(key, f"at most {max_chars} printable characters (no control "
                            "characters)")
        return value

    def number(self, key: str, *, required: bool = False, default: float | None = None,
               low: float | None = None, high: float | None = None,
               integer: bool = False, bound: Bound | None = None) -> float | None:
        """The number at ``key`` (``default`` when absent or null and not ``required``), within
        ``bound`` (a sensible range with its unit) or ``low`` and ``high``."""
        value = self.obj.get(key)
        if bound is not None:
            low, high, integer = bound.low, bound.high, bound.integer
            kind, bounds = bound.expected, ""
        else:
            kind = "an integer" if integer else "a number"
            bounds = "" if low is None else f" >= {low:g}"
            if high is not None:
                bounds += f"{' and' if low is not None else ''} <= {high:g}"
        if value is None:
            if required:
                raise self.fail(key, kind + bounds)
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (isinstance(value, int) and not -MAX_JSON_INT <= value <= MAX_JSON_INT) \
                or not math.isfinite(value) or (integer and not float(value).is_integer()):
            raise self.fail(key, kind + bounds + ("" if required else " or null"))
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, kind + bounds)
        return int(value) if integer else float(value)
