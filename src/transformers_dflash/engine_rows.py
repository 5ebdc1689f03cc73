"""The engine's per-row decoding state (`_Rows`, on the device) and its cut at Transformers stopping criteria.

Each step ends with one host sync of every row as a `HostRow`, `[done, count, *tokens]`: whether the row is done,
how many tokens it committed this step, then the step's candidate tokens (the first `count` are committed).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from transformers import StoppingCriteria

HostRow = list[int]  # [done, count, *tokens], one row of the step's host sync


@dataclass
class _Rows:
    """Per-row decoding state, all on the device: the anchor is the last committed token, not yet in the target."""

    anchor: torch.Tensor  # (b,) token id
    anchor_pos: torch.Tensor  # (b,) its absolute position
    generated: torch.Tensor  # (b,) committed new tokens, the anchor included
    done: torch.Tensor  # (b,) bool
    tokens: torch.Tensor  # (b, max_new + B) committed new tokens, by index
    context: torch.Tensor  # (b, n, F * H) target features not yet in the drafter cache
    context_pos: torch.Tensor  # (b, n) their positions
    context_slots: torch.Tensor  # (b, n) where the drafter keeps them (the sink for tokens not committed)

    def select(self, index: torch.Tensor) -> _Rows:
        """The state of rows `index` only."""
        return _Rows(*(getattr(self, f.name)[index] for f in fields(self)))


def cut_at_criteria(
    criteria: list[StoppingCriteria],
    input_ids: torch.Tensor,
    generated: list[int],
    host: list[HostRow],
    rows: _Rows,
) -> None:
    """Cuts each row's fresh tokens at the first prefix that one of `criteria` (Transformers stopping criteria,
    called per row on the prompt and the new tokens) stops, and marks the row done.

    `input_ids` (b, P) are the rows' prompts, `generated[r]` how many new tokens row r had before this step, `host`
    the step's sync; the cut is written to both `host` and the device state `rows` (`done`, `generated`).
    """
    for r, entry in enumerate(host):
        for j in range(1, entry[1] + 1):
            sequence = torch.cat([input_ids[r], rows.tokens[r, : generated[r] + j]])[None]  # (1, P + n)
            if any(bool(criterion(sequence, None)[0]) for criterion in criteria):
                entry[0], entry[1] = 1, j
                rows.done[r], rows.generated[r] = True, generated[r] + j
                break
