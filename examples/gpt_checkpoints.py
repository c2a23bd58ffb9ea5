"""examples/train_gpt.py's sharded checkpoints, fenced by epoch: each rank writes its layers'
shard of a step atomically, ranks agree on the step to resume from, and a copy of the job older
than one that has started in the folder writes nothing (docs/JOBS.md, "Fencing").

It sits beside train_gpt.py, gpt_parts.py and diloco.py (copy the four to a GPU server).
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from gpt_parts import LossScaler, Role, RoleError

if TYPE_CHECKING:
    from gpt_parts import StagePart

# -- checkpoints ----------------------------------------------------------------------------------
# A shard's name carries the epoch of the copy that wrote it (the placement's restart count; none
# at epoch 0): two copies of a job never write one file, and resume reads the newest epoch.
STEP_DIR = "step-{:08d}"
SHARD = "shard-L{lo}-{hi}-of{layers}-r{replica}{epoch}.pt"
EPOCH_FILE = "epoch"     # the newest epoch that has started in the folder


class Fenced(RuntimeError):
    """A newer copy of this job (a higher epoch) has started in the checkpoint folder."""


def _epoch_tag(epoch: int) -> str:
    return f"-e{epoch}" if epoch else ""


def _shard_ranges(folder: str, layers: int) -> list[tuple[int, int, int, str, int]]:
    """(lo, hi, replica, path, epoch) of the complete shards in one step folder (temporary files
    are not)."""
    out = []
    for path in glob.glob(os.path.join(folder, "shard-L*-*-of*-r*.pt")):
        name = os.path.basename(path)[len("shard-L"):-len(".pt")]
        try:
            span, rest = name.split("-of")
            lo, hi = (int(v) for v in span.split("-"))
            total, tail = rest.split("-r")
            replica, _, epoch = tail.partition("-e")
            total, replica, epoch = int(total), int(replica), int(epoch or 0)
        except ValueError:
            continue
        if total == layers:
            out.append((lo, hi, replica, path, epoch))
    return out


def _covering(shards, lo: int, hi: int, replica: int) -> list[str] | None:
    """Shard paths that hold every layer in [lo, hi), own replica's first; None if some is missing."""
    chosen: list[str] = []
    for layer in range(lo, hi):
        holders = sorted((s for s in shards if s[0] <= layer < s[1]), key=lambda s: s[2] != replica)
        if not holders:
            return None
        if holders[0][3] not in chosen:
            chosen.append(holders[0][3])
    return chosen


def _epoch_shards(folder: str, layers: int, epoch: int):
    return [s for s in _shard_ranges(folder, layers) if s[4] == epoch]


def checkpoint_steps(directory: str, layers: int, lo: int, hi: int, replica: int,
                     most: int = 8, epoch: int | None = None) -> list[tuple[int, int]]:
    """The latest (epoch, step) pairs, newest epoch first, then newest step (at most ``most``),
    whose shards of that one epoch cover layers [lo, hi); epochs above ``epoch`` are not read."""
    found = []
    for folder in glob.glob(os.path.join(directory, "step-*")):
        try:
            step = int(os.path.basename(folder)[len("step-"):])
        except ValueError:
            continue
        shards = _shard_ranges(folder, layers)
        for e in sorted({s[4] for s in shards if epoch is None or s[4] <= epoch}):
            if _covering([s for s in shards if s[4] == e], lo, hi, replica) is not None:
                found.append((e, step))
    return sorted(found, reverse=True)[:most]


def newest_epoch(directory: str) -> int:
    """The highest epoch that has started in ``directory`` (0: none recorded)."""
    try:
        with open(os.path.join(directory, EPOCH_FILE)) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def claim_epoch(directory: str, epoch: int) -> None:
    """Record that ``epoch`` started in ``directory``, unless a newer one has (then
    :class:`Fenced`): an older copy still running sees it before its next checkpoint."""
    os.makedirs(directory, exist_ok=True)
    newest = newest_epoch(directory)
    if newest > epoch:
        raise Fenced(f"epoch {newest} of this job has started in {directory}; this copy is "
                     f"epoch {epoch}")
    if newest < epoch:
        tmp = os.path.join(directory, f".{EPOCH_FILE}.tmp{os.getpid()}")
        with open(tmp, "w") as fh:
            fh.write(str(epoch))
        os.replace(tmp, os.path.join(directory, EPOCH_FILE))


def save_checkpoint(directory: str, step: int, me: Role, layers: int, part: "StagePart",
                    optimizer: torch.optim.Optimizer, scaler: LossScaler, keep: int,
                    outer: dict | None = None) -> str:
    """Write this rank's shard of ``step`` for its epoch atomically, unless a newer epoch has
    started (:class:`Fenced`, checked before and after writing: a shard of an older copy is never
    published once the newer one has claimed the folder); drop this rank's shards of its epoch
    and older beyond the newest ``keep``. ``outer``: DiLoCo's outer optimizer state."""
    epoch = me.restart_count
    claim_epoch(directory, epoch)
    folder = os.path.join(directory, STEP_DIR.format(step))
    os.makedirs(folder, exist_ok=True)
    named = part.named_globally()
    state = {
        "step": step, "layers": layers, "lo": me.layer_lo, "hi": me.layer_hi, "replica": me.replica,
        "epoch": epoch, "model": {n: p.detach().cpu() for n, p in named.items()},
        "optimizer": {n: {k: (v.cpu() if torch.is_tensor(v) else v)
                          for k, v in optimizer.state[p].items()}
                      for n, p in named.items() if p in optimizer.state},
        "rng": torch.get_rng_state(), "loss_scale": scaler.value,
        "cuda_rng": torch.cuda.get_rng_state() if scaler.device.type == "cuda" else None,
        "outer": outer,
    }
    path = os.path.join(folder, SHARD.format(lo=me.layer_lo, hi=me.layer_hi, layers=layers,
                                             replica=me.replica, epoch=_epoch_tag(epoch)))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        claim_epoch(directory, epoch)
    except Fenced:
        os.remove(tmp)
        raise
    os.replace(tmp, path)  # a reader sees the whole shard or none
    mine = [(e, st, p) for st, p, e in _own_shards(directory, me, layers) if e <= epoch]
    for _, _, old in sorted(mine, reverse=True)[keep:]:
        try:
            os.remove(old)
            os.rmdir(os.path.dirname(old))  # only once every rank has removed its shard
        except OSError:
            pass
    return path


def _own_shards(directory: str, me: Role, layers: int) -> list[tuple[int, str, int]]:
    """(step, path, epoch) of every shard of this rank's layers and replica, any epoch."""
    out = []
    for folder in glob.glob(os.path.join(directory, "step-*")):
        try:
            step = int(os.path.basename(folder)[len("step-"):])
        except ValueError:
            continue
        out.extend((step, s[3], s[4]) for s in _shard_ranges(folder, layers)
                   if (s[0], s[1], s[2]) == (me.layer_lo, me.layer_hi, me.replica))
    return out


def load_checkpoint(directory: str, step: int, me: Role, layers: int, part: "StagePart",
                    optimizer: torch.optim.Optimizer, scaler: LossScaler,
                    epoch: int = 0) -> dict | None:
    """Fill this rank's parameters and optimizer state from the shards ``epoch`` wrote of
    ``step``; returns the DiLoCo outer state they hold for this rank's parameters (None: none)."""
    folder = os.path.join(directory, STEP_DIR.format(step))
    paths = _covering(_epoch_shards(folder, layers, epoch), me.layer_lo, me.layer_hi,
                      me.replica) or []
    named = part.named_globally()
    missing = set(named)
    momentum: dict[str, torch.Tensor] = {}
    syncs = None
    for path in paths:
        state = torch.load(path, map_location="cpu", weights_only=True)
        outer = state.get("outer") or {}
        momentum.update({n: t for n, t in outer.get("momentum", {}).items() if n in named})
        syncs = outer.get("syncs", syncs)
        for name, param in named.items():
            if name in state["model"]:
                with torch.no_grad():
                    param.copy_(state["model"][name])
                missing.discard(name)
                if name in state["optimizer"]:
                    optimizer.state[param] = {k: (v.to(param.device) if torch.is_tensor(v) and v.dim()
                                                  else v) for k, v in state["optimizer"][name].items()}
        if (state["lo"], state["hi"], state["replica"]) == (me.layer_lo, me.layer_hi, me.replica):
            torch.set_rng_state(state["rng"])
            if state.get("cuda_rng") is not None and scaler.device.type == "cuda":
                torch.cuda.set_rng_state(state["cuda_rng"])
            scaler.value = state["loss_scale"]
    if missing:
        raise RoleError(f"checkpoint step {step} lacks {sorted(missing)[0]}")
    return {"momentum": momentum, "syncs": syncs or 0} if momentum else None


def agreed_resume_step(me: Role, directory: str, layers: int,
                       device: torch.device) -> tuple[int, int]:
    """The (epoch, step) to resume from: the newest epoch, then the latest step, that every rank
    has a checkpoint of ((0, 0): none); collective. A rank first claims its epoch in the folder
    (:func:`claim_epoch`; :class:`Fenced` where a newer copy has started)."""
    if directory:
        claim_epoch(directory, me.restart_count)
    have = checkpoint_steps(directory, layers, me.layer_lo, me.layer_hi, me.replica,
                            epoch=me.restart_count) if directory else []
    mine = torch.full((8,), -1, dtype=torch.long, device=device)
    if have:
        mine[:len(have)] = torch.tensor([(e << 32) | st for e, st in have], dtype=torch.long)
    gathered = [torch.zeros_like(mine) for _ in range(me.world_size)]
    dist.all_gather(gathered, mine)
    common = set.intersection(*({int(v) for v in t.tolist() if v >= 0} for t in gathered))
    best = max(common, default=0)
    return best >> 32, best & 0xFFFFFFFF
