"""A small GPT trained as pipeline stages with data-parallel replicas, the way Hulk places it.

Every process is one node of a placement. It reads its role from the variables an agent sets
(HULK_STAGE, HULK_NUM_STAGES, HULK_LAYER_LO, HULK_LAYER_HI, HULK_REPLICA, HULK_NUM_REPLICAS,
HULK_MICRO_BATCH, HULK_MICRO_BATCHES, HULK_CHECKPOINT_DIR, HULK_RESTART_COUNT, HULK_JOB,
HULK_PLAN_ID) and torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, joins a process group
(gloo on CPU, NCCL with ``--device cuda``), and trains transformer blocks [lo, hi) as stage
``stage`` of pipeline replica ``replica`` (torch.distributed.pipelining, GPipe or 1F1B). The first
stage also owns the embeddings, the last the final norm, the head and the loss.

One optimizer step = HULK_MICRO_BATCHES micro-batches of HULK_MICRO_BATCH samples per replica
(the plan's m and b; gradients accumulate over them), then the nodes of a stage average their
gradients (one all-reduce over the stage's replicas) and step. ``--precision bf16`` runs the
blocks under bf16 autocast; ``fp16`` under fp16 autocast with a dynamic loss scale that every
rank agrees on (a step is skipped everywhere when any stage's gradients overflow).

Checkpoints: with HULK_CHECKPOINT_DIR (or ``--checkpoint-dir``) set, every ``--checkpoint-every``
steps each rank writes its shard, ``step-NNNNNNNN/shard-L<lo>-<hi>-of<layers>-r<replica>.pt``
(its parameters under whole-model names, optimizer state, step, RNG, loss scale), atomically
(a temporary file renamed into place). Checkpoints are fenced by epoch (the placement's
HULK_RESTART_COUNT): a shard of epoch N > 0 ends ``-eN.pt``, a rank claims its epoch in the
folder's ``epoch`` file on start, and a rank that finds a newer epoch there, on start or around
a checkpoint, writes nothing and exits 3 ("fenced"), so an old copy left running by a partition
never overwrites or publishes what the new copy resumes from; resume takes the newest epoch, then
its latest step that every rank has. On start every rank lists the steps whose shards cover its
layers, the ranks agree on the latest step all of them have, and training continues from there;
shards are named by layers, so a job re-planned with other stage splits resumes too, if the
folder is shared storage (a node-local folder resumes the same nodes only).

Ranks are not assumed to follow any order: every process tells every other its (stage, replica)
and the groups are built from that, so the launcher may number nodes as it likes. Without HULK_*
variables the WORLD_SIZE processes form one pipeline with layers split evenly, so

    torchrun --nproc-per-node 2 examples/train_gpt.py --steps 5

works on a laptop. The data is a short built-in text, character level (``--corpus markov``: a
long seeded Markov text fitted on it); one step takes well under
a second at the default size on CPU. Exit code 0 after ``--steps`` steps; 2 on a bad role; 3
when fenced.

With HULK_SYNC=diloco the replicas form islands (HULK_ISLAND, HULK_NUM_ISLANDS): the gradient
all-reduce stays within the island, and every HULK_INNER_STEPS steps (and after the last) the
stage's replicas of all islands average their pseudo-gradients, compressed as
HULK_OUTER_COMPRESSION says, for an outer Nesterov step (examples/diloco.py). Checkpoints are then
written only right after outer steps (the first at or after ``--checkpoint-every``) and carry the
outer momentum. HULK_STREAMING_FRAGMENTS above 0 is refused (exit 2). ``--outer-lr`` and
``--outer-momentum`` set the outer Nesterov step (default the paper's 0.7 and 0.9); each outer
step's line says where its time went (``exchange``: among the islands' leaders, waiting for the
slowest included; ``broadcast``: within the island).

This file holds the command line and the training loop; roles, the model and the loss scale are in
gpt_parts.py beside it, the checkpoints in gpt_checkpoints.py, DiLoCo's parts in diloco.py (copy the
four to a GPU server).
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
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from diloco import (COMPRESSIONS, OUTER_LR, OUTER_MOMENTUM, SYNC_MODES, IslandError, OuterSync,
                    island_groups, islands_of_replicas, outer_leaders)
from gpt_checkpoints import Fenced, agreed_resume_step, load_checkpoint, save_checkpoint
from gpt_parts import (AUTOCAST, CORPORA, LossScaler, ProgressFile, Role, RoleError, StagePart,
                       batches, check_roles, corpus, role_from_env)

FENCED_EXIT = 3     # a newer copy of this job (a higher epoch) has claimed the checkpoint folder


def fenced(exc: Fenced) -> int:
    print(f"fenced: {exc}; stopping without writing", file=sys.stderr, flush=True)
    return FENCED_EXIT


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
    p.add_argument("--steps", type=int, default=10, help="optimizer steps in all (a resumed run counts "
                   "the steps before its checkpoint)")
    p.add_argument("--layers", type=int, default=4, help="blocks when HULK_* does not say")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4, help="when HULK_MICRO_BATCH is unset")
    p.add_argument("--micro-batches", type=int, default=4,
                   help="micro-batches per replica per step, when HULK_MICRO_BATCHES is unset")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    p.add_argument("--precision", choices=sorted(AUTOCAST), default="fp32",
                   help="bf16: bf16 autocast; fp16: fp16 autocast with a dynamic loss scale")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: GPU LOCAL_RANK and NCCL instead of gloo")
    p.add_argument("--checkpoint-dir", default="", help="when HULK_CHECKPOINT_DIR is unset")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--keep", type=int, default=2, help="checkpoints each rank keeps")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--outer-lr", type=float, default=OUTER_LR,
                   help="DiLoCo's outer Nesterov learning rate (0 < lr <= 2)")
    p.add_argument("--outer-momentum", type=float, default=OUTER_MOMENTUM,
                   help="DiLoCo's outer Nesterov momentum (0 <= momentum < 1)")
    p.add_argument("--corpus", choices=CORPORA, default="builtin",
                   help="builtin: the short built-in text (memorised within a few hundred steps); "
                   "markov: 200,000 characters of a seeded Markov chain fitted on it (same "
                   "alphabet, about 1.65 nats a character that no model can learn away)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for peers")
    p.add_argument("--summary", help="write step times and losses as JSON here: "
                   "{stage} and {replica} in it are replaced; without {replica}, replica 0 only")
    args = p.parse_args(argv)
    if args.checkpoint_every < 1 or args.keep < 1:
        p.error("--checkpoint-every and --keep must be at least 1")
    # Sequences are cut from the corpus: one longer than it fails deep in torch.
    text = corpus(args.corpus)
    if not 1 <= args.seq_len <= len(text) - 2:
        p.error(f"--seq-len must be 1..{len(text) - 2} (the {args.corpus} text has {len(text)} "
                f"characters), got {args.seq_len}")
    if not (0 < args.outer_lr <= 2 and 0 <= args.outer_momentum < 1):
        p.error(f"--outer-lr must be in (0, 2] and --outer-momentum in [0, 1), got "
                f"{args.outer_lr} and {args.outer_momentum}")
    if args.heads < 1 or args.dim % args.heads:
        p.error(f"--dim ({args.dim}) must be a multiple of --heads ({args.heads})")
    torch.set_num_threads(args.threads)

    try:
        me = role_from_env(args.layers, args.micro_batch, args.micro_batches, args.checkpoint_dir)
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
    if args.device == "cuda":
        problem = cuda_problem(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        if problem:
            print(f"train_gpt: --device cuda: {problem}", file=sys.stderr)
            return 2
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=me.rank,
                            world_size=me.world_size, timeout=timedelta(seconds=args.timeout))
    try:
        return train(me, args, device)
    except RoleError as err:
        print(f"train_gpt: rank {me.rank}: {err}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


def cuda_problem(local_ranks: int) -> str:
    """Why this host cannot give each of its ``local_ranks`` processes a GPU of its own, or "".

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected") only after the rendezvous, as a
    traceback from every rank; this says it first, in one line."""
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    gpus = torch.cuda.device_count()
    if local_ranks > gpus:
        return (f"{local_ranks} processes on this host but {gpus} GPU(s); NCCL needs one GPU per "
                f"process (torchrun --nproc-per-node {gpus}, or --device cpu)")
    return ""


def train(me: Role, args: argparse.Namespace, device: torch.device = torch.device("cpu")) -> int:
    mine = torch.tensor([me.stage, me.num_stages, me.layer_lo, me.layer_hi, me.replica,
                         me.num_replicas, me.micro_batch, me.micro_batches, me.island,
                         me.num_islands, me.inner_steps, SYNC_MODES.index(me.sync),
                         COMPRESSIONS.index(me.outer_compression)], dtype=torch.long, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(me.world_size)]
    dist.all_gather(gathered, mine)
    roles = [tuple(int(v) for v in t.tolist()) for t in gathered]
    layers, where = check_roles(roles)
    k, d = me.num_stages, me.num_replicas
    diloco = me.sync == "diloco"
    if len({r[10:] for r in roles}) != 1:
        raise RoleError("ranks disagree on HULK_SYNC / HULK_INNER_STEPS / HULK_OUTER_COMPRESSION")
    try:
        island_of = islands_of_replicas([(r[4], r[8], r[9]) for r in roles], d) if diloco else [0] * d
    except IslandError as err:
        raise RoleError(str(err)) from None

    # Every rank creates every group, in the same order (new_group is collective).
    pipe_groups = {r: [where[(s, r)] for s in range(k)] for r in range(d)}
    stage_groups = {s: [where[(s, r)] for r in range(d)] for s in range(k)}
    pg_pipe = {r: dist.new_group(ranks) for r, ranks in pipe_groups.items()} if k > 1 else {}
    # DiLoCo has no group of a stage's every replica: its outer sync runs among island leaders.
    pg_stage = ({s: dist.new_group(ranks) for s, ranks in stage_groups.items()}
                if d > 1 and not diloco else {})
    # Inner steps average gradients within the island; step sync's one island is the stage group.
    islands = island_groups(where, island_of, k)
    mates = len(islands[(me.stage, island_of[me.replica])])
    pg_inner, pg_outer, leaders = pg_stage.get(me.stage), None, {}
    if diloco:  # every rank creates every island's and every outer group, its own or not
        pg_islands = {key: dist.new_group(ranks) for key, ranks in sorted(islands.items())
                      if len(ranks) > 1}
        pg_inner = pg_islands.get((me.stage, island_of[me.replica]))
        leaders = outer_leaders(where, island_of, k)
        groups = {s: dist.new_group(ranks) for s, ranks in leaders.items() if len(ranks) > 1}
        pg_outer = groups.get(me.stage) if me.rank in leaders[me.stage] else None

    text = corpus(args.corpus)
    chars = sorted(set(text))
    first, last = me.stage == 0, me.stage == k - 1
    part = StagePart(len(chars), args.dim, args.heads, args.seq_len, layers, me.layer_lo,
                     me.layer_hi, first, last, args.seed, AUTOCAST[args.precision]).to(device)
    optimizer = torch.optim.AdamW(part.parameters(), lr=args.lr)
    scaler = LossScaler(args.precision == "fp16", device)
    mb, n_micro = me.micro_batch, me.micro_batches
    per_replica = mb * n_micro

    params = [p for p in part.parameters()]
    names = list(part.named_globally())
    outer = None
    if diloco:
        my_island = island_of[me.replica]
        outer = OuterSync(params, me.outer_compression, pg_outer, me.num_islands, weight=mates,
                          total=d, island_group=pg_inner,
                          leader=leaders[me.stage][my_island], lr=args.outer_lr,
                          mu=args.outer_momentum)
    # DiLoCo checkpoints only right after an outer step, where the parameters are the anchor.
    every = args.checkpoint_every
    if diloco:
        every = me.inner_steps * max(1, math.ceil(every / me.inner_steps))
    try:
        from_epoch, start = agreed_resume_step(me, me.checkpoint_dir, layers, device)
    except Fenced as exc:
        return fenced(exc)
    if start:
        outer_state = load_checkpoint(me.checkpoint_dir, start, me, layers, part, optimizer,
                                      scaler, epoch=from_epoch)
        if outer is not None:
            outer.load(names, outer_state)
        print(f"resumed from step {start} (restart {me.restart_count}) stage {me.stage} "
              f"replica {me.replica} epoch {from_epoch}", flush=True)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # The schedule divides gradients by n_microbatches: a mean over the micro-batches.
        return scaler.scale(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)))

    schedule = None
    if k > 1:
        # Shapes are inferred from the first micro-batch (the stages exchange them once).
        stage = PipelineStage(part, me.stage, k, device, group=pg_pipe[me.replica])
        # Group ranks follow global rank order, not stage order: tell the stage who is who.
        ordered = sorted(pipe_groups[me.replica])
        stage.stage_index_to_group_rank = {s: ordered.index(g) for s, g in
                                           enumerate(pipe_groups[me.replica])}
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        schedule = kind(stage, n_microbatches=n_micro, loss_fn=loss_fn)

    times, losses_out, outer_s, skipped = [], [], [], 0
    progress = ProgressFile()
    for step in range(start, args.steps):
        x, y = batches(text, args.seq_len, per_replica * d, args.seed, step)
        x = x[me.replica * per_replica:(me.replica + 1) * per_replica].to(device)
        y = y[me.replica * per_replica:(me.replica + 1) * per_replica].to(device)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        micro_losses: list[torch.Tensor] = []
        scale = scaler.value
        if schedule is None:  # one stage: accumulate the micro-batches' gradients on this node
            for xs, ys in zip(x.split(mb), y.split(mb)):
                loss = loss_fn(part(xs), ys)
                (loss / n_micro).backward()
                micro_losses.append(loss.detach())
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=micro_losses)
        else:
            schedule.step()
        reduce_s = 0.0
        if mates > 1:  # average gradients over the island's replicas, one flat all-reduce
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            if device.type == "cuda":   # the all-reduce's time, not the backward's still running
                torch.cuda.synchronize(device)
            t_reduce = time.perf_counter()
            dist.all_reduce(flat, group=pg_inner)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            reduce_s = time.perf_counter() - t_reduce
            flat /= mates
            offset = 0
            for p, g in zip(params, grads):
                p.grad = flat[offset:offset + g.numel()].view_as(g)
                offset += g.numel()
        if scaler.unscale(params):
            optimizer.step()
        else:
            skipped += 1
        done = step + 1
        synced = outer is not None and (done % me.inner_steps == 0 or done == args.steps)
        if synced:
            spent = outer.sync()
            outer_s.append(spent)
            reduce_s += spent
        if device.type == "cuda":   # kernels run after their launch: time the step's work
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
        times.append(elapsed)
        # Without a pipeline the all-reduce is the step's only communication; a pipeline's
        # transfers run inside the schedule, so its split is not known and not written.
        split = (elapsed - reduce_s, reduce_s) if k == 1 else (None, None)
        progress.step(step + 1, elapsed, args.steps, *split)
        line = f"step {step + 1}/{args.steps} stage {me.stage} replica {me.replica} time {elapsed:.3f}s"
        if last:
            loss_value = float(torch.stack([v.detach().float() for v in micro_losses]).mean()) / scale
            if not math.isfinite(loss_value) and not scaler.enabled:
                print(f"train_gpt: rank {me.rank}: loss is {loss_value}", file=sys.stderr)
                return 1
            losses_out.append(loss_value)
            line += f" loss {loss_value:.4f}"
        if synced:
            ph = outer.phases
            line += (f" outer {outer.syncs} {outer_s[-1]:.3f}s exchange {ph['exchange_s']:.3f}s"
                     f" broadcast {ph['broadcast_s']:.3f}s enter {ph['enter']:.3f}")
        # The wall clock at the step's end: the job's pace is the last node's, and islands that
        # drift apart between outer steps make per-step times a poor sum of it.
        line += f" at {time.time():.3f}"
        print(line, flush=True)
        if me.checkpoint_dir and (done % every == 0 or done == args.steps):
            try:
                save_checkpoint(me.checkpoint_dir, done, me, layers, part, optimizer, scaler,
                                args.keep, outer.state(names) if outer is not None else None)
            except Fenced as exc:
                return fenced(exc)

    progress.close()
    if args.summary and (me.replica == 0 or "{replica}" in args.summary):
        path = args.summary.replace("{stage}", str(me.stage)).replace("{replica}", str(me.replica))
        summary = {"role": asdict(me), "layers": layers, "step_s": times, "loss": losses_out,
                   "params": sum(p.numel() for p in params), "start_step": start,
                   "precision": args.precision, "skipped_steps": skipped, "sync": me.sync,
                   "inner_steps": me.inner_steps, "outer_compression": me.outer_compression,
                   "num_islands": me.num_islands, "outer_s": outer_s,
                   "pseudo_gradient_norms": outer.local_norms if outer is not None else []}
        with open(path, "w") as fh:
            json.dump(summary, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
