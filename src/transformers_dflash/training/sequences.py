"""Training sequences: prompt + regenerated response as token ids (their order per epoch: `batching`)."""

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
