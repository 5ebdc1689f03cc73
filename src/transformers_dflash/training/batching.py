"""Batches: the seeded per-epoch order (length-bucketed), the host side of a batch, and prefetching it.

The order is a pure function of (seed, epoch, step, rank), so the data position of a run is just its step count:
a resumed run reads exactly the batches an uninterrupted one would, on any number of processes. Batches are cut
from length-sorted windows of the epoch's permutation, so the sequences of a batch have similar lengths and
little of the padded (b, n) target and drafter work is padding.

A `HostBatch` is what a step needs from the host: right-padded token ids and per-row lengths, starts and anchor
keys (pinned when the step runs on a GPU), and cached target features when there is a cache. Everything else
(anchors, labels, positions, the mask) is built on the device inside the step (`anchors`, `blocks`).
`Prefetcher` makes the next host batches in a background thread while the device computes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

import torch

from .anchors import anchor_keys, anchor_slots
from .features import TargetFeatures
from .sequences import TrainingSequence


@dataclass(frozen=True)
class EpochPlan:
    """Which sequences each process reads at each optimizer step.

    Every epoch is a seeded permutation of the sequences. With `lengths`, the permutation is cut into windows of
    `bucket_window` micro-batches, each window is sorted by length (ties keep the permutation's order) and cut into
    micro-batches, and the micro-batches are shuffled again (so long and short steps interleave). Without
    `lengths`, micro-batches are consecutive slices of the permutation. A step takes `grad_accum` micro-batches of
    `batch_size` sequences per process; the tail that does not fill a step on every process is skipped (it comes
    back in other epochs).
    """

    num_sequences: int
    batch_size: int
    grad_accum: int
    world_size: int
    seed: int
    lengths: tuple[int, ...] | None = None
    bucket_window: int = 64

    @property
    def per_step(self) -> int:
        """Sequences consumed by one optimizer step on all processes together."""
        return self.batch_size * self.grad_accum * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch."""
        return self.num_sequences // self.per_step

    def order(self, epoch: int) -> torch.LongTensor:
        """(num_sequences,) the permutation of `epoch`."""
        return torch.randperm(self.num_sequences, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Every micro-batch of `epoch`, in the order steps read them (process-major within a step)."""
        order = self.order(epoch)
        if self.lengths is not None:
            lengths = torch.tensor(self.lengths)[order]
            window = self.batch_size * max(self.bucket_window, 1)
            parts = [  # stable sort: equal lengths keep the permutation's (random) order
                order[i : i + window][lengths[i : i + window].sort(stable=True).indices]
                for i in range(0, len(order), window)
            ]
            order = torch.cat(parts)
        full = len(order) // self.batch_size * self.batch_size
        batches = order[:full].view(-1, self.batch_size)
        if self.lengths is not None:
            shuffle = torch.Generator().manual_seed(self.seed * 100_003 + epoch + 7_919)
            batches = batches[torch.randperm(batches.shape[0], generator=shuffle)]
        return batches.tolist()

    def micro_batches(self, step: int, rank: int) -> tuple[int, list[list[int]]]:
        """(epoch, `grad_accum` lists of `batch_size` sequence indices) that process `rank` reads at global `step`."""
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        first = (in_epoch * self.world_size + rank) * self.grad_accum
        return epoch, self.epoch_batches(epoch)[first : first + self.grad_accum]


@dataclass
class HostBatch:
    """The host side of one micro-batch (see the module docstring).

    Attributes:
        indices: (b,) sequence indices (into the trainer's sequences).
        ids: the sequences' ids (the feature cache's keys).
        input_ids: (b, n) token ids, right-padded with 0.
        lengths: (b,) real tokens per row.
        response_starts: (b,) first response position per row.
        keys: (b,) each row's anchor stream in this epoch (`anchors.anchor_keys`).
        slots: anchor columns of the batch (`anchors.anchor_slots`).
        features: cached target features (b, n, ...) read on the host, or None (computed online in the step).
    """

    indices: torch.LongTensor
    ids: list[str]
    input_ids: torch.LongTensor
    lengths: torch.LongTensor
    response_starts: torch.LongTensor
    keys: torch.LongTensor
    slots: int
    features: TargetFeatures | None = None

    @property
    def tokens(self) -> int:
        """Real (unpadded) target tokens in the batch."""
        return int(self.lengths.sum())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> HostBatch:
        """A copy with `fn` applied to every tensor (the cached features' included)."""
        apply = lambda t: fn(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        features = self.features
        if features is not None:
            features = TargetFeatures(**{f.name: apply(getattr(features, f.name)) for f in fields(TargetFeatures)})
        values = {f.name: apply(getattr(self, f.name)) for f in fields(self) if f.name != "features"}
        return HostBatch(**values, features=features)

    def to(self, device: torch.device) -> HostBatch:
        """A copy with every tensor on `device` (asynchronous from pinned memory)."""
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> HostBatch:
        """A copy in pinned host memory, for asynchronous copies to a GPU."""
        return self._map(torch.Tensor.pin_memory)


def collate(
    sequences: list[TrainingSequence],
    indices: list[int],
    seed: int,
    epoch: int,
    block_size: int,
    num_anchors: int,
    features: Callable[[list[tuple[str, torch.LongTensor]]], TargetFeatures] | None = None,
) -> HostBatch:
    """The `HostBatch` of sequences `indices` in `epoch` (with `features(...)` read on the host when given)."""
    chosen = [sequences[i] for i in indices]
    lengths = torch.tensor([len(s.input_ids) for s in chosen])
    starts = torch.tensor([s.response_start for s in chosen])
    input_ids = torch.nn.utils.rnn.pad_sequence([s.input_ids for s in chosen], batch_first=True)  # (b, n)
    index = torch.tensor(indices)
    return HostBatch(
        indices=index,
        ids=[s.id for s in chosen],
        input_ids=input_ids,
        lengths=lengths,
        response_starts=starts,
        keys=anchor_keys(seed, epoch, index),
        slots=anchor_slots(lengths, starts, block_size, num_anchors),
        features=None if features is None else features([(s.id, s.input_ids) for s in chosen]),
    )


class Prefetcher:
    """Iterates `make(step)` for steps `start .. stop - 1`, computed `depth` steps ahead in a background thread.

    An exception in `make` is raised by the iterator at the step that hit it; `close()` stops the thread early.
    """

    def __init__(self, make: Callable[[int], object], start: int, stop: int, depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._steps = range(start, stop)
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True, name="dflash-prefetch")
        self._thread.start()

    def _run(self, make: Callable[[int], object]) -> None:
        for step in self._steps:
            try:
                item = (make(step), None)
            except Exception as error:  # handed to the consumer, which raises it
                item = (None, error)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or item[1] is not None:
                return

    def __iter__(self) -> Iterator[object]:
        for _ in self._steps:
            value, error = self._queue.get()
            if error is not None:
                raise error
            yield value

    def close(self) -> None:
        """Stops the background thread (pending items are dropped)."""
        self._stop.set()
        self._thread.join()


__all__ = ["EpochPlan", "HostBatch", "Prefetcher", "collate"]
