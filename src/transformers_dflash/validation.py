"""Checks of an engine request, each failing with a ValueError that names the fix."""

from __future__ import annotations

import argparse
from numbers import Integral

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from .pair_check import check_pair


def parse_verify_length(text: str) -> int | str | None:
    """A command-line `--verify-length`: 'all' (None: whole blocks), 'auto', or a positive int."""
    if text in ("all", "auto"):
        return None if text == "all" else text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 'all', 'auto' or a positive int, got {text!r}")


def check_engine_pair(target: PreTrainedModel, drafter: nn.Module | None) -> None:
    """`check_pair`, plus what the engine's static caches and 4D masks need of both models (of the target alone for
    AR, `drafter=None`)."""
    models = [("target", target.config.get_text_config())]
    if drafter is not None:
        check_pair(target, drafter)
        models.append(("drafter", drafter.config))
    for name, config in models:
        if config._attn_implementation not in ("sdpa", "eager"):
            raise ValueError(
                f"The {name} uses attn_implementation={config._attn_implementation!r}; the engine builds 4D masks "
                "for its static cache, so load it with attn_implementation='sdpa' (or 'eager')."
            )
        if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            raise ValueError(
                f"The {name} has sliding-window layers, which the engine's masks do not model yet; use "
                "`target.generate(..., assistant_model=drafter)` for this pair."
            )


def check_request(
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    max_new_tokens: int,
    block_size: int,
    verify_length: int | str | None,
    streamer: BaseStreamer | None,
    drafts: bool = True,
) -> torch.Tensor:
    """Validates a request (`drafts=False`: AR, blocks of one token); returns the (b, P) 0/1 mask (all ones when none
    was given)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a (batch, length) tensor of token ids; for one prompt use ids[None].")
    if input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"The prompt is empty (input_ids of shape {tuple(input_ids.shape)}); give >= 1 token.")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must hold integer token ids, got dtype {input_ids.dtype}; pass the tokenizer's ids "
            "(torch.long), e.g. ids.long() if they were converted."
        )
    vocab = target.get_input_embeddings().num_embeddings
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:
        raise ValueError(
            f"input_ids hold token ids {low}..{high}, outside the target's vocabulary [0, {vocab}); they come from "
            "another tokenizer: encode the prompt with the target's own tokenizer."
        )
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    if mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}; pass the mask "
            "the tokenizer returned with these ids."
        )
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("A prompt of the batch is empty (its attention_mask is all 0); give each row >= 1 token.")
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError("The batch is right-padded; decoder-only batches must be left-padded: padding_side='left'.")
    if not isinstance(max_new_tokens, Integral) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise ValueError(
            f"max_new_tokens must be >= 1, an int (the engine preallocates its caches for it), got {max_new_tokens!r}."
        )
    limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    longest = int(lengths.max())
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
            f"max_position_embeddings ({limit}); use max_new_tokens <= {max(limit - longest, 0)} or a shorter prompt."
        )
    if not drafts and verify_length is not None:
        raise ValueError(f"AR decoding verifies no drafts; drop verify_length (got {verify_length!r}).")
    if drafts and block_size < 2:
        raise ValueError(f"block_size must be >= 2 (the anchor plus >= 1 draft), got {block_size}.")
    if verify_length not in (None, "auto") and not (
        isinstance(verify_length, int) and 1 <= verify_length <= block_size - 1
    ):
        raise ValueError(
            f"verify_length must be None (whole block), 'auto', or an int in 1..{block_size - 1}, got {verify_length!r}."
        )
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(
            "Streaming supports batch size 1 (as Transformers' streamers do); stream one prompt at a time or "
            "drop the streamer."
        )
    return mask
