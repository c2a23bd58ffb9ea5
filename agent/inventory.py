"""GPU inventory through NVML (nvidia-ml-py's `pynvml`), or declared by the operator.

A host without the NVIDIA library or driver has no GPUs: the inventory is empty and says why,
and the agent keeps probing. The NVML module is a constructor argument so tests can hand in a
small fake with the same functions and exception classes.

Labs and tests run agents on hosts without GPUs: the ``declared_gpus`` setting
(``COUNTxNAME:GB``, e.g. ``8xNVIDIA A100-SXM4-40GB:40``) replaces NVML with those GPUs, and
the inventory says it was declared so the planner can show it. It is never on by default.
"""

from __future__ import annotations

import logging
from types import ModuleType
import re
from collections.abc import Callable
from typing import Any

from hulk.validate import Invalid
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


MAX_DECLARED_GPUS = 64          # the planner's bound on one server's GPUs
MAX_DECLARED_GB = 16_000          # per GPU, below the planner's 2**44-byte bound
MAX_NAME_CHARS = 128              # the planner's bound on a GPU name
_DECLARED = re.compile(r"^\s*([0-9]+)\s*[xX]\s*(\S.*?)\s*:\s*([0-9]+(?:\.[0-9]+)?)\s*$")
DECLARED_EXPECTED = "COUNTxNAME:GB such as '8xNVIDIA A100-SXM4-40GB:40'"


def parse_declared_gpus(value: Any) -> tuple[GpuInfo, ...]:
    """``COUNTxNAME:GB`` as that many GPUs of ``GB`` (10**9 bytes) each; "" as none."""
    text = "" if value is None else str(value).strip()
    if not text:
        return ()
    match = _DECLARED.match(text)
    if match is None:
        raise Invalid(f"expected {DECLARED_EXPECTED}, got {text!r}")
    count, name, gb = int(match[1]), match[2], float(match[3])
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise Invalid(f"expected a GPU name of at most {MAX_NAME_CHARS} printable characters in "
                      f"{DECLARED_EXPECTED}")
    if not 1 <= count <= MAX_DECLARED_GPUS:
        raise Invalid(f"expected 1 to {MAX_DECLARED_GPUS} GPUs in {DECLARED_EXPECTED}, "
                      f"got {count}")
    if not 0 < gb <= MAX_DECLARED_GB:
        raise Invalid(f"expected 0 < GB <= {MAX_DECLARED_GB} in {DECLARED_EXPECTED}, got {gb:g}")
    return (GpuInfo(name=name, memory_bytes=int(gb * 10**9)),) * count


def declared_inventory(gpus: tuple[GpuInfo, ...]) -> Inventory:
    """The inventory of declared GPUs: marked declared, no driver."""
    return Inventory(gpus=gpus, declared=True)


def inventory_reader_for(declared_gpus: tuple[GpuInfo, ...]) -> Callable[[], Inventory]:
    """NVML, or the declared GPUs when the setting names some."""
    if not declared_gpus:
        return NvmlInventoryReader()
    log.warning("GPUs declared by the declared_gpus setting, not read from NVML: %d x %s",
                len(declared_gpus), declared_gpus[0].name)
    return lambda: declared_inventory(declared_gpus)


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

