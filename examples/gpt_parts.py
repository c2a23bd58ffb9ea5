"""The parts of examples/train_gpt.py around its training loop: a process's role from its HULK_*
variables and the check that every rank's role fits the others', the GPT's stage parts and its
built-in data, fp16's loss scale agreed by every rank, and the progress file the agent reads (the sharded
checkpoints are in gpt_checkpoints.py).

It sits beside train_gpt.py (Python puts a script's folder on ``sys.path``), so a GPU server
needs both files.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

try:  # the project's one table of HULK_* variables, when the example runs inside the project
    from hulk.settings import ENV_VARS as _HULK_VARS
    from hulk.settings import env as _project_env
except ImportError:  # a bare checkout of examples/ on a GPU server
    _HULK_VARS, _project_env = {}, None


def _hulk_env(name: str, default: str | None = None) -> str | None:
    """A HULK_* variable: through hulk.settings where it lists the name, else straight from the
    environment (a bare checkout of examples/, or an older hulk installed beside it)."""
    if _project_env is not None and name in _HULK_VARS:
        return _project_env(name, default)
    value = os.environ.get(name)
    return value if value not in (None, "") else default

class ProgressFile:
    """One JSON line a step to HULK_PROGRESS_FILE, which the agent reads (docs/JOBS.md); does
    nothing when the variable is unset. Each line is flushed whole, so the agent never waits on
    a buffer and sees at most one line cut short."""

    def __init__(self, path: str | None = None):
        path = path if path is not None else _hulk_env("HULK_PROGRESS_FILE")
        self._file = open(path, "a", encoding="utf-8") if path else None

    def step(self, step: int, step_s: float, total_steps: int = 0, compute_s: float | None = None,
             communication_s: float | None = None) -> None:
        """``step``: steps done counting this one; compute and communication when known."""
        if self._file is None:
            return
        line = {"step": step, "time": round(time.time(), 3), "step_s": round(step_s, 6)}
        if total_steps:
            line["total_steps"] = total_steps
        if compute_s is not None and communication_s is not None:
            line["compute_s"], line["communication_s"] = round(compute_s, 6), round(communication_s, 6)
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


TEXT = (
    "Hulk places large model training jobs on servers spread across cities and countries. "
    "It measures the network between the servers, learns a graph of the fleet, and decides "
    "which servers train which model and how: pipeline stages with layer ranges and data "
    "parallel replicas, so that jobs finish sooner than they would with plain data, pipeline "
    "or tensor parallelism over the whole fleet. Latency between Beijing and Tokyo is low; "
    "between Beijing and Brasilia it is high, so a pipeline should not cross the world twice. "
)


CORPORA = ("builtin", "markov")


def markov_text(length: int = 200_000, order: int = 2, smoothing: float = 0.02,
                seed: int = 0) -> str:
    """``length`` characters from an order-``order`` character Markov chain fitted on TEXT.

    TEXT alone is memorised by the small GPT within a few hundred steps, which hides how two
    ways of training compare; this text has irreducible entropy, so the loss plateaus well
    above zero. P(c | context) = (n(context, c) + smoothing * V * u(c)) / (n(context) +
    smoothing * V), u being TEXT's character frequencies: every character stays possible after
    every context, so the alphabet is TEXT's. The defaults give about 1.65 nats a character.
    Plain Python and one seeded generator: the same text on every rank and platform.
    """
    import bisect
    import random

    alphabet = sorted(set(TEXT))
    v = len(alphabet)
    wrapped = TEXT + TEXT[:order]  # cyclic: every context of TEXT has a successor
    counts: dict[str, list[float]] = {}
    for i in range(len(TEXT)):
        counts.setdefault(wrapped[i:i + order], [0.0] * v)[alphabet.index(wrapped[i + order])] += 1
    unigram = [TEXT.count(c) / len(TEXT) for c in alphabet]
    cumulative: dict[str, list[float]] = {}

    def table(context: str) -> list[float]:
        row = counts.get(context, [0.0] * v)
        weights = [n + smoothing * v * u for n, u in zip(row, unigram)]
        out, total = [], 0.0
        for w in weights:
            total += w
            out.append(total)
        return [c / total for c in out]

    rng = random.Random(seed)
    chars = list(TEXT[:order])
    for _ in range(length - order):
        context = "".join(chars[-order:])
        cum = cumulative.get(context)
        if cum is None:
            cum = cumulative[context] = table(context)
        chars.append(alphabet[min(bisect.bisect_right(cum, rng.random()), v - 1)])
    return "".join(chars)


@functools.lru_cache(maxsize=None)
def corpus(name: str) -> str:
    """The training text called ``name`` (one of CORPORA), built once per process."""
    if name not in CORPORA:
        raise ValueError(f"corpus must be one of {', '.join(CORPORA)}, got {name!r}")
    return TEXT if name == "builtin" else markov_text()


class RoleError(Exception):
    """This process's HULK_* role is missing or inconsistent with its peers'."""


@dataclass(frozen=True)
class Role:
    rank: int
    world_size: int
    stage: int
    num_stages: int
    layer_lo: int
    layer_hi: int
    replica: int
    num_replicas: int
    micro_batch: int
    job: str
    plan_id: str
    micro_batches: int = 4
    checkpoint_dir: str = ""
    restart_count: int = 0
    sync: str = "step"               # or "diloco" (examples/diloco.py)
    inner_steps: int = 1             # diloco: steps between outer syncs (H)
    outer_compression: str = "none"  # diloco: none, bf16 or int8
    island: int = 0                  # diloco: this replica's island
    num_islands: int = 1


def _int(name: str, value: str | None) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise RoleError(f"{name} must be an integer, got {value!r}") from None


def role_from_env(layers: int, default_micro_batch: int, default_micro_batches: int = 4,
                  default_checkpoint_dir: str = "") -> Role:
    """This process's role; without HULK_STAGE, one pipeline over WORLD_SIZE ranks."""
    rank = _int("RANK", os.environ.get("RANK", "0"))
    world = _int("WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    common = dict(
        micro_batch=_int("HULK_MICRO_BATCH", _hulk_env("HULK_MICRO_BATCH", str(default_micro_batch))),
        micro_batches=_int("HULK_MICRO_BATCHES",
                           _hulk_env("HULK_MICRO_BATCHES", str(default_micro_batches))),
        checkpoint_dir=_hulk_env("HULK_CHECKPOINT_DIR", default_checkpoint_dir) or "",
        restart_count=_int("HULK_RESTART_COUNT", _hulk_env("HULK_RESTART_COUNT", "0")),
        job=_hulk_env("HULK_JOB", "train-gpt") or "", plan_id=_hulk_env("HULK_PLAN_ID", "") or "",
        **_sync_from_env())
    if _hulk_env("HULK_STAGE") is None:
        lo, hi = layers * rank // world, layers * (rank + 1) // world
        return Role(rank=rank, world_size=world, stage=rank, num_stages=world, layer_lo=lo,
                    layer_hi=hi, replica=0, num_replicas=1, **common)
    values = {name: _int(name, _hulk_env(name)) for name in (
        "HULK_STAGE", "HULK_NUM_STAGES", "HULK_LAYER_LO", "HULK_LAYER_HI")}
    return Role(
        rank=rank, world_size=world,
        stage=values["HULK_STAGE"], num_stages=values["HULK_NUM_STAGES"],
        layer_lo=values["HULK_LAYER_LO"], layer_hi=values["HULK_LAYER_HI"],
        replica=_int("HULK_REPLICA", _hulk_env("HULK_REPLICA", "0")),
        num_replicas=_int("HULK_NUM_REPLICAS", _hulk_env("HULK_NUM_REPLICAS", "1")), **common)


def _sync_from_env() -> dict:
    """The HULK_SYNC family (default: every step, one island)."""
    sync = _hulk_env("HULK_SYNC", "step") or "step"
    if sync not in ("step", "diloco"):
        raise RoleError(f"HULK_SYNC must be step or diloco, got {sync!r}")
    compression = _hulk_env("HULK_OUTER_COMPRESSION", "none") or "none"
    if compression not in ("none", "bf16", "int8"):
        raise RoleError(f"HULK_OUTER_COMPRESSION must be none, bf16 or int8, got {compression!r}")
    inner = _int("HULK_INNER_STEPS", _hulk_env("HULK_INNER_STEPS", "1"))
    if inner < 1:
        raise RoleError(f"HULK_INNER_STEPS must be at least 1, got {inner}")
    fragments = _int("HULK_STREAMING_FRAGMENTS", _hulk_env("HULK_STREAMING_FRAGMENTS", "0"))
    if fragments:
        raise RoleError(f"HULK_STREAMING_FRAGMENTS is {fragments}: train_gpt.py syncs the whole "
                        "model at once (streaming DiLoCo is not implemented); use 0")
    return dict(sync=sync, inner_steps=inner, outer_compression=compression,
                island=_int("HULK_ISLAND", _hulk_env("HULK_ISLAND", "0")),
                num_islands=_int("HULK_NUM_ISLANDS", _hulk_env("HULK_NUM_ISLANDS", "1")))


def check_roles(roles: list[tuple[int, ...]]) -> tuple[int, dict[tuple[int, int], int]]:
    """Validate every rank's (stage, num_stages, lo, hi, replica, num_replicas, micro_batch,
    micro_batches).

    Returns the total number of layers and the map (stage, replica) -> rank.
    """
    k, d = roles[0][1], roles[0][5]
    if len({r[7] for r in roles}) != 1 or roles[0][7] < 1:
        raise RoleError("ranks disagree on HULK_MICRO_BATCHES or it is below 1")
    if any(r[1] != k or r[5] != d for r in roles):
        raise RoleError("ranks disagree on HULK_NUM_STAGES / HULK_NUM_REPLICAS")
    if k * d != len(roles):
        raise RoleError(f"{k} stages x {d} replicas need {k * d} processes, WORLD_SIZE is {len(roles)}")
    if len({r[6] for r in roles}) != 1 or roles[0][6] < 1:
        raise RoleError("ranks disagree on HULK_MICRO_BATCH or it is below 1")
    where: dict[tuple[int, int], int] = {}
    ranges: dict[int, tuple[int, int]] = {}
    for rank, (stage, _, lo, hi, replica, *_) in enumerate(roles):
        if not (0 <= stage < k and 0 <= replica < d):
            raise RoleError(f"rank {rank}: stage {stage} / replica {replica} out of range")
        if (stage, replica) in where:
            raise RoleError(f"ranks {where[(stage, replica)]} and {rank} both claim stage {stage} "
                            f"of replica {replica}")
        where[(stage, replica)] = rank
        if ranges.setdefault(stage, (lo, hi)) != (lo, hi):
            raise RoleError(f"stage {stage}: replicas disagree on its layer range")
    expect = 0
    for stage in range(k):
        lo, hi = ranges[stage]
        if lo != expect or hi <= lo:
            raise RoleError(f"stage {stage}: layers [{lo}, {hi}) do not continue from {expect}")
        expect = hi
    return expect, where


# -- the model ------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, dim: int, heads: int, seq_len: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class StagePart(nn.Module):
    """Blocks [lo, hi) of the GPT, with the embeddings if first and the head if last."""

    def __init__(self, vocab: int, dim: int, heads: int, seq_len: int, layers: int, lo: int, hi: int,
                 first: bool, last: bool, seed: int, autocast: torch.dtype | None = None):
        super().__init__()
        self.lo, self.autocast = lo, autocast
        # Build every layer from one seed so all replicas of a stage start identical, without a
        # broadcast, and so the split does not change the model.
        torch.manual_seed(seed)
        tok = nn.Embedding(vocab, dim)
        pos = nn.Embedding(seq_len, dim)
        blocks = [Block(dim, heads, seq_len) for _ in range(layers)]
        ln_f, head = nn.LayerNorm(dim), nn.Linear(dim, vocab)
        self.tok, self.pos = (tok, pos) if first else (None, None)
        self.blocks = nn.ModuleList(blocks[lo:hi])
        self.ln_f, self.head = (ln_f, head) if last else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.autocast or torch.float32,
                            enabled=self.autocast is not None):
            if self.tok is not None:
                positions = torch.arange(x.shape[1], device=x.device)
                x = self.tok(x) + self.pos(positions)
            for block in self.blocks:
                x = block(x)
            if self.head is not None:
                x = self.head(self.ln_f(x))
        # fp32 between stages and into the loss: the pipeline learns one activation dtype.
        return x.float()

    def named_globally(self) -> dict[str, nn.Parameter]:
        """Parameters under whole-model names (block i of the stage is block lo + i)."""
        out = {}
        for name, param in self.named_parameters():
            if name.startswith("blocks."):
                _, index, rest = name.split(".", 2)
                name = f"blocks.{self.lo + int(index)}.{rest}"
            out[name] = param
        return out


@functools.lru_cache(maxsize=4)
def _encoded(text: str) -> torch.Tensor:
    """The text as indices into its sorted alphabet (cached: a long corpus is not re-encoded
    every step)."""
    index = {c: i for i, c in enumerate(sorted(set(text)))}
    return torch.tensor([index[c] for c in text], dtype=torch.long)


def batches(text: str, seq_len: int, batch: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ``batch`` windows of the text, same on every rank."""
    ids = _encoded(text)
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=g)
    x = torch.stack([ids[s:s + seq_len] for s in starts])
    y = torch.stack([ids[s + 1:s + seq_len + 1] for s in starts])
    return x, y


# -- precision ------------------------------------------------------------------------------------
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """fp16's dynamic loss scale (what torch.amp.GradScaler does), agreed by every rank.

    GradScaler decides per process whether to skip a step; here the stages hold different
    parameters, so an overflow in any of them must skip the step everywhere (one all-reduce).
    """

    def __init__(self, enabled: bool, device: torch.device, scale: float = 2.0 ** 14,
                 growth_interval: int = 100):
        self.enabled, self.device, self.value = enabled, device, scale if enabled else 1.0
        self.growth_interval, self.good_steps = growth_interval, 0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.value if self.enabled else loss

    def unscale(self, params: list[nn.Parameter]) -> bool:
        """Divide the gradients by the scale; False (and a smaller scale) if any rank overflowed."""
        if not self.enabled:
            return True
        grads = [p.grad for p in params if p.grad is not None]
        bad = any(not bool(torch.isfinite(g).all()) for g in grads)
        flag = torch.tensor([1.0 if bad else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            self.value, self.good_steps = self.value / 2, 0
            return False
        for g in grads:
            g.div_(self.value)
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.value *= 2
        return True
