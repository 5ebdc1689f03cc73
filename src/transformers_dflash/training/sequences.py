"""Training sequences: prompt + regenerated response as token ids, and the seeded per-epoch order of batches.

The order is a pure function of (seed, epoch, step, rank), so the data position of a run is just its step count:
a resumed run reads exactly the batches an uninterrupted one would, on any number of processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainingSequence:
    """One training sequence.

    Attributes:
        id: the response row's id (the key of the feature cache).
        input_ids: (n,) prompt tokens then response tokens.
        response_start: index of the first response token (anchors are drawn at or after it).
    """

    id: str
    input_ids: torch.LongTensor
    response_start: int

    @property
    def response_ids(self) -> torch.LongTensor:
        """(n - response_start,) the response part."""
        return self.input_ids[self.response_start :]


def sequences_from_responses(
    rows: Iterable[dict], block_size: int, max_seq_len: int | None = None
) -> list[TrainingSequence]:
    """Sequences from regeneration rows (`{"id", "prompt_ids", "response_ids", ...}`, see `training.data`).

    Sequences are cut to `max_seq_len` tokens (prompt first, so the end of long responses goes); those left with a
    response shorter than one block can hold no anchor and are dropped.
    """
    sequences = []
    for row in rows:
        ids = (list(row["prompt_ids"]) + list(row["response_ids"]))[:max_seq_len]
        start = len(row["prompt_ids"])
        if len(ids) - max(start, 1) >= block_size:
            sequences.append(TrainingSequence(str(row["id"]), torch.tensor(ids, dtype=torch.long), start))
    return sequences


def response_vocabulary(sequences: Iterable[TrainingSequence], extra_ids: Iterable[int] = ()) -> torch.LongTensor:
    """Sorted ids of every token that occurs in a response (plus `extra_ids`, e.g. eos): the restricted loss head."""
    seen = torch.cat([s.response_ids for s in sequences] + [torch.tensor(list(extra_ids), dtype=torch.long)])
    return torch.unique(seen)


@dataclass(frozen=True)
class EpochPlan:
    """Which sequences each process reads at each optimizer step.

    Every epoch is a seeded permutation of the sequences; a step takes `batch_size * grad_accum` sequences per
    process, and the tail that does not fill a step on every process is skipped (it comes back in other epochs).
    """

    num_sequences: int
    batch_size: int
    grad_accum: int
    world_size: int
    seed: int

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

    def micro_batches(self, step: int, rank: int) -> tuple[int, list[list[int]]]:
        """(epoch, `grad_accum` lists of `batch_size` sequence indices) that process `rank` reads at global `step`."""
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        order = self.order(epoch).tolist()
        start = in_epoch * self.per_step + rank * self.batch_size * self.grad_accum
        mine = order[start : start + self.batch_size * self.grad_accum]
        return epoch, [mine[i : i + self.batch_size] for i in range(0, len(mine), self.batch_size)]
