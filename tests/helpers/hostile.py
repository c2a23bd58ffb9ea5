"""Hostile values for the property tests of tests/hostile/: numbers at and past every edge (NaN,
infinities, the limits of each integer type), long texts and texts of control characters, many
repeated items; protobuf messages built from them field by field (every field of a message, so a
field added to the contract is fuzzed without a change here); and the check that a value kept is
within its docs/BOUNDS.md row."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from hulk.bounds import Limit, Rule, Text, Unbounded
from hulk.errors import HulkError
from hulk.validate import Bound, Invalid

INT_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: (-2 ** 31, 2 ** 31 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2 ** 32 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-2 ** 63, 2 ** 63 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2 ** 64 - 1),
}
EDGE_INTS = (0, 1, -1, 100, 101, 255, 256, 1024, 65535, 65536, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1,
             2 ** 44, 2 ** 44 + 1, 2 ** 53, 2 ** 53 + 1, 10 ** 14, 2 ** 63 - 1, 2 ** 64 - 1,
             -2 ** 31, -2 ** 63)
EDGE_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e-9, 1.0, 60_000.0,
               60_000.000001, 1e15, 1e16, 1e300, 1.7976931348623157e308, -1.0, -1e308)
NASTY_TEXTS = ("", " ", "\x00", "a\x00b", "line\nbreak", "\r\n", "\x1b]0;title\x07",
               "\x1b[2J", "\u202e", "\u2028", "\u200b", "a/b", "#", "+", "..", ".", "../x",
               "<img src=x onerror=alert(1)>", "%s%n", "' OR 1=1 --", "\ufeff", "é" * 10)


def ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in EDGE_INTS if low <= v <= high] + [low, high]
    return st.sampled_from(edges) | st.integers(low, high)


doubles = st.sampled_from(EDGE_FLOATS) | st.floats()
texts = (st.sampled_from(NASTY_TEXTS)
         | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
         | st.integers(0, 5000).map(lambda n: "x" * n)
         | st.sampled_from((63, 64, 65, 100, 101, 127, 128, 129, 254, 255, 256, 1024, 1025,
                            4096, 4097)).map(lambda n: "a" * n))
blobs = st.binary(max_size=64) | st.sampled_from((31, 32, 33, 1 << 16)).map(lambda n: b"k" * n)
counts = st.sampled_from((0, 0, 1, 1, 2, 3)) | st.sampled_from((63, 64, 65, 100, 101))


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    cpp = field.cpp_type
    if cpp in INT_RANGES:
        return ints(*INT_RANGES[cpp])
    if cpp in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        return doubles
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return st.booleans()
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        return ints(-3, 12)   # proto3 enums are open: an agent may send a value we do not know
    if field.type == FieldDescriptor.TYPE_BYTES:
        return blobs
    return texts


@st.composite
def messages(draw: st.DrawFn, cls: type, depth: int = 0) -> Any:
    """A ``cls`` message with each field left at its default or set to hostile values; a
    repeated field gets 0-3 items, or up to 101 copies of one."""
    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        is_message = field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE
        if is_message and depth >= 3:
            continue
        target = getattr(msg, field.name)
        if field.is_repeated:
            n = draw(counts)
            if is_message:
                item = draw(messages(message_factory.GetMessageClass(field.message_type), depth + 1))
                for _ in range(n):
                    target.add().CopyFrom(item)
            else:
                target.extend([draw(scalar(field))] * n)
        elif is_message:
            target.CopyFrom(draw(messages(message_factory.GetMessageClass(field.message_type), depth + 1)))
        else:
            setattr(msg, field.name, draw(scalar(field)))
    return msg


def leaf_paths(msg: Any, prefix: tuple = ()) -> list[tuple]:
    """Every settable place of ``msg``: (field name | index, ...) to a scalar, a repeated field
    or a message field."""
    out = []
    for field in msg.DESCRIPTOR.fields:
        path = prefix + (field.name,)
        value = getattr(msg, field.name)
        out.append(path)
        if field.cpp_type != FieldDescriptor.CPPTYPE_MESSAGE:
            continue
        if field.is_repeated:
            for i, item in enumerate(value):
                out += leaf_paths(item, path + (i,))
        elif msg.HasField(field.name):
            out += leaf_paths(value, path)
    return out


def _field(msg: Any, name: str) -> FieldDescriptor:
    return msg.DESCRIPTOR.fields_by_name[name]


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """``base`` (a valid message) with one to three places set to hostile values: a scalar to
    any value of its type, a repeated field to many copies of its first item, a message to a
    random one."""
    msg = type(base)()
    msg.CopyFrom(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(leaf_paths(msg)))
        parent = msg
        for step in path[:-1]:
            parent = parent[step] if isinstance(step, int) else getattr(parent, step)
        field = _field(parent, path[-1])
        target = getattr(parent, path[-1])
        if field.is_repeated:
            n = draw(counts)
            if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                item = type(target[0])() if len(target) else draw(
                    messages(message_factory.GetMessageClass(field.message_type), 1))
                if len(target):
                    item.CopyFrom(target[0])
                del target[:]
                for _ in range(n):
                    target.add().CopyFrom(item)
            else:
                value = target[0] if len(target) else draw(scalar(field))
                del target[:]
                target.extend([value] * n)
        elif field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            target.CopyFrom(draw(messages(message_factory.GetMessageClass(field.message_type), 1)))
        else:
            setattr(parent, path[-1], draw(scalar(field)))
    return msg


def within(limit: Limit, value: Any) -> bool:
    """Whether a value the planner kept is inside its docs/BOUNDS.md row (NULL is no value)."""
    if value is None or isinstance(limit, (Rule, Unbounded)):
        return True
    if isinstance(limit, Text):
        # bytes: a store keeps some texts packed (a batch id of hex digits as its bytes)
        return isinstance(value, (str, bytes)) and len(value) <= limit.max_chars
    try:
        limit.check(value)
    except Invalid:
        return False
    return True


def one_clear_line(err: BaseException, *names: str) -> None:
    """``err`` is the project's error, one line, naming each of ``names`` (a file, a field)."""
    assert isinstance(err, HulkError), f"{type(err).__name__}: {err}"
    text = str(err)
    assert text.strip() and "\n" not in text and "Traceback" not in text, repr(text)
    for name in names:
        assert name in text, f"{name!r} not in {text!r}"


def above(bound: Bound) -> int | float:
    """The least value past ``bound``'s top."""
    return int(bound.high) + 1 if bound.integer else math.nextafter(bound.high, math.inf)


def below(bound: Bound) -> int | float:
    """The greatest value under ``bound``'s bottom."""
    return int(bound.low) - 1 if bound.integer else math.nextafter(bound.low, -math.inf)


# ------------------------------------------------------------------------ JSON documents

json_scalars = st.none() | st.booleans() | ints(-2 ** 70, 2 ** 70) | doubles | texts
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(texts, inner, max_size=4)
                           | counts.map(lambda n: [0] * n), max_leaves=12)


def _places(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _places(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _places(value, prefix + (i,))
    return out


@st.composite
def documents(draw: st.DrawFn, valid: Any) -> Any:
    """``valid`` (a JSON document) with one to three places replaced by hostile values, deleted
    (from an object) or repeated many times (an item of a list)."""
    import copy

    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        places = _places(doc)
        if not places:
            return draw(json_values)
        path = draw(st.sampled_from(places))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(("replace", "replace", "delete", "repeat")))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "repeat" and isinstance(parent, list):
            parent[:] = parent + [copy.deepcopy(parent[path[-1]])] * draw(counts)
        else:
            parent[path[-1]] = draw(json_values)
    return doc


def deep(n: int = 100_000) -> str:
    """JSON nested past any recursion limit."""
    return "[" * n + "]" * n


def dumps(doc: Any) -> str:
    """The document as JSON text, NaN and Infinity literals included (what a hostile writer
    may well send)."""
    import json

    return json.dumps(doc, allow_nan=True)


HUGE_INTEGER = "9" * 5000    # past Python's 4,300 digits for int() of a text
