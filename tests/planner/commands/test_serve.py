"""`hulk-planner serve` flags: every bad value is a one-line ConfigError naming the flag, raised
before the store is opened (the serve process itself is tested in tests/planner/service)."""

from __future__ import annotations

import pytest

from hulk.errors import ConfigError
from planner import cli
from planner.commands.serve import check_flags
from planner.settings import PlannerSettings
from tests.helpers.signing import write_signing_key


def serve_args(*flags: str):
    return cli.build_parser(PlannerSettings()).parse_args(["serve", *flags])


def test_good_flags_pass(tmp_path):
    check_flags(serve_args("--db", str(tmp_path / "p.db"), "--insecure", "--mqtt", "mqtt://b",
                           "--signing-key", write_signing_key(tmp_path / "k"), "--node-timeout", "5",
                           "--model-dir", str(tmp_path / "model"),
                           "--retrain-job-sets", "2", "--retrain-epochs", "1",
                           "--fleet-name", "eu-1.prod_A", "--rollup-seconds", "1",
                           "--jobs-interval", "0.3", "--recovery-interval", "0.25"))
    assert not (tmp_path / "p.db").exists()


def test_checking_returns_the_signer_and_leaves_the_flags_as_parsed(tmp_path):
    args = serve_args("--db", str(tmp_path / "p.db"), "--mqtt", "mqtt://b",
                      "--signing-key", write_signing_key(tmp_path / "k"))
    parsed = dict(vars(args))
    checked = check_flags(args)
    assert checked.signer is not None and vars(args) == parsed
    assert check_flags(serve_args("--db", str(tmp_path / "p.db"))).signer is None


@pytest.mark.parametrize("flags, field", [
    ((), "--db"),
    (("--raw-days", "0"), "--raw-days"),
    (("--window-days", "0"), "--window-days"),
    (("--rate-limit", "0"), "--rate-limit"),
    (("--rate-burst", "inf"), "--rate-burst"),
    (("--raw-days", "100000"), "--raw-days"),
    (("--report-seconds", "1e300"), "--report-seconds"),
    (("--jobs-interval", "nan"), "--jobs-interval"),
    (("--rollup-seconds", "0"), "--rollup-seconds"),
    (("--probe-peers", "1"), "--probe-peers"),
    (("--probe-site-reps", "0"), "--probe-site-reps"),
    (("--probe-epoch", "nan"), "--probe-epoch"),
    (("--probe-epoch", "5"), "--probe-epoch"),
    (("--mqtt", "tcp://b"), "--mqtt"),
    (("--mqtt", "mqtt://b", "--node-timeout", "0"), "--node-timeout"),
    (("--mqtt", "mqtt://b", "--recovery-interval", "-1"), "--recovery-interval"),
    (("--mqtt", "mqtt://b"), "--signing-key"),
    (("--mqtt", "mqtt://b", "--signing-key", "/no/such/key"), "--signing-key"),
    (("--retrain",), "--retrain"),
    (("--model-dir", "M", "--retrain-check-interval", "0"), "--retrain-check-interval"),
    (("--model-dir", "M", "--retrain-teacher-budget", "-1"), "--retrain-teacher-budget"),
    (("--model-dir", "M", "--retrain-job-sets", "1"), "--retrain-job-sets"),
    (("--model-dir", "M", "--retrain-epochs", "0"), "--retrain-epochs"),
    (("--throughput-period", "nan"), "--throughput-period"),
    (("--throughput-period", "1"), "--throughput-period"),
    (("--throughput-budget-gb", "-1"), "--throughput-budget-gb"),
    (("--fleet-name", "a/#"), "--fleet-name"),       # an MQTT topic level: no '/', '+', '#'
    (("--fleet-name", "+"), "--fleet-name"),
    (("--fleet-name", ""), "--fleet-name"),
    (("--fleet-name", "eu 1"), "--fleet-name"),
    (("--fleet-name", "eu-1\n"), "--fleet-name"),
    (("--fleet-name", "f" * 129), "--fleet-name"),
    (("--rollup-seconds", "1e-9"), "--rollup-seconds"),    # a full core
    (("--rollup-seconds", "0.05"), "--rollup-seconds"),
    (("--jobs-interval", "1e-9"), "--jobs-interval"),
    (("--rate-limit", "nan"), "--rate-limit"),             # rate limiting off
    (("--rate-limit", "inf"), "--rate-limit"),
    (("--rate-burst", "nan"), "--rate-burst"),
])
def test_bad_flags_name_the_flag(flags, field, tmp_path):
    db = () if field == "--db" else ("--db", str(tmp_path / "p.db"))
    flags = tuple(str(tmp_path / "model") if f == "M" else f for f in flags)
    with pytest.raises(ConfigError) as err:
        check_flags(serve_args(*db, *flags))
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_model_dir_that_is_a_file_is_refused(tmp_path):
    model = tmp_path / "model"
    model.write_text("not a folder")
    with pytest.raises(ConfigError, match="expected a folder"):
        check_flags(serve_args("--db", str(tmp_path / "p.db"), "--model-dir", str(model)))
