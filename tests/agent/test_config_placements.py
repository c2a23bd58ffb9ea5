"""The agent's placement settings: placement_key, allowed_commands, pass_env, torchrun."""

from __future__ import annotations

import pytest

from agent.config import load_config
from agent.placement import PlacementSubscriber
from hulk.errors import ConfigError, InputError
from hulk.wire.broker import parse_broker_url
from hulk.wire.placement import NodePlacement
from hulk.wire.signing import Signer, Verifier
from tests.helpers.signing import PUBLIC_KEY, SIGNER, T0

BROKER = parse_broker_url("mqtt://127.0.0.1:1883", source="test")

BASE = {"planner": "p:1", "node_id": "n1"}


def test_defaults_allow_nothing_and_pin_no_key():
    config = load_config(BASE, env_reader=lambda name: None)
    assert (config.placement_key, config.allowed_commands, config.pass_env, config.torchrun) == ((), (), (), "")


def test_file_and_variables(tmp_path):
    (tmp_path / "k.pub").write_bytes(SIGNER.public_pem())
    path = tmp_path / "agent.yaml"
    path.write_text(f"placement_key: {tmp_path / 'k.pub'}\n"
                    "allowed_commands:\n  - [/opt/jobs/bin/python, train.py]\n  - python examples/train_gpt.py\n"
                    "pass_env: [WANDB_API_KEY, HF_HOME]\ntorchrun: /opt/jobs/bin/torchrun\n")
    config = load_config({**BASE, "config": str(path)}, env_reader=lambda name: None)
    assert config.allowed_commands == (("/opt/jobs/bin/python", "train.py"), ("python", "examples/train_gpt.py"))
    assert config.pass_env == ("WANDB_API_KEY", "HF_HOME") and config.torchrun == "/opt/jobs/bin/torchrun"
    env = {"HULK_PLACEMENT_KEY": PUBLIC_KEY, "HULK_ALLOWED_COMMANDS": "python a.py; python b.py --x",
           "HULK_PASS_ENV": "A, B"}
    config = load_config(BASE, env_reader=env.get)
    assert config.placement_key == (PUBLIC_KEY,) and config.pass_env == ("A", "B")
    assert config.allowed_commands == (("python", "a.py"), ("python", "b.py", "--x"))


def signed_by(signer: Signer) -> NodePlacement:
    return NodePlacement(fleet="lab", node="n1", plan_id="p", roles=()).signed(
        signer, issued_at_ms=T0, expires_at_ms=T0 + 3_600_000, seq=T0)


def test_several_keys_are_pinned_and_a_placement_signed_by_any_of_them_is_accepted(tmp_path):
    """While the planner's key is rotated an agent lists both: a YAML list or, in the variable,
    keys separated by commas; one key (the old form) is still one key."""
    new, other = Signer.generate(), Signer.generate()
    (tmp_path / "old.pub").write_bytes(SIGNER.public_pem())
    path = tmp_path / "agent.yaml"
    path.write_text(f"placement_key:\n  - {tmp_path / 'old.pub'}\n  - {new.public_text()}\n")
    from_file = load_config({**BASE, "config": str(path)}, env_reader=lambda name: None)
    assert from_file.placement_key == (str(tmp_path / "old.pub"), new.public_text())
    env = {"HULK_PLACEMENT_KEY": f"{PUBLIC_KEY}, {new.public_text()}"}
    from_env = load_config(BASE, env_reader=env.get)
    assert from_env.placement_key == (PUBLIC_KEY, new.public_text())
    for config in (from_file, from_env):
        sub = PlacementSubscriber(BROKER, fleet="lab", node_id="n1", state_dir=tmp_path,
                                  verifier=Verifier.from_text(config.placement_key))
        for signer in (SIGNER, new):
            sub.check(signed_by(signer), "t")
        with pytest.raises(InputError, match="any of the 2 pinned placement keys"):
            sub.check(signed_by(other), "t")
    only_new = PlacementSubscriber(BROKER, fleet="lab", node_id="n1", state_dir=tmp_path,
                                   verifier=Verifier.from_text(new.public_text()))
    with pytest.raises(InputError, match="not signed by the pinned placement key"):
        only_new.check(signed_by(SIGNER), "t")       # the old key removed: refused


@pytest.mark.parametrize("env, field", [
    ({"HULK_PLACEMENT_KEY": "ed25519:nope"}, "placement_key"),
    ({"HULK_PLACEMENT_KEY": f"{PUBLIC_KEY},ed25519:nope"}, "placement_key"),
    ({"HULK_PLACEMENT_KEY": "/no/such.pub"}, "placement_key"),
    ({"HULK_PASS_ENV": "A B"}, "pass_env"),
])
def test_bad_values_are_one_line_errors_naming_the_variable(env, field):
    with pytest.raises(ConfigError) as err:
        load_config(BASE, env_reader=env.get)
    assert err.value.field == field and "\n" not in str(err.value)
    assert str(err.value).startswith(next(iter(env)))


def test_the_registration_tells_the_planner_the_allowed_commands(tmp_path):
    from agent.runtime import AgentRuntime
    from agent.spool import Spool
    from hulk.wire.records import Inventory

    config = load_config({"planner": "planner.test:50051", "node_id": "n1", "address": "127.0.0.1",
                          "state_dir": str(tmp_path),
                          "allowed_commands": [["python", "train.py"], "torchrun --standalone"]},
                         env_reader=lambda _: None)
    runtime = AgentRuntime(config, client=None, spool=Spool(config.spool_path, config.spool_max),
                           pinger=None, inventory_reader=lambda: Inventory())
    try:
        request = runtime.register_request()
    finally:
        runtime.spool.close()
    assert request.allowed_commands == (("python", "train.py"), ("torchrun", "--standalone"))
