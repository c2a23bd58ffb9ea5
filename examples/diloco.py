"""DiLoCo for examples/train_gpt.py (Douillard et al. 2023): islands of replicas train on their
own, and every H inner steps the replicas of each stage average their pseudo-gradients (anchor -
parameters) across all islands, and an outer Nesterov step moves the anchor.

An island is a contiguous block of replicas (HULK_ISLAND, HULK_NUM_ISLANDS); an inner step is an
ordinary step whose gradient all-reduce stays among the stage's replicas of one island. The outer
all-reduce carries the pseudo-gradients as HULK_OUTER_COMPRESSION says: ``none`` (fp32
all-reduce), ``bf16`` or ``int8`` (one absmax scale per parameter tensor); the compressed forms
travel by all_gather and are averaged in fp32, since gloo does not reduce bf16 or int8 and a bf16
sum would round at every hop.

It sits beside train_gpt.py, gpt_parts.py and gpt_checkpoints.py (copy the four to a GPU
server).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

SYNC_MODES = ("step", "diloco")
COMPRESSIONS = ("none", "bf16", "int8")
# DiLoCo's outer optimizer: SGD with Nesterov momentum (the paper's lr and momentum).
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


class IslandError(Exception):
    """The ranks' islands do not form contiguous blocks of replicas."""


def islands_of_replicas(roles: list[tuple[int, ...]], num_replicas: int) -> list[int]:
    """The island of each replica 0..D-1, from every rank's (replica, island, num_islands).

    Every stage of a replica must name the same island, and the islands must be contiguous,
    non-empty blocks 0, 1, ... num_islands - 1 of the replica order."""
    islands = {r[2] for r in roles}
    if len(islands) != 1:
        raise IslandError("ranks disagree on HULK_NUM_ISLANDS")
    n = islands.pop()
    if not 1 <= n <= num_replicas:
        raise IslandError(f"HULK_NUM_ISLANDS is {n}; it must be 1..{num_replicas} (the replicas)")
    of: dict[int, int] = {}
    for replica, island, _ in roles:
        if not 0 <= island < n:
            raise IslandError(f"replica {replica}: HULK_ISLAND {island} is not in 0..{n - 1}")
        if of.setdefault(replica, island) != island:
            raise IslandError(f"replica {replica}: its stages name different islands")
    order = [of[r] for r in range(num_replicas)]
    if order != sorted(order) or sorted(set(order)) != list(range(n)):
        raise IslandError(f"islands {order} (by replica) are not contiguous blocks 0..{n - 1}")
    return order


def island_groups(where: dict[tuple[int, int], int], island_of: list[int],
                  num_stages: int) -> dict[tuple[int, int], list[int]]:
    """(stage, island) -> the ranks of that stage's replicas in that island, in replica order."""
    groups: dict[tuple[int, int], list[int]] = {}
    for replica, island in enumerate(island_of):
        for stage in range(num_stages):
            groups.setdefault((stage, island), []).append(where[(stage, replica)])
    return groups


# -- compression ----------------------------------------------------------------------------------
def quantise_int8(flat: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and one fp32 scale per tensor (its absmax / 127); |x - dequantised| <= scale / 2."""
    values, scales = [], []
    for chunk in flat.float().split(sizes):
        top = float(chunk.abs().max()) if chunk.numel() else 0.0
        scale = top / 127.0 if top > 0 else 1.0
        values.append(torch.round(chunk / scale).clamp_(-127, 127).to(torch.int8))
        scales.append(scale)
    return torch.cat(values), torch.tensor(scales, dtype=torch.float32, device=flat.device)


def dequantise_int8(values: torch.Tensor, scales: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    return torch.cat([chunk.float() * scale for chunk, scale in zip(values.split(sizes), scales)])


def average(flat: torch.Tensor, sizes: list[int], compression: str, group, size: int) -> torch.Tensor:
    """The mean of ``flat`` over the ``size`` ranks of ``group``, sent as ``compression`` says."""
    if size == 1:
        return flat.clone()
    if compression == "none":
        out = flat.clone()
        dist.all_reduce(out, group=group)
        return out / size
    if compression == "bf16":
        # Sent as int16 bits: every backend gathers those, not every one bf16.
        wire = flat.to(torch.bfloat16).view(torch.int16)
        parts = [torch.empty_like(wire) for _ in range(size)]
        dist.all_gather(parts, wire, group=group)
        return torch.stack([p.view(torch.bfloat16).float() for p in parts]).mean(0)
    # Values and scales travel as one int8 buffer: one all_gather, so one round of the slow link.
    values, scales = quantise_int8(flat, sizes)
    wire = torch.cat([values, scales.view(torch.int8)])
    parts = [torch.empty_like(wire) for _ in range(size)]
    dist.all_gather(parts, wire, group=group)
    n = values.numel()
    # The scales start at any byte offset: copied out before they are read as fp32.
    return torch.stack([dequantise_int8(w[:n], w[n:].clone().view(torch.float32), sizes)
                        for w in parts]).mean(0)


# -- the outer optimizer --------------------------------------------------------------------------
def outer_nesterov(anchor: torch.Tensor, momentum: torch.Tensor, pseudo_gradient: torch.Tensor,
                   lr: float = OUTER_LR, mu: float = OUTER_MOMENTUM) -> None:
    """torch.optim.SGD(nesterov=True)'s step, in place: m = mu m + g; anchor -= lr (g + mu m)."""
    momentum.mul_(mu).add_(pseudo_gradient)
    anchor.sub_(lr * (pseudo_gradient + mu * momentum))


def outer_leaders(where: dict[tuple[int, int], int], island_of: list[int],
                  num_stages: int) -> dict[int, list[int]]:
    """stage -> the rank of each island's first replica of it: the ranks that carry the outer
    all-reduce. Within an island every replica of a stage holds the same parameters (their
    gradients are averaged every inner step), so one speaks for all and the slow links between
    islands carry one copy per island, not one per replica."""
    firsts = [island_of.index(i) for i in range(max(island_of) + 1)]
    return {s: [where[(s, r)] for r in firsts] for s in range(num_stages)}


class OuterSync:
    """A stage's anchor and outer momentum (flat, fp32) and the outer sync that moves them.

    ``group``/``size``: the island leaders' outer group (None on other ranks); ``weight``: the
    replicas of this rank's island of ``total``; ``island_group``/``leader``: where the leader
    broadcasts the averaged pseudo-gradient to its island (None: an island of one)."""

    def __init__(self, params: list[torch.nn.Parameter], compression: str, group, size: int,
                 weight: int = 1, total: int = 1, island_group=None, leader: int = 0,
                 lr: float = OUTER_LR, mu: float = OUTER_MOMENTUM):
        self.params, self.compression, self.group, self.size = params, compression, group, size
        self.lr, self.mu = lr, mu
        self.weight, self.total, self.island_group, self.leader = weight, total, island_group, leader
        self.sizes = [p.numel() for p in params]
        self.anchor = self._flat()
        self.momentum = torch.zeros_like(self.anchor)
        self.syncs = 0
        self.local_norms: list[float] = []   # this replica's pseudo-gradient at each outer step
        self.phases: dict[str, float] = {}

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).float() for p in self.params])

    def reset_anchor(self) -> None:
        """The parameters as they are become the anchor (after a resume)."""
        self.anchor = self._flat()

    def sync(self) -> float:
        """One outer step; returns its seconds. Parameters end equal to the new anchor.

        ``phases`` then holds where they went: ``exchange_s`` (the outer all_gather or all-reduce
        among island leaders, waiting for the slowest leader included), ``broadcast_s`` (within
        the island, waiting for its leader included) and ``enter`` (wall clock at entry, so the
        leaders' wait for one another can be told from the transfer)."""
        t0 = time.perf_counter()
        enter = time.time()
        local = self.anchor - self._flat()
        self.local_norms.append(float(local.norm()))
        t_exchange = time.perf_counter()
        if self.group is not None or self.size == 1:
            # Islands weigh by their replicas: the mean over every replica of the stage.
            delta = average(local * (self.weight * self.size / self.total), self.sizes,
                            self.compression, self.group, self.size)
        else:
            delta = torch.empty_like(local)
        t_broadcast = time.perf_counter()
        if self.island_group is not None:
            dist.broadcast(delta, src=self.leader, group=self.island_group)
        self.phases = {"enter": enter, "exchange_s": t_broadcast - t_exchange,
                       "broadcast_s": time.perf_counter() - t_broadcast}
        outer_nesterov(self.anchor, self.momentum, delta, self.lr, self.mu)
        offset = 0
        with torch.no_grad():
            for p, n in zip(self.params, self.sizes):
                p.copy_(self.anchor[offset:offset + n].view_as(p))
                offset += n
        self.syncs += 1
        return time.perf_counter() - t0

    def state(self, names: list[str]) -> dict:
        """The outer momentum under whole-model names, for a checkpoint (the anchor is the
        parameters: checkpoints are written right after an outer step)."""
        return {"momentum": dict(zip(names, (m.clone().cpu() for m in self.momentum.split(self.sizes)))),
                "syncs": self.syncs}

    def load(self, names: list[str], state: dict | None) -> None:
        """Momentum of the names ``state`` holds (others start at zero, as a fresh outer optimizer)."""
        self.reset_anchor()
        if not state:
            return
        held = state.get("momentum", {})
        parts = [held[n].reshape(-1).to(self.momentum) if n in held else torch.zeros(s).to(self.momentum)
                 for n, s in zip(names, self.sizes)]
        self.momentum = torch.cat(parts)
        self.syncs = int(state.get("syncs", 0))
