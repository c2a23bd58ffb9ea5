"""The agent's declared_gpus setting (labs and tests): parsed from a file, a variable or a flag,
one-line errors naming the setting, an inventory that replaces NVML's and says it was declared,
carried over the wire, stored by the planner and marked in `fleet show`."""

from __future__ import annotations

import pytest

from agent.cli import build_parser, config_from_args
from agent.config import load_config
from agent.inventory import (NvmlInventoryReader, declared_inventory, inventory_reader_for,
                             parse_declared_gpus)
from hulk.errors import ConfigError
from hulk.v1 import hulk_pb2
from hulk.wire.records import GpuInfo, Inventory, RegisterRequest

BASE = {"planner": "planner.test:50051", "node_id": "node-1"}
A100 = "8xNVIDIA A100-SXM4-40GB:40"


def env_of(values: dict[str, str]):
    return lambda name: values.get(name)


def test_off_by_default():
    config = load_config(BASE, env_reader=env_of({}))
    assert config.declared_gpus == ()
    assert isinstance(inventory_reader_for(config.declared_gpus), NvmlInventoryReader)


def test_parsed_from_the_flag_the_variable_and_the_file(tmp_path):
    flag = config_from_args(build_parser().parse_args(
        ["--planner", "p.test:1", "--node-id", "n", "--declared-gpus", A100]))
    assert flag.declared_gpus == (GpuInfo("NVIDIA A100-SXM4-40GB", memory_bytes=40 * 10**9),) * 8
    env = load_config(BASE, env_reader=env_of({"HULK_DECLARED_GPUS": "2 x H100 80GB HBM3 : 80.5"}))
    assert env.declared_gpus == (GpuInfo("H100 80GB HBM3", memory_bytes=80_500_000_000),) * 2
    path = tmp_path / "agent.yaml"
    path.write_text(f"declared-gpus: '{A100}'\n")
    from_file = load_config({**BASE, "config": str(path)}, env_reader=env_of({}))
    assert from_file.declared_gpus == flag.declared_gpus and "declared_gpus" in from_file.explicit


@pytest.mark.parametrize("text, expected", [
    ("8 A100:40", "COUNTxNAME:GB"),
    ("8xA100", "COUNTxNAME:GB"),
    ("0xA100:40", "expected 1 to 64 GPUs"),
    ("65xA100:40", "expected 1 to 64 GPUs"),
    ("8xA100:0", "expected 0 < GB"),
    (f"8x{'A' * 129}:40", "at most 128 printable characters"),
])
def test_a_bad_value_is_one_line_naming_the_setting(text, expected):
    with pytest.raises(ConfigError) as bad:
        load_config(BASE, env_reader=env_of({"HULK_DECLARED_GPUS": text}))
    message = str(bad.value)
    assert "\n" not in message and "HULK_DECLARED_GPUS" in message and "declared_gpus" in message
    assert expected in message


def test_a_bad_flag_names_the_flag():
    with pytest.raises(ConfigError, match="--declared-gpus"):
        load_config({**BASE, "declared_gpus": "lots"}, env_reader=env_of({}))


def test_the_inventory_is_the_declared_gpus_marked_declared():
    gpus = parse_declared_gpus("4xNVIDIA V100-SXM2-16GB:16")
    inventory = inventory_reader_for(gpus)()
    assert inventory == Inventory(gpus=gpus, declared=True)
    assert inventory.count == 4 and inventory.driver_version == "" and inventory.declared
    assert parse_declared_gpus("  ") == ()


def test_declared_travels_over_the_wire_and_older_agents_send_false():
    inventory = declared_inventory(parse_declared_gpus(A100))
    request = RegisterRequest("n1", inventory=inventory)
    back = RegisterRequest.from_proto(hulk_pb2.RegisterRequest.FromString(
        request.to_proto().SerializeToString()))
    assert back.inventory == inventory and back.inventory.declared
    old = hulk_pb2.GpuInventory(gpus=[GpuInfo("A100").to_proto()])   # no field 4 on the wire
    assert Inventory.from_proto(hulk_pb2.GpuInventory.FromString(old.SerializeToString())) \
        == Inventory(gpus=(GpuInfo("A100"),), declared=False)


def test_the_planner_stores_it_and_fleet_show_marks_declared_gpus(tmp_path, capsys):
    from planner import cli
    from planner.service.store import Store

    with Store(tmp_path / "p.db") as store:
        store.register(RegisterRequest("lab-1", inventory=declared_inventory(
            parse_declared_gpus(A100))))
        store.register(RegisterRequest("real-1", inventory=Inventory(
            gpus=(GpuInfo("NVIDIA A100-SXM4-40GB", memory_bytes=40 * 10**9),) * 8)))
        rows = {r["id"]: r for r in store.nodes()}
    assert (rows["lab-1"]["gpus_declared"], rows["real-1"]["gpus_declared"]) == (1, 0)
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "p.db")]) == 0
    lines = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines()
             if line.startswith("│")}
    assert "8 x NVIDIA A100-SXM4-40GB (declared)" in lines["lab-1"]
    assert "(declared)" not in lines["real-1"] and "8 x NVIDIA A100-SXM4-40GB" in lines["real-1"]
