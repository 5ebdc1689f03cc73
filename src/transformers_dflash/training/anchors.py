"""Anchor draws: which response positions start a training block, vectorised over the batch, on any device.

Each sequence's anchors come from a counter-based random stream keyed by (seed, epoch, sequence index) only: a
32-bit integer hash of (key, position) ranks the candidate positions and a row keeps the `num_anchors` smallest,
a uniform draw without replacement. The draw is pure integer tensor code, so it runs on the GPU inside the step,
gives the same anchors on every device, is independent of data order, batch and process rank, is redrawn every
epoch, and a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_POSITION_BITS = 20  # a candidate's sort key is (hash << 20) | position: unique, so ties never depend on the device
_NOT_A_CANDIDATE = 1 << 62


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for int64 x in [0, 2**32), in 16-bit halves so that no product overflows int64."""
    low, high = x & 0xFFFF, x >> 16
    return (low * constant + (((high * constant) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (Wellons' lowbias32) of int64 values in [0, 2**32), bit-exact on every device."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def anchor_keys(seed: int, epoch: int, indices: torch.LongTensor) -> torch.LongTensor:
    """(b,) the random stream of each sequence's anchors in `epoch`, from (seed, epoch, sequence `indices` (b,))."""
    base = _hash32(_hash32(torch.tensor(seed & _MASK32)) ^ (epoch & _MASK32))
    return _hash32(base ^ (indices.cpu() & _MASK32)).to(indices.device)


def anchor_slots(
    lengths: torch.LongTensor, response_starts: torch.LongTensor, block_size: int, num_anchors: int
) -> int:
    """a: anchor columns a batch needs, max(1, min(num_anchors, most candidates of a row)), from host (b,) tensors."""
    candidates = lengths - block_size - response_starts.clamp_min(1) + 1  # (b,)
    return max(1, min(num_anchors, int(candidates.max())))


def draw_anchors(
    lengths: torch.LongTensor,
    response_starts: torch.LongTensor,
    keys: torch.LongTensor,
    block_size: int,
    num_anchors: int,
    slots: int,
    context_len: int,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Sorted random anchors of a batch, without repetition, on the device of the inputs (no host sync).

    An anchor is a response token (position >= `response_starts`, and >= 1 so some context exists) whose whole
    block `anchor .. anchor + block_size - 1` lies inside its sequence (`lengths`). All inputs are (b,) on one
    device; `context_len` (n, the padded width, < 2**20) and `slots` (`anchor_slots`) come from the host.

    Returns anchors (b, slots), padded with 0 after each row's real ones, and the real count per row (b,):
    min(num_anchors, candidates), possibly 0 (a response shorter than a block).
    """
    if context_len >= 1 << _POSITION_BITS:
        raise ValueError(f"Sequences of {context_len} tokens are too long for the anchor draw (< {1 << 20}).")
    position = torch.arange(context_len, device=keys.device)  # (n,)
    first, last = response_starts.clamp_min(1)[:, None], (lengths - block_size)[:, None]  # (b, 1) inclusive range
    candidate = (position >= first) & (position <= last)  # (b, n)
    rank = _hash32(keys[:, None] ^ _hash32(position))  # (b, n) 32-bit
    sort_key = torch.where(candidate, rank << _POSITION_BITS | position, _NOT_A_CANDIDATE)  # (b, n) unique per row
    picked = sort_key.topk(slots, dim=1, largest=False).values  # (b, slots), ascending
    count = candidate.sum(dim=1).clamp_max(num_anchors)  # (b,)
    real = torch.arange(slots, device=keys.device)[None, :] < count[:, None]  # (b, slots)
    anchors = torch.where(real, picked & ((1 << _POSITION_BITS) - 1), context_len).sort(dim=1).values  # real first
    return torch.where(real, anchors, 0), count


__all__ = ["anchor_keys", "anchor_slots", "draw_anchors"]
