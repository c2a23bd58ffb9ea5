"""Per-GPU peak dense half-precision throughput, by GPU name, else by compute capability.

The compute-capability table is docs/COSTMODEL.md section 1. Names map to the same figures for
the representative GPUs listed there, so a fleet that names its GPUs and one that gives only the
compute capability are judged alike.
"""

from __future__ import annotations

TFLOPS_BY_CC: dict[float, float] = {
    6.0: 10.6, 6.1: 11.3, 7.0: 125.0, 7.5: 65.0, 8.0: 312.0, 8.6: 150.0,
    8.7: 100.0, 8.9: 362.0, 9.0: 989.0, 10.0: 2250.0, 12.0: 400.0,
}
TFLOPS_OTHER = 100.0

# (name fragment as it appears in NVML names, compute capability, TFLOP/s, memory per GPU in GB).
# Order matters: the first fragment found in the name wins, so longer names come first.
GPU_CATALOG: list[tuple[str, float, float, float]] = [
    ("RTX PRO 6000", 12.0, 400.0, 96.0),
    ("RTX 5090", 12.0, 400.0, 32.0),
    ("B200", 10.0, 2250.0, 192.0),
    ("H200", 9.0, 989.0, 141.0),
    ("H100", 9.0, 989.0, 80.0),
    ("L40S", 8.9, 362.0, 48.0),
    ("RTX 4090", 8.9, 362.0, 24.0),
    ("Orin", 8.7, 100.0, 32.0),
    ("RTX A5000", 8.6, 150.0, 24.0),
    ("RTX 3090", 8.6, 150.0, 24.0),
    ("A40", 8.6, 150.0, 48.0),
    ("A100", 8.0, 312.0, 40.0),
    ("TITAN RTX", 7.5, 65.0, 24.0),
    ("T4", 7.5, 65.0, 16.0),
    ("V100", 7.0, 125.0, 32.0),
    ("TITAN Xp", 6.1, 11.3, 12.0),
    ("1080 Ti", 6.1, 11.3, 11.0),
    ("P100", 6.0, 10.6, 16.0),
]

MODEL_FLOP_UTILISATION = 0.4
DEFAULT_GPUS_PER_NODE = 8


def lookup_name(gpu_name: str | None) -> tuple[str, float, float, float] | None:
    """The catalog row whose fragment occurs in ``gpu_name`` (case-insensitive), or None."""
    if not gpu_name:
        return None
    folded = gpu_name.casefold()
    for row in GPU_CATALOG:
        if row[0].casefold() in folded:
            return row
    return None


def peak_tflops(gpu_name: str | None, compute_capability: float | None) -> float:
    """Per-GPU peak dense fp16 TFLOP/s: by name, else by compute capability, else 100."""
    row = lookup_name(gpu_name)
    if row is not None:
        return row[2]
    if compute_capability is not None:
        return TFLOPS_BY_CC.get(round(float(compute_capability), 1), TFLOPS_OTHER)
    return TFLOPS_OTHER


def node_throughput(gpus: int, gpu_name: str | None, compute_capability: float | None) -> float:
    """Effective node throughput thr_i = g_i * F_i * 0.4, in FLOP/s."""
    return gpus * peak_tflops(gpu_name, compute_capability) * 1e12 * MODEL_FLOP_UTILISATION
