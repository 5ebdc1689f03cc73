"""`fast_generate`: the engine as a Transformers `custom_generate` callable.

`model.generate(**inputs, custom_generate=fast_generate, drafter=drafter, ...)` runs generate's own preparation
(generation config, logits processors, stopping criteria, attention mask) and then hands the decoding to the
engine. Transformers drops a kwarg named `assistant_model` on that path, hence `drafter=`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import (
    EosTokenCriteria,
    GenerationConfig,
    GenerationMixin,
    LogitsProcessorList,
    MaxLengthCriteria,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .engine import engine_for
from .token_rule import TokenRule


def _generate_streamer() -> BaseStreamer | None:
    """The `streamer` given to `generate()`.

    Transformers (5.23, 5.24) feeds the prompt to the streamer, then calls a callable `custom_generate` without it;
    it is read back from the calling `generate` frame (None when there is none).
    """
    code = inspect.unwrap(GenerationMixin.generate).__code__
    frame = inspect.currentframe()
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return None if frame is None else frame.f_locals.get("streamer")


def fast_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    drafter: nn.Module | None = None,
    block_size: int | None = None,
    verify_length: int | str | None = None,
    draft: str = "sample",
    tokenizer: PreTrainedTokenizerBase | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """`model.generate(**inputs, custom_generate=fast_generate, drafter=drafter, ...)`: this engine inside generate.

    Honours what `generate` prepared: max length and eos ids (its stopping criteria; other criteria are checked per
    row on each committed prefix), do_sample/temperature/top-k/top-p (other logits processors are applied per
    position), the attention mask and the streamer. Returns what `generate` returns (`return_dict_in_generate`
    gives a `GenerateDecoderOnlyOutput` with `sequences` only).

    Args:
        drafter: the DFlash drafter (required).
        block_size, verify_length, draft: as in [`dflash_generate`].
        tokenizer: the `tokenizer` given to `generate`; declared so that generate builds its `stop_strings`
            criteria with it (see `compat.install_tokenizer_passthrough`); they arrive in `stopping_criteria`.
    """
    if drafter is None:
        raise ValueError(
            "fast_generate needs the DFlash drafter: generate(..., custom_generate=fast_generate, drafter=d)."
        )
    unsupported = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
    wanted = [k for k in unsupported if getattr(generation_config, k, False)]
    if wanted or generation_config.num_beams > 1:
        raise ValueError(f"fast_generate returns sequences only; drop {wanted or ['num_beams > 1']}.")
    max_length, stop_ids, extra = None, [], []
    for criterion in stopping_criteria:
        if isinstance(criterion, MaxLengthCriteria):
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif isinstance(criterion, EosTokenCriteria):
            stop_ids += criterion.eos_token_id.tolist()
        else:
            extra.append(criterion)
    if max_length is None:
        raise ValueError("fast_generate needs a length limit: pass max_new_tokens (or max_length) to generate.")
    result = engine_for(model, drafter).generate(
        input_ids,
        model_kwargs.get("attention_mask"),
        max_length - input_ids.shape[1],
        TokenRule.from_generate(logits_processor, generation_config.do_sample, draft=draft),
        stop_ids,
        _generate_streamer(),
        block_size,
        verify_length,
        return_stats=False,
        stopping_criteria=extra,
        stream_prompt=False,
    )
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=result.sequences)
    return result.sequences
