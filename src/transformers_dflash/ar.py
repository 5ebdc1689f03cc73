"""Plain autoregressive decoding on the engine's machinery: the best AR baseline this project has.

`ar_generate` runs `DFlashEngine` without a drafter: every step verifies a block of one token (the anchor), so the
target decodes one token per step through the same loop, `SlotCache`, stop handling, streaming, batching and (with
`compile=True`) the same compiled verify step as DFlash (a CUDA graph on CUDA). Greedy output equals
`target.generate`; sampling follows the target's warped distribution. Benchmarks compare DFlash with this, not only
with `generate` (dflash-bench method `ar-engine`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from .engine import DFlashEngine, DFlashOutput
from .token_rule import TokenRule

__all__ = ["ar_engine_for", "ar_generate"]

_AR_ENGINE_ATTR = "_dflash_ar_engine"


def ar_engine_for(target: PreTrainedModel, compile: bool | dict[str, Any] = False) -> DFlashEngine:
    """The drafter-less engine of `target`, kept on it (one per `compile` setting) so that its cache and compiled
    steps serve the next call."""
    engines = target.__dict__.setdefault(_AR_ENGINE_ATTR, {})
    key = repr(compile)
    if key not in engines:
        engines[key] = DFlashEngine(target, None, compile=compile)
    return engines[key]


def ar_generate(
    target: PreTrainedModel,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_token_ids: list[int] | None = None,
    streamer: BaseStreamer | None = None,
    return_stats: bool = True,
    compile: bool | dict[str, Any] = False,
    generator: torch.Generator | None = None,
) -> DFlashOutput:
    """Autoregressive decoding of `input_ids` (b, P) with the engine's static cache (and compiled step).

    Arguments as in [`dflash_generate`], without a drafter. Returns [`DFlashOutput`]; its stats count one token per
    step (tau 1).
    """
    rule = TokenRule(temperature, top_k, top_p, generator=generator)
    return ar_engine_for(target, compile).generate(
        input_ids, attention_mask, max_new_tokens, rule, stop_token_ids, streamer, return_stats=return_stats
    )
