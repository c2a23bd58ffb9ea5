"""What the agent reads from others, hostile: the job's progress file (HULK_PROGRESS_FILE, written
by the training process), placement messages and the retained plan summary (from the broker,
signed or not), and its own placement file after a crash. Random bytes and hostile documents give
a value within docs/BOUNDS.md or a clean refusal (None, or one InputError line); a placement is
acted on only when signed by the pinned key."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.placement import AcceptedMark, PlacementFile
from agent.progress import MAX_LINE_BYTES, parse_line, read_progress
from hulk.bounds import NODE_PLACEMENT, STEP_PROGRESS
from hulk.errors import InputError
from hulk.wire.placement import NodePlacement, Role, parse_placement, parse_summary
from hulk.wire.signing import Signer
from tests.helpers.hostile import documents, dumps, json_values, one_clear_line, texts, within

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
QUICK = settings(FUZZ, max_examples=80)   # the fast lane's share: arbitrary bytes
SIGNER = Signer.generate()
TOPIC = "hulk/v1/f1/nodes/n2/placement"
T0 = 1_790_000_000_000


def check_progress(progress) -> None:
    if progress is None:
        return
    for field, limit in STEP_PROGRESS.rows:
        assert within(limit, getattr(progress, field)), (field, progress)


# --------------------------------------------------------------------------- progress file

progress_lines = (st.fixed_dictionaries({
    "step": json_values, "step_s": json_values}, optional={
    "time": json_values, "compute_s": json_values, "communication_s": json_values,
    "total_steps": json_values}).map(dumps) | texts)


@pytest.mark.slow   # a fuzzer: 100 examples of files of many lines
@settings(FUZZ, max_examples=100)
@given(st.lists(progress_lines | st.just('{"step": 3, "step_s": 1.5}'), max_size=12),
       st.binary(max_size=200))
def test_progress_file_hostile_lines_and_bytes(lines, noise):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "progress.jsonl"
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n" + noise)
        check_progress(read_progress(path))


@QUICK
@given(st.binary(max_size=MAX_LINE_BYTES + 10))
def test_progress_file_arbitrary_bytes(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "progress.jsonl"
        path.write_bytes(data)
        check_progress(read_progress(path))


@pytest.mark.parametrize("line", ["[" * 3000, "{" * 4000, '{"step": ' + "9" * 4000 + "}",
                                  '{"step": 1, "step_s": NaN}', '{"step": -1, "step_s": 1}'])
def test_progress_line_nested_deeply_or_out_of_bounds_is_skipped(line):
    assert parse_line(line) is None


# ---------------------------------------------------------------------- placement messages

def placement(**changes) -> NodePlacement:
    role = Role(plan_id="p1", job="opt", phase=0, stage=1, num_stages=2, layer_lo=12,
                layer_hi=24, replica=0, num_replicas=1, rank=1, world_size=2,
                rendezvous_address="10.0.0.1", rendezvous_port=29500, micro_batch=1,
                command=("python", "train.py"), checkpoint_dir="ckpt")
    bare = NodePlacement(fleet="f1", node="n2", plan_id="p1", roles=(role,), seq=5)
    return NodePlacement(**{**bare.__dict__, **changes}).signed(
        SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 3600_000)


VALID_PLACEMENT = placement().to_json()


def check_placement(data: bytes) -> None:
    """Parsed with the pinned key: a placement within docs/BOUNDS.md, or one InputError line."""
    try:
        got = parse_placement(data, source=TOPIC, verifier=SIGNER.verifier())
    except Exception as err:  # noqa: BLE001 - the property is which errors escape
        one_clear_line(err, TOPIC)
        return
    assert got.to_json() == json.loads(data), "a placement not as signed was accepted"
    for field in ("fleet", "node", "plan_id"):
        assert within(NODE_PLACEMENT.limit(field), getattr(got, field))
    for role in got.roles:
        assert within(NODE_PLACEMENT.limit("roles[].job"), role.job)
        assert len(role.command or ()) <= 256


def test_the_signed_placement_reads():
    got = parse_placement(json.dumps(VALID_PLACEMENT), source=TOPIC, verifier=SIGNER.verifier())
    assert got.seq == 5 and got.roles[0].job == "opt"


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(documents(VALID_PLACEMENT))
def test_placement_hostile_documents_are_refused_cleanly(doc):
    # Any change breaks the signature, unless the change is a no-op: either way, no exception.
    check_placement(dumps(doc).encode())


@QUICK
@given(st.binary(max_size=300) | json_values.map(lambda v: dumps(v).encode()))
def test_placement_arbitrary_payloads(data):
    check_placement(data)


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(st.data())
def test_signed_hostile_placements_parse_or_are_refused(data):
    """Signed with the pinned key (a planner that was fed hostile input): still bounded."""
    doc = data.draw(documents({k: v for k, v in VALID_PLACEMENT.items() if k != "signature"}))
    if isinstance(doc, dict):
        try:
            doc = SIGNER.sign(doc)
        except (TypeError, ValueError):   # not JSON a signer can write (NaN, odd keys)
            return
    check_placement(dumps(doc).encode())


@pytest.mark.slow   # a fuzzer: 200 examples, two files written atomically each
@FUZZ
@given(st.binary(max_size=300) | documents(VALID_PLACEMENT).map(lambda d: dumps(d).encode()))
def test_stored_placement_file_reads_or_is_ignored(data):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / PlacementFile(Path(tmp)).path.name).write_bytes(data)
        got = PlacementFile(Path(tmp)).load()
        assert got is None or isinstance(got, NodePlacement)
        (Path(tmp) / AcceptedMark(Path(tmp)).path.name).write_bytes(data)
        mark = AcceptedMark(Path(tmp))
        assert isinstance(mark.seq, int) and mark.seq >= -1


# ---------------------------------------------------------------------------- plan summary

VALID_SUMMARY = {
    "format": "hulk-plan-summary/2", "fleet": "f1", "plan_id": "p1", "method": "hulk",
    "issued_at_ms": T0, "expires_at_ms": T0 + 3600_000,
    "jobs": [{"name": "opt", "plan_id": "p1", "phase": 0, "micro_batch": 1,
              "stages": [{"layers": [0, 48], "nodes": ["n1"]}, {"layers": [48, 96], "nodes": ["n2"]}],
              "spec": {"model": "opt-175b"}}],
    "unplaced": [{"name": "big", "reason": "no room", "spec": {}}],
}


def check_summary(data: bytes) -> None:
    try:
        got = parse_summary(data, source="hulk/v1/f1/plan")
    except Exception as err:  # noqa: BLE001
        one_clear_line(err, "hulk/v1/f1/plan")
        return
    assert within(NODE_PLACEMENT.limit("plan_id"), got.plan_id)
    for name, _, spec in got.unplaced:
        assert isinstance(name, str) and isinstance(spec, dict)


def test_the_summary_reads():
    assert parse_summary(json.dumps(VALID_SUMMARY)).jobs[0].name == "opt"


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(documents(VALID_SUMMARY))
def test_summary_hostile_documents(doc):
    check_summary(dumps(doc).encode())


@pytest.mark.parametrize("key, value", [("jobs", 5), ("unplaced", 5), ("jobs", {"a": 1}),
                                        ("unplaced", [{"name": 5}]), ("fleet", "f" * 300),
                                        ("method", "m" * 300), ("method", 5)])
def test_summary_fields_of_the_wrong_shape_are_refused(key, value):
    with pytest.raises(InputError, match=key):
        parse_summary(json.dumps({**VALID_SUMMARY, key: value}))


def test_summary_stages_of_the_wrong_shape_are_refused():
    job = {**VALID_SUMMARY["jobs"][0], "stages": 7}
    with pytest.raises(InputError, match=r"jobs\[0\].stages"):
        parse_summary(json.dumps({**VALID_SUMMARY, "jobs": [job]}))


@pytest.mark.parametrize("field", ["fleet", "node", "plan_id"])
def test_placement_texts_past_their_bound_are_refused(field):
    doc = placement(**{field: "x" * 1000}).to_json()
    with pytest.raises(InputError, match=field):
        parse_placement(json.dumps(doc), source=TOPIC, verifier=SIGNER.verifier())
