"""A small GPT trained as pipeline stages with data-parallel replicas, the way Hulk places it.

Every process is one node of a placement. It reads its role from the variables an agent sets
(HULK_STAGE, HULK_NUM_STAGES, HULK_LAYER_LO, HULK_LAYER_HI, HULK_REPLICA, HULK_NUM_REPLICAS,
HULK_MICRO_BATCH, HULK_JOB, HULK_PLAN_ID) and torchrun's RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, joins a gloo process group, and trains transformer blocks [lo, hi) as stage ``stage``
of pipeline replica ``replica`` (torch.distributed.pipelining, GPipe or 1F1B). The first stage also
owns the embeddings, the last the final norm, the head and the loss. After each pipeline step the
nodes of a stage average their gradients (one all-reduce over the stage's replicas) and step.

Ranks are not assumed to follow any order: every process tells every other its (stage, replica)
and the groups are built from that, so the launcher may number nodes as it likes. Without HULK_*
variables the WORLD_SIZE processes form one pipeline with layers split evenly, so

    torchrun --nproc-per-node 2 examples/train_gpt.py --steps 5

works on a laptop. The data is a short built-in text, character level; CPU only; one step takes
well under a second at the default size. Exit code 0 after ``--steps`` steps; 2 on a bad role.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

try:  # the project's one table of HULK_* variables, when the example runs inside the project
    from hulk.settings import env as _hulk_env
except ImportError:  # a bare checkout of examples/ on a GPU server
    def _hulk_env(name: str, default: str | None = None) -> str | None:
        value = os.environ.get(name)
        return value if value not in (None, "") else default

TEXT = (
    "Hulk places large model training jobs on servers spread across cities and countries. "
    "It measures the network between the servers, learns a graph of the fleet, and decides "
    "which servers train which model and how: pipeline stages with layer ranges and data "
    "parallel replicas, so that jobs finish sooner than they would with plain data, pipeline "
    "or tensor parallelism over the whole fleet. Latency between Beijing and Tokyo is low; "
    "between Beijing and Brasilia it is high, so a pipeline should not cross the world twice. "
)


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


def _int(name: str, value: str | None) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise RoleError(f"{name} must be an integer, got {value!r}") from None


def role_from_env(layers: int, default_micro_batch: int) -> Role:
    """This process's role; without HULK_STAGE, one pipeline over WORLD_SIZE ranks."""
    rank = _int("RANK", os.environ.get("RANK", "0"))
    world = _int("WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    if _hulk_env("HULK_STAGE") is None:
        lo, hi = layers * rank // world, layers * (rank + 1) // world
        return Role(rank, world, rank, world, lo, hi, 0, 1,
                    _int("HULK_MICRO_BATCH", _hulk_env("HULK_MICRO_BATCH", str(default_micro_batch))),
                    _hulk_env("HULK_JOB", "train-gpt") or "", _hulk_env("HULK_PLAN_ID", "") or "")
    values = {name: _int(name, _hulk_env(name)) for name in (
        "HULK_STAGE", "HULK_NUM_STAGES", "HULK_LAYER_LO", "HULK_LAYER_HI")}
    return Role(
        rank=rank, world_size=world,
        stage=values["HULK_STAGE"], num_stages=values["HULK_NUM_STAGES"],
        layer_lo=values["HULK_LAYER_LO"], layer_hi=values["HULK_LAYER_HI"],
        replica=_int("HULK_REPLICA", _hulk_env("HULK_REPLICA", "0")),
        num_replicas=_int("HULK_NUM_REPLICAS", _hulk_env("HULK_NUM_REPLICAS", "1")),
        micro_batch=_int("HULK_MICRO_BATCH", _hulk_env("HULK_MICRO_BATCH", str(default_micro_batch))),
        job=_hulk_env("HULK_JOB", "train-gpt") or "", plan_id=_hulk_env("HULK_PLAN_ID", "") or "")


def check_roles(roles: list[tuple[int, ...]]) -> tuple[int, dict[tuple[int, int], int]]:
    """Validate every rank's (stage, num_stages, lo, hi, replica, num_replicas, micro_batch).

    Returns the total number of layers and the map (stage, replica) -> rank.
    """
    k, d = roles[0][1], roles[0][5]
    if any(r[1] != k or r[5] != d for r in roles):
        raise RoleError("ranks disagree on HULK_NUM_STAGES / HULK_NUM_REPLICAS")
    if k * d != len(roles):
        raise RoleError(f"{k} stages x {d} replicas need {k * d} processes, WORLD_SIZE is {len(roles)}")
    if len({r[6] for r in roles}) != 1 or roles[0][6] < 1:
        raise RoleError("ranks disagree on HULK_MICRO_BATCH or it is below 1")
    where: dict[tuple[int, int], int] = {}
    ranges: dict[int, tuple[int, int]] = {}
    for rank, (stage, _, lo, hi, replica, _, _) in enumerate(roles):
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
                 first: bool, last: bool, seed: int):
        super().__init__()
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
        if self.tok is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok(x) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.ln_f(x))
        return x


def batches(text: str, seq_len: int, batch: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ``batch`` windows of the text, same on every rank."""
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=g)
    x = torch.stack([ids[s:s + seq_len] for s in starts])
    y = torch.stack([ids[s + 1:s + seq_len + 1] for s in starts])
    return x, y


# -- networking -----------------------------------------------------------------------------------
def interface_for(address: str) -> str | None:
    """The name of the local interface packets to ``address`` leave from (gloo binds to it)."""
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.connect((address, 9))
        local = probe.getsockname()[0]
        probe.close()
    except OSError:
        return None
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            req = struct.pack("256s", name.encode()[:15])
            got = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
        except OSError:
            continue
        finally:
            s.close()
        if got == local:
            return name
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=4, help="blocks when HULK_* does not say")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4, help="when HULK_MICRO_BATCH is unset")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per replica per step")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for peers")
    p.add_argument("--summary", help="write step times and losses as JSON here (rank 0 of each stage)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    try:
        me = role_from_env(args.layers, args.micro_batch)
    except RoleError as err:
        print(f"train_gpt: {err}", file=sys.stderr)
        return 2
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_ADDR", master)
    os.environ.setdefault("MASTER_PORT", "29500")
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        ifname = interface_for(master)
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
    dist.init_process_group("gloo", rank=me.rank, world_size=me.world_size,
                            timeout=timedelta(seconds=args.timeout))
    try:
        return train(me, args)
    except RoleError as err:
        print(f"train_gpt: rank {me.rank}: {err}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


def train(me: Role, args: argparse.Namespace) -> int:
    mine = torch.tensor([me.stage, me.num_stages, me.layer_lo, me.layer_hi, me.replica,
                         me.num_replicas, me.micro_batch], dtype=torch.long)
    gathered = [torch.zeros_like(mine) for _ in range(me.world_size)]
    dist.all_gather(gathered, mine)
    layers, where = check_roles([tuple(int(v) for v in t) for t in gathered])
    k, d = me.num_stages, me.num_replicas

    # Every rank creates every group, in the same order (new_group is collective).
    pipe_groups = {r: [where[(s, r)] for s in range(k)] for r in range(d)}
    stage_groups = {s: [where[(s, r)] for r in range(d)] for s in range(k)}
    pg_pipe = {r: dist.new_group(ranks) for r, ranks in pipe_groups.items()} if k > 1 else {}
    pg_stage = {s: dist.new_group(ranks) for s, ranks in stage_groups.items()} if d > 1 else {}

    chars = sorted(set(TEXT))
    first, last = me.stage == 0, me.stage == k - 1
    part = StagePart(len(chars), args.dim, args.heads, args.seq_len, layers, me.layer_lo,
                     me.layer_hi, first, last, args.seed)
    optimizer = torch.optim.AdamW(part.parameters(), lr=args.lr)
    mb, n_micro = me.micro_batch, args.micro_batches
    per_replica = mb * n_micro

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    schedule = None
    if k > 1:
        # Shapes are inferred from the first micro-batch (the stages exchange them once).
        stage = PipelineStage(part, me.stage, k, torch.device("cpu"), group=pg_pipe[me.replica])
        # Group ranks follow global rank order, not stage order: tell the stage who is who.
        ordered = sorted(pipe_groups[me.replica])
        stage.stage_index_to_group_rank = {s: ordered.index(g) for s, g in
                                           enumerate(pipe_groups[me.replica])}
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        schedule = kind(stage, n_microbatches=n_micro, loss_fn=loss_fn)

    params = [p for p in part.parameters()]
    times, losses_out = [], []
    for step in range(args.steps):
        x, y = batches(TEXT, args.seq_len, per_replica * d, args.seed, step)
        x = x[me.replica * per_replica:(me.replica + 1) * per_replica]
        y = y[me.replica * per_replica:(me.replica + 1) * per_replica]
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        micro_losses: list[torch.Tensor] = []
        if schedule is None:  # one stage: plain training on this node
            for xs, ys in zip(x.split(mb), y.split(mb)):
                loss = loss_fn(part(xs), ys) / n_micro
                loss.backward()
                micro_losses.append(loss.detach() * n_micro)
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=micro_losses)
        else:
            schedule.step()
        if d > 1:  # average gradients over the stage's replicas, one flat all-reduce
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=pg_stage[me.stage])
            flat /= d
            offset = 0
            for p, g in zip(params, grads):
                p.grad = flat[offset:offset + g.numel()].view_as(g)
                offset += g.numel()
        optimizer.step()
        elapsed = time.perf_counter() - t0
        times.append(elapsed)
        line = f"step {step + 1}/{args.steps} stage {me.stage} replica {me.replica} time {elapsed:.3f}s"
        if last:
            loss_value = float(torch.stack([v.detach() for v in micro_losses]).mean())
            if not math.isfinite(loss_value):
                print(f"train_gpt: rank {me.rank}: loss is {loss_value}", file=sys.stderr)
                return 1
            losses_out.append(loss_value)
            line += f" loss {loss_value:.4f}"
        print(line, flush=True)

    if args.summary and me.replica == 0:
        path = args.summary.replace("{stage}", str(me.stage))
        summary = {"role": asdict(me), "layers": layers, "step_s": times, "loss": losses_out,
                   "params": sum(p.numel() for p in params)}
        with open(path, "w") as fh:
            json.dump(summary, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
