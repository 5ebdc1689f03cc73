"""Every difference between the supported Transformers versions (5.23 and 5.24) that this package bridges.

One helper per difference. Shipped with the drafter's remote code (`modeling_dflash` imports it), so it imports
only torch and transformers.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast


def cache_field(output_class: type = BaseModelOutputWithPast) -> str:
    """The name of a model output's cache field: `cache` from Transformers 5.24 on, `past_key_values` in 5.23."""
    return "cache" if "cache" in output_class.__dataclass_fields__ else "past_key_values"


def cache_kwarg(forward: Callable[..., Any]) -> str:
    """The name under which `forward` (a model's) takes its cache: `cache` from Transformers 5.24 on (5.24
    deprecates the old name across the library), `past_key_values` in 5.23. Our drafter accepts both."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def model_output(last_hidden_state: Any, cache: Any) -> BaseModelOutputWithPast:
    """`BaseModelOutputWithPast` carrying `cache` under this Transformers version's field name."""
    return BaseModelOutputWithPast(last_hidden_state=last_hidden_state, **{cache_field(): cache})


def install_tokenizer_passthrough() -> None:
    """Lets a callable `custom_generate` that declares `tokenizer` receive it, so `stop_strings` work (idempotent).

    Transformers (5.23, 5.24) pops `tokenizer` from generate's kwargs and then, for a callable `custom_generate`,
    replaces the generation-mode kwargs with the callable's own extra parameters, read from kwargs that no longer
    hold it: the tokenizer is lost and `stop_strings` fail with "could not locate a tokenizer". This puts it back
    for callables that declare it (`fast_generate` does); versions without the method are left alone.
    """
    original = getattr(GenerationMixin, "_extract_generation_mode_kwargs", None)
    if original is None or getattr(original, "_dflash_tokenizer_passthrough", False):
        return

    @functools.wraps(original)
    def extract(self: GenerationMixin, custom_generate: Any, kwargs: dict, *args: Any, **rest: Any) -> dict:
        declared = inspect.signature(custom_generate).parameters if callable(custom_generate) else {}
        kept = {k: kwargs[k] for k in ("tokenizer", "assistant_tokenizer") if k in declared and k in kwargs}
        return {**kept, **original(self, custom_generate, kwargs, *args, **rest)}

    extract._dflash_tokenizer_passthrough = True  # type: ignore[attr-defined]
    GenerationMixin._extract_generation_mode_kwargs = extract
