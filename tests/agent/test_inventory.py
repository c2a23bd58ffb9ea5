"""GPU inventory: a fake NVML module for the happy path, the real pynvml for "not found"."""

from __future__ import annotations

import types

import pytest

from agent.inventory import NvmlInventoryReader
from hulk.wire.records import GpuInfo


def fake_nvml(devices, driver=b"550.54.15", fail_init=None, fail_index=None):
    """A module with pynvml's names for the calls the reader makes."""
    nvml = types.ModuleType("fake_pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    nvml.NVMLError = NVMLError
    nvml.NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    nvml.calls = []

    def init():
        nvml.calls.append("init")
        if fail_init:
            raise fail_init(NVMLError, NVMLError_DriverNotLoaded)

    def handle(index):
        if index == fail_index:
            raise NVMLError("GPU is lost")
        return devices[index]

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlSystemGetDriverVersion = lambda: driver
    nvml.nvmlDeviceGetCount = lambda: len(devices)
    nvml.nvmlDeviceGetHandleByIndex = handle
    nvml.nvmlDeviceGetName = lambda h: h["name"]
    nvml.nvmlDeviceGetUUID = lambda h: h["uuid"]
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: h["cc"]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h["mem"], used=0)
    return nvml


A100 = {"name": b"NVIDIA A100-SXM4-40GB", "uuid": "GPU-11111111", "cc": (8, 0), "mem": 42949672960}
H100 = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-22222222", "cc": (9, 0), "mem": 85520809984}


def test_fake_nvml_happy_path():
    nvml = fake_nvml([A100, H100])
    inventory = NvmlInventoryReader(nvml)()
    assert inventory.gpus == (
        GpuInfo("NVIDIA A100-SXM4-40GB", "GPU-11111111", 8.0, 42949672960),
        GpuInfo("NVIDIA H100 80GB HBM3", "GPU-22222222", 9.0, 85520809984),
    )
    assert inventory.count == 2
    assert inventory.driver_version == "550.54.15"
    assert inventory.unavailable_reason == ""
    assert nvml.calls == ["init", "shutdown"]


def test_compute_capability_minor_digits():
    inventory = NvmlInventoryReader(fake_nvml([{**A100, "cc": (8, 6)}, {**A100, "cc": (7, 5)}]))()
    assert [g.compute_capability for g in inventory.gpus] == [8.6, 7.5]


def test_one_broken_gpu_does_not_hide_the_others():
    inventory = NvmlInventoryReader(fake_nvml([A100, H100], fail_index=0))()
    assert [g.uuid for g in inventory.gpus] == ["GPU-22222222"]
    all_broken = NvmlInventoryReader(fake_nvml([A100], fail_index=0))()
    assert all_broken.gpus == () and "GPU 0: NVML error: GPU is lost" in all_broken.unavailable_reason


def test_driver_not_loaded_gives_reason():
    nvml = fake_nvml([A100], fail_init=lambda base, drv: drv("Driver Not Loaded"))
    inventory = NvmlInventoryReader(nvml)()
    assert inventory.gpus == ()
    assert inventory.unavailable_reason == "NVIDIA driver not loaded: Driver Not Loaded"


def test_no_gpus_reported():
    inventory = NvmlInventoryReader(fake_nvml([]))()
    assert inventory.gpus == () and inventory.unavailable_reason == "NVML reports no GPUs"


def test_real_pynvml_without_library_or_driver():
    pynvml = pytest.importorskip("pynvml")
    try:  # this machine has no NVIDIA driver; on one that has, the happy path is covered above
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this host has a working NVML")
    except pynvml.NVMLError:
        pass
    inventory = NvmlInventoryReader()()            # the default: the real pynvml module
    assert inventory.gpus == () and inventory.driver_version == ""
    assert inventory.unavailable_reason.startswith(("NVML library not found: ",
                                                    "NVIDIA driver not loaded: "))
    assert "NVML Shared Library Not Found" in inventory.unavailable_reason \
        or "Driver Not Loaded" in inventory.unavailable_reason
