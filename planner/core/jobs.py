"""Training jobs, the sensible range of their fields and the built-in model catalog (pure values;
the YAML reader is planner/files/jobs.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hulk.validate import Bound, Invalid

BYTES_PER_PARAM_STATE = 16   # fp16 weights + grads, fp32 master, Adam m and v
BYTES_PER_ACTIVATION = 2     # fp16
# A crash of the job's own processes (an OOM kill, a lost GPU) is often transient: restart from
# the latest checkpoint a few times before calling the job failed, as torchrun's --max-restarts.
DEFAULT_MAX_RESTARTS = 3


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

    def flops_per_layer(self, micro_batch: int | None = None) -> float:
        """f = 6 * (P / L) * s * b: training FLOPs per micro-batch per layer."""
        b = micro_batch or self.micro_batch
        return 6.0 * (self.params / self.layers) * self.seq_len * b

    def activation_bytes(self, micro_batch: int | None = None) -> float:
        """A = 2 * s * b * h: bytes crossing a stage boundary per micro-batch."""
        b = micro_batch or self.micro_batch
        return BYTES_PER_ACTIVATION * self.seq_len * b * self.hidden

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


def catalog_job(model: str, name: str | None = None, **overrides) -> Job:
    """A job for a catalog model, with explicit fields overriding the catalog's (checked against
    JOB_BOUNDS: Invalid names the field)."""
    fields = dict(MODEL_CATALOG[model])
    fields.update({k: check_job_field(k, v) if k in JOB_BOUNDS else v
                   for k, v in overrides.items() if v is not None})
    return Job(name=name or model, model=model, **fields)
