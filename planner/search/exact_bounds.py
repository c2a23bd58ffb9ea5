"""Array helpers of the exact search's bounds, and which servers the jobs still to place in a
phase need together (pure: arrays in, arrays out).

A job that finishes under T on servers S has its bound (``planner.search.exact.job_bounds``)
at the class-count vector of S below T, so the vectors R it can finish under T within lie in
the up-closure of the vectors where its bound is below T (``up_closure``). Jobs of one phase
use disjoint servers, so jobs j1..jm can all finish under T within R only if R holds
y1 + ... + ym, each yi in job i's up-set: the Minkowski sum of the up-sets
(``fits_together``), clipped to the lattice. This ties the jobs still to place to the servers
left, which a bound per job (each given all of them) does not.
"""

from __future__ import annotations

import numpy as np


def top_sums(vectors: np.ndarray, value: np.ndarray, n: int) -> np.ndarray:
    """(V, n + 1): the sum of the m largest ``value`` of each vector's servers, m = 0..n
    (beyond its size: all of them)."""
    order = np.argsort(-value, kind="stable")
    v, val = vectors[:, order], value[order]
    before = np.cumsum(v, axis=1) - v
    out = np.zeros((vectors.shape[0], n + 1))
    for m in range(1, n + 1):
        out[:, m] = (np.clip(m - before, 0, v) * val).sum(axis=1)
    return out


def nan_inf(x):
    """``x`` with NaN (inf times zero: a term that cannot happen) as inf."""
    x = np.asarray(x, dtype=float)
    return np.where(np.isnan(x), np.inf, x)


def suffix(values: np.ndarray, op, empty: float) -> np.ndarray:
    """out[q] = ``op`` (np.minimum or np.maximum) of values[q:], out[len] = ``empty``."""
    out = np.full(values.size + 1, empty)
    if values.size:
        out[:-1] = op.accumulate(values[::-1])[::-1]
    return out


def up_closure(member: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Flat boolean array: vectors R holding some member y <= R (componentwise)."""
    out = member.reshape(shape).copy()
    for axis in range(out.ndim):
        np.logical_or.accumulate(out, axis=axis, out=out)
    return out.reshape(-1)


def minimal(up: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(Q, C): the minimal vectors of the up-set ``up`` (flat boolean)."""
    grid = up.reshape(shape)
    below = np.zeros_like(grid)
    for axis in range(grid.ndim):
        lead = [slice(None)] * grid.ndim
        tail = [slice(None)] * grid.ndim
        lead[axis], tail[axis] = slice(1, None), slice(None, -1)
        below[tuple(lead)] |= grid[tuple(tail)]
    return np.argwhere(grid & ~below)


def fits_together(first: np.ndarray, rest: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Flat boolean array: vectors R = y + z (or more), y in ``first`` and z in ``rest``, both
    up-sets (flat boolean): the vectors that hold a share for each side."""
    a, b = first.reshape(shape), rest.reshape(shape)
    corners_a, corners_b = minimal(first, shape), minimal(rest, shape)
    if len(corners_a) > len(corners_b):   # shift the set with fewer corners
        a, b, corners_a = b, a, corners_b
    out = np.zeros(shape, dtype=bool)
    for m in corners_a:
        dst = tuple(slice(int(k), None) for k in m)
        src = tuple(slice(0, s - int(k)) for s, k in zip(shape, m))
        out[dst] |= b[src]
    return out.reshape(-1)


def suffix_fits(bounds: list[np.ndarray], threshold: float,
                shape: tuple[int, ...]) -> list[np.ndarray]:
    """For jobs in search order with per-vector ``bounds``: out[i] flags the vectors whose
    servers can hold jobs i.. all under ``threshold`` (by the bounds); out[len] is every
    vector."""
    size = int(np.prod(shape))
    out = [np.ones(size, dtype=bool)]
    for b in reversed(bounds):
        own = up_closure(b < threshold, shape)
        out.append(own if len(out) == 1 else fits_together(own, out[-1], shape))
    return out[::-1]
