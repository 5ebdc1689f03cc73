"""The target's special token ids as `generate` uses them: the ids a row stops on, the id finished rows pad with.

Every caller (engine, demo, training data and CLI) normalises a config's `eos_token_id` (an int, a list or None)
here.
"""

from __future__ import annotations

from transformers import PreTrainedModel


def id_list(ids: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """A config's `eos_token_id` (an int, a list or None) as a list of ints."""
    return [] if ids is None else [int(i) for i in (ids if isinstance(ids, list | tuple) else [ids])]


def stop_token_ids_of(target: PreTrainedModel, stop_token_ids: list[int] | None) -> list[int]:
    """The given stop ids, or the eos ids of the target's generation config (what `generate` stops on)."""
    return id_list(target.generation_config.eos_token_id if stop_token_ids is None else list(stop_token_ids))


def pad_token_id_of(target: PreTrainedModel) -> int:
    """The id `generate` pads finished rows with: pad, else the first eos, else 0."""
    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else target.config.get_text_config().pad_token_id
    return int(pad) if pad is not None else (stop_token_ids_of(target, None) or [0])[0]
