"""`generate(assistant_model=drafter)` runs Transformers' DFlash path: a thin wrapper around `GenerationMixin.generate`.

Transformers (>= 5.23, the declared minimum) ships a DFlash candidate generator, selected by
`speculation_type="dflash"`. Without that flag, `generate(assistant_model=drafter)` would treat the drafter as a
classic autoregressive assistant and fail. The wrapper is installed once when `transformers_dflash` is imported:
when `assistant_model` is a DFlash drafter it checks the pair, adapts a z-lab remote-code drafter, sets
`speculation_type="dflash"` and calls the original `generate`. Every other call passes straight through, unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel

from .drafter_types import as_native_drafter, is_dflash_drafter
from .pair_check import check_pair


def _batch_size(args: tuple, kwargs: dict) -> int:
    inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs", kwargs.get("inputs_embeds")))
    return int(inputs.shape[0]) if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 else 1


def prepare_dflash_generate(target: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs with which `generate` runs Transformers' DFlash path for `assistant_model=<DFlash drafter>`."""
    kwargs = dict(kwargs)
    generation_config = kwargs.get("generation_config")
    requested = kwargs.get("speculation_type", getattr(generation_config, "speculation_type", None))
    if requested not in (None, "dflash"):
        raise ValueError(f"A DFlash drafter needs speculation_type='dflash', got {requested!r}.")
    kwargs["speculation_type"] = "dflash"
    if _batch_size(args, kwargs) > 1:
        raise ValueError(
            "Transformers' DFlash path decodes one sequence at a time (batch size 1). For batches use "
            "`transformers_dflash.dflash_generate(target, drafter, input_ids, attention_mask=...)`."
        )
    wants_hidden = kwargs.get("output_hidden_states", getattr(generation_config, "output_hidden_states", False))
    if wants_hidden:
        # transformers 5.23/5.24: the DFlash generator overrides `output_hidden_states` with a list of layer
        # indices and the returned `hidden_states` then mixes None entries, which crashes inside `generate`.
        raise ValueError(
            "output_hidden_states=True is not supported with DFlash generation in Transformers; run a separate "
            "target forward on the generated ids to get hidden states."
        )
    drafter = as_native_drafter(kwargs["assistant_model"])
    check_pair(target, drafter, same_device=False)
    kwargs["assistant_model"] = drafter
    return kwargs


def install_generate_hook() -> None:
    """Makes `generate(assistant_model=<DFlash drafter>)` take the DFlash path (idempotent)."""
    original = GenerationMixin.generate
    if getattr(original, "_dflash_hook", False):
        return

    @functools.wraps(original)
    def generate(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
        if is_dflash_drafter(kwargs.get("assistant_model")):
            kwargs = prepare_dflash_generate(self, args, kwargs)
        return original(self, *args, **kwargs)

    generate._dflash_hook = True  # type: ignore[attr-defined]
    GenerationMixin.generate = generate
