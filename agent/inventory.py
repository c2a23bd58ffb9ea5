"""GPU inventory through NVML (nvidia-ml-py's `pynvml`).

A host without the NVIDIA library or driver has no GPUs: the inventory is empty and says why,
and the agent keeps probing. The NVML module is a constructor argument so tests can hand in a
small fake with the same functions and exception classes.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from hulk.wire.records import GpuInfo, Inventory

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    # Old nvidia-ml-py versions return bytes.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _load_pynvml() -> ModuleType | str:
    try:
        import pynvml
    except ImportError as err:  # the agent still runs without the package
        return f"nvidia-ml-py is not installed: {err}"
    return pynvml


def describe_nvml_error(nvml: Any, err: BaseException) -> str:
    """A short reason for an NVML failure, naming the common causes."""
    kinds = [
        ("NVMLError_LibraryNotFound", "NVML library not found"),
        ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
        ("NVMLError_NoPermission", "no permission to use NVML"),
        ("NVMLError_Uninitialized", "NVML not initialized"),
        ("NVMLError_InsufficientResources", "NVML out of resources"),
    ]
    for class_name, reason in kinds:
        cls = getattr(nvml, class_name, None)
        if isinstance(cls, type) and isinstance(err, cls):
            return f"{reason}: {err}"
    return f"NVML error: {err}"


class NvmlInventoryReader:
    """Reads the GPUs once per call; never raises for NVML trouble."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml

    def __call__(self) -> Inventory:
        nvml = self._nvml if self._nvml is not None else _load_pynvml()
        if isinstance(nvml, str):
            return Inventory(unavailable_reason=nvml)
        nvml_error = getattr(nvml, "NVMLError", Exception)
        try:
            nvml.nvmlInit()
        except nvml_error as err:
            reason = describe_nvml_error(nvml, err)
            log.info("no GPU inventory: %s", reason)
            return Inventory(unavailable_reason=reason)
        try:
            return self._read(nvml, nvml_error)
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml_error as err:
                log.debug("nvmlShutdown failed: %s", err)

    @staticmethod
    def _read(nvml: Any, nvml_error: type[BaseException]) -> Inventory:
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = int(nvml.nvmlDeviceGetCount())
        except nvml_error as err:
            return Inventory(unavailable_reason=describe_nvml_error(nvml, err))
        gpus: list[GpuInfo] = []
        failures: list[str] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                gpus.append(GpuInfo(
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    compute_capability=float(f"{int(major)}.{int(minor)}"),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                ))
            except nvml_error as err:
                # One broken GPU must not hide the others.
                failures.append(f"GPU {index}: {describe_nvml_error(nvml, err)}")
                log.warning("cannot read GPU %d: %s", index, err)
        reason = ""
        if not gpus:
            reason = "; ".join(failures) or "NVML reports no GPUs"
        return Inventory(gpus=tuple(gpus), driver_version=driver, unavailable_reason=reason)

