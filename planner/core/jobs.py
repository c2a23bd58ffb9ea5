"""Training jobs, the sensible range of their fields and the built-in model catalog (pure values;
the YAML reader is planner/files/jobs.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hulk.validate import Bound, Invalid, shown

BYTES_PER_PARAM_STATE = 16   # fp16 weights + grads, fp32 master, Adam m and v
# Bytes per value of the dtype a job's gradients (data-parallel all-reduce) and activations
# (stage boundaries) cross the network in. fp16 is the reference model's assumption, so a job
# that names neither is priced as before; a trainer that all-reduces fp32 gradients (as
# examples/train_gpt.py and Megatron's bf16 default do) says so in jobs.yaml.
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
DEFAULT_DTYPE = "fp16"
DTYPE_FIELDS = ("gradient_dtype", "activation_dtype")
# A crash of the job's own processes (an OOM kill, a lost GPU) is often transient: restart from
# the latest checkpoint a few times before calling the job failed, as torchrun's --max-restarts.
DEFAULT_MAX_RESTARTS = 3
# Bytes per pseudo-gradient value on the wire of an outer all-reduce (docs/COSTMODEL.md section 9).
COMPRESSION_BYTES = {"none": 4, "bf16": 2, "int8": 1}
SYNC_MODES = ("step", "diloco", "auto")


@dataclass(frozen=True)
class Sync:
    """How a job's replicas synchronise (docs/COSTMODEL.md section 9): ``step`` all-reduces
    gradients every step; ``diloco`` runs islands that average pseudo-gradients every
    ``inner_steps`` steps at one of ``compressions``; ``auto`` lets the planner choose either,
    with H at most ``inner_steps`` and a compression among ``compressions``."""

    mode: str = "step"
    inner_steps: int = 1
    compressions: tuple[str, ...] = ("none",)
    streaming_fragments: int = 0


@dataclass(frozen=True)
class Job:
    """One training job (docs/COSTMODEL.md section 3)."""

    name: str
    params: float
    layers: int
    hidden: int
    seq_len: int
    global_batch: int
    micro_batch: int = 1
    steps: int = 1000
    model: str | None = None
    command: tuple[str, ...] | None = None   # argv the agents launch (jobs.yaml may give a string)
    checkpoint_dir: str | None = None        # absolute, or relative to the job's working directory
    max_restarts: int = DEFAULT_MAX_RESTARTS  # restarts after its own processes fail (not node losses)
    sync: Sync = Sync()
    gradient_dtype: str = DEFAULT_DTYPE    # a key of DTYPE_BYTES: the all-reduce's values
    activation_dtype: str = DEFAULT_DTYPE  # a key of DTYPE_BYTES: a stage boundary's values

    def flops_per_layer(self, micro_batch: int | None = None) -> float:
        """f = 6 * (P / L) * s * b: training FLOPs per micro-batch per layer."""
        b = micro_batch or self.micro_batch
        return 6.0 * (self.params / self.layers) * self.seq_len * b

    def activation_bytes(self, micro_batch: int | None = None) -> float:
        """A = v * s * b * h: bytes crossing a stage boundary per micro-batch, v the bytes of
        ``activation_dtype`` (2 for fp16)."""
        b = micro_batch or self.micro_batch
        return DTYPE_BYTES[self.activation_dtype] * self.seq_len * b * self.hidden

    @property
    def state_bytes(self) -> float:
        """16 * P: training state of the whole model."""
        return BYTES_PER_PARAM_STATE * self.params

    @property
    def total_flops(self) -> float:
        """6 P s B steps: what the whole job computes."""
        return 6.0 * self.params * self.seq_len * self.global_batch * self.steps

    def with_micro_batch(self, micro_batch: int) -> "Job":
        return replace(self, micro_batch=micro_batch)


# name: params, layers, hidden, seq_len, typical global batch, micro batch, steps.
# Sizes are from the models' own papers; the first six are the Hulk paper's.
MODEL_CATALOG: dict[str, dict] = {
    "opt-175b": dict(params=175.0e9, layers=96, hidden=12288, seq_len=2048, global_batch=1024,
                     micro_batch=1, steps=100),
    "t5-11b": dict(params=11.0e9, layers=48, hidden=1024, seq_len=512, global_batch=128,
                   micro_batch=1, steps=1000),
    "gpt2-xl": dict(params=1.5e9, layers=48, hidden=1600, seq_len=1024, global_batch=512,
                    micro_batch=4, steps=1000),
    "bert-large": dict(params=0.34e9, layers=24, hidden=1024, seq_len=512, global_batch=256,
                       micro_batch=8, steps=1000),
    "roberta-large": dict(params=0.355e9, layers=24, hidden=1024, seq_len=512, global_batch=2048,
                          micro_batch=8, steps=1000),
    "xlnet-large": dict(params=0.34e9, layers=24, hidden=1024, seq_len=512, global_batch=2048,
                        micro_batch=8, steps=1000),
    "gpt3-2.7b": dict(params=2.7e9, layers=32, hidden=2560, seq_len=2048, global_batch=512,
                      micro_batch=2, steps=1000),
    "gpt3-13b": dict(params=13.0e9, layers=40, hidden=5140, seq_len=2048, global_batch=1024,
                     micro_batch=1, steps=500),
    "gpt-neox-20b": dict(params=20.6e9, layers=44, hidden=6144, seq_len=2048, global_batch=1024,
                         micro_batch=1, steps=300),
    "llama-2-7b": dict(params=6.74e9, layers=32, hidden=4096, seq_len=4096, global_batch=1024,
                       micro_batch=1, steps=500),
    "llama-2-13b": dict(params=13.0e9, layers=40, hidden=5120, seq_len=4096, global_batch=1024,
                        micro_batch=1, steps=300),
    "llama-2-70b": dict(params=69.0e9, layers=80, hidden=8192, seq_len=4096, global_batch=1024,
                        micro_batch=1, steps=100),
    "bloom-176b": dict(params=176.0e9, layers=70, hidden=14336, seq_len=2048, global_batch=2048,
                       micro_batch=1, steps=100),
}


# The range of every numeric job field. A model of ten trillion parameters is plausible, and so
# is the lab's toy of a quarter million; one of 1e-300 (or of inf) is a typo the cost model cannot
# carry: the search would divide by it and round the infinity to an integer. Each bound is wide
# of today's largest models (hidden 2**15, a million tokens of context, batches of a few
# thousand sequences) and small enough that every product the cost model forms stays finite.
JOB_BOUNDS: dict[str, Bound] = {
    "params": Bound(1e3, 1e13, "a parameter count"),
    "layers": Bound(1, 10_000, "layers", integer=True),
    "hidden": Bound(1, 1_048_576, "hidden units", integer=True),
    "seq_len": Bound(1, 16_777_216, "tokens", integer=True),
    "global_batch": Bound(1, 16_777_216, "sequences", integer=True),
    "micro_batch": Bound(1, 1_048_576, "sequences", integer=True),
    "steps": Bound(1, 1_000_000_000, "steps", integer=True),
    "max_restarts": Bound(0, 100, "restarts", integer=True),
}


def check_job_field(key: str, value: Any) -> int | float:
    """``value`` of the job field ``key`` within JOB_BOUNDS (params as a float); raises Invalid
    naming the field."""
    try:
        number = JOB_BOUNDS[key].check(value)
    except Invalid as bad:
        raise Invalid(bad.expected, field=key) from None
    return float(number) if key == "params" else number


def check_dtype(key: str, value: Any) -> str:
    """The job field ``key`` (one of DTYPE_FIELDS) as a key of DTYPE_BYTES, DEFAULT_DTYPE when
    None; raises Invalid naming the field."""
    if value is None:
        return DEFAULT_DTYPE
    if not isinstance(value, str) or value not in DTYPE_BYTES:
        raise Invalid(f"expected one of {', '.join(DTYPE_BYTES)} (default {DEFAULT_DTYPE}), got "
                      f"{shown(value)}", field=key)
    return value


def dtype_fields(job: Job) -> dict[str, str]:
    """The jobs.yaml dtype fields of ``job`` that differ from the default (empty for most)."""
    return {key: getattr(job, key) for key in DTYPE_FIELDS if getattr(job, key) != DEFAULT_DTYPE}


# Low-communication training (docs/COSTMODEL.md section 9). H = 100 is INTELLECT-1's choice for
# `diloco`, where the user states it; `auto` may go up to DiLoCo's H = 500 unless told less.
# Uncompressed is the default: bf16 and int8 change what the islands average, so the user opts in.
DEFAULT_DILOCO_INNER_STEPS = 100
DEFAULT_AUTO_INNER_STEPS = 500
SYNC_BOUNDS: dict[str, Bound] = {
    "inner_steps": Bound(1, 100_000, "steps", integer=True),
    "streaming_fragments": Bound(0, 10_000, "fragments (at most the job's layers)", integer=True),
}
SYNC_FIELDS = ("inner_steps", "outer_compression", "streaming_fragments")


def parse_sync(mode: Any = None, *, layers: int, inner_steps: Any = None,
               outer_compression: Any = None, streaming_fragments: Any = None) -> Sync:
    """A job's Sync from the values jobs.yaml (or a job spec) gives, None where absent; raises
    Invalid naming the field: an unknown mode, a sync field on a `step` job, a compression that
    is not one of COMPRESSION_BYTES, a list under `diloco`, a number out of SYNC_BOUNDS."""
    mode = "step" if mode is None else mode
    if not isinstance(mode, str) or mode not in SYNC_MODES:
        raise Invalid(f"expected one of {', '.join(SYNC_MODES)}, got {shown(mode)}", field="sync")
    given = dict(inner_steps=inner_steps, outer_compression=outer_compression,
                 streaming_fragments=streaming_fragments)
    if mode == "step":
        for key, value in given.items():
            if value is not None:
                raise Invalid("only with sync: diloco or auto (this job syncs every step)",
                              field=key)
        return Sync()
    default_h = DEFAULT_DILOCO_INNER_STEPS if mode == "diloco" else DEFAULT_AUTO_INNER_STEPS
    h = default_h if inner_steps is None else _sync_number("inner_steps", inner_steps)
    fragments = 0 if streaming_fragments is None else _sync_number("streaming_fragments",
                                                                   streaming_fragments)
    if fragments > layers:
        raise Invalid(f"expected at most the job's {layers} layers, got {fragments}",
                      field="streaming_fragments")
    return Sync(mode, h, _compressions(mode, outer_compression), fragments)


def _sync_number(key: str, value: Any) -> int:
    try:
        return int(SYNC_BOUNDS[key].check(value))
    except Invalid as bad:
        raise Invalid(bad.expected, field=key) from None


def _compressions(mode: str, value: Any) -> tuple[str, ...]:
    names = ", ".join(COMPRESSION_BYTES)
    if value is None:
        return ("none",) if mode == "diloco" else tuple(COMPRESSION_BYTES)
    if isinstance(value, (list, tuple)):
        if mode == "diloco":
            raise Invalid(f"expected one of {names} (a list only with sync: auto), got "
                          f"{shown(value)}", field="outer_compression")
        chosen = list(value)
    else:
        chosen = [value]
    if not chosen or any(not isinstance(c, str) or c not in COMPRESSION_BYTES for c in chosen):
        raise Invalid(f"expected {'one' if mode == 'diloco' else 'a non-empty list'} of {names}, "
                      f"got {shown(value)}", field="outer_compression")
    if len(set(chosen)) != len(chosen):
        raise Invalid(f"expected each of {names} at most once, got {shown(value)}",
                      field="outer_compression")
    return tuple(c for c in COMPRESSION_BYTES if c in chosen)


def sync_fields(sync: Sync) -> dict[str, Any]:
    """The jobs.yaml fields that give ``sync`` (empty for `step`), as parse_sync reads them."""
    if sync.mode == "step":
        return {}
    compression: Any = sync.compressions[0] if sync.mode == "diloco" else list(sync.compressions)
    return {"sync": sync.mode, "inner_steps": sync.inner_steps, "outer_compression": compression,
            **({"streaming_fragments": sync.streaming_fragments}
               if sync.streaming_fragments else {})}


def catalog_job(model: str, name: str | None = None, **overrides) -> Job:
    """A job for a catalog model, with explicit fields overriding the catalog's (checked against
    JOB_BOUNDS: Invalid names the field)."""
    fields = dict(MODEL_CATALOG[model])
    fields.update({k: check_job_field(k, v) if k in JOB_BOUNDS
                   else check_dtype(k, v) if k in DTYPE_FIELDS else v
                   for k, v in overrides.items() if v is not None})
    return Job(name=name or model, model=model, **fields)
